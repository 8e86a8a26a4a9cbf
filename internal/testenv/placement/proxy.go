package placement

import (
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Proxy stands between one client (a vgpud) and Placement, so that a test
// can take Placement away from that client alone (Cut: connections
// refused, as a stopped Placement) or hold its requests (Hold: accepted,
// not answered until Release) while everyone else reaches Placement.
type Proxy struct {
	target string
	port   int

	mu    sync.Mutex
	ln    net.Listener
	held  chan struct{} // closed on Release; nil while not held
	conns map[net.Conn]bool
}

// StartProxy forwards a free 127.0.0.1 port to s until the test ends.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: "127.0.0.1:" + strconv.Itoa(s.port), port: port, conns: map[net.Conn]bool{}}
	if err := p.listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

// URL is the endpoint the client is given.
func (p *Proxy) URL() string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }

func (p *Proxy) listen() error {
	var ln net.Listener
	var err error
	// The port was ours a moment ago; a connection in TIME_WAIT does not
	// keep it (Go listens with SO_REUSEADDR), but retry briefly all the same.
	for range 50 {
		if ln, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.port)); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go p.serve(ln)
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		held := p.held
		p.conns[c] = true
		p.mu.Unlock()
		go p.forward(c, held)
	}
}

func (p *Proxy) forward(c net.Conn, held chan struct{}) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	if held != nil {
		<-held
	}
	b, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer b.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
}

// Cut refuses the client's connections from now on and ends the open
// ones, as a Placement that stopped.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// Restore accepts the client's connections again.
func (p *Proxy) Restore(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	up := p.ln != nil
	p.mu.Unlock()
	if !up {
		if err := p.listen(); err != nil {
			t.Fatalf("proxy: listen again on %d: %v", p.port, err)
		}
	}
}

// Hold keeps the connections accepted from now on waiting, unanswered,
// until Release.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
}

// Release lets the held connections through.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

func (p *Proxy) close() {
	p.Release()
	p.Cut()
}
