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
// can take Placement away from that client alone (Cut: every connection
// reset at once, as a Placement that stopped) or hold its requests (Hold:
// accepted, not answered until Release) while everyone else reaches
// Placement. The proxy keeps its port for its whole life: a port given up
// while cut could be taken by any other socket on the machine.
type Proxy struct {
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	held  chan struct{} // closed on Release; nil while not held
	conns map[net.Conn]bool
}

// StartProxy forwards a free 127.0.0.1 port to s until the test ends.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: "127.0.0.1:" + strconv.Itoa(s.port), ln: ln, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// URL is the endpoint the client is given.
func (p *Proxy) URL() string {
	return "http://127.0.0.1:" + strconv.Itoa(p.ln.Addr().(*net.TCPAddr).Port)
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut, held := p.cut, p.held
		if !cut {
			p.conns[c] = true
		}
		p.mu.Unlock()
		if cut {
			reset(c)
			continue
		}
		go p.forward(c, held)
	}
}

// reset closes c with a TCP reset, as a port nobody listens on answers.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
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
		reset(c)
		return
	}
	defer b.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
}

// Cut resets the client's connections from now on, and the open ones, as
// a Placement that stopped.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		reset(c)
	}
}

// Restore lets the client's connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
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
	p.ln.Close()
	p.Cut()
}
