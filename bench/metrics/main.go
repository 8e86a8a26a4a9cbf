// Command metrics benchmarks vgpud's exporter (make bench-metrics): on a
// simulated host of 8 H100s in MIG mode with 56 instances (7 x 1g.10gb
// each, every one running a workload), it measures the /metrics scrape
// latency p50/p99, the same with every NVML call slowed down 100x (the
// scrape must not slow down: it serves the last collection; the goal is
// checked on the pooled p99 ratio), the daemon's resident memory and its
// idle CPU at a 1 s collection interval (from /proc/PID/stat). It writes
// the figures as JSON (-out).
//
//	go run ./bench/metrics -out bench/metrics.json
//
// Imports: pkg/..., internal/testenv, internal/testenv/simhost, profiles.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vgpud/vgpud/internal/testenv"
	"github.com/vgpud/vgpud/internal/testenv/simhost"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/vgpud/vgpud/pkg/gpu"
	nvmlbackend "github.com/vgpud/vgpud/pkg/gpu/nvml"
	"github.com/vgpud/vgpud/pkg/gpu/sim"
	"github.com/vgpud/vgpud/pkg/gpu/sim/workload"
	"github.com/vgpud/vgpud/pkg/manager"
	"github.com/vgpud/vgpud/pkg/metrics"
	"github.com/vgpud/vgpud/pkg/profile"
	"github.com/vgpud/vgpud/pkg/share"
	"github.com/vgpud/vgpud/pkg/share/nvmldriver"
	"github.com/vgpud/vgpud/pkg/store"
	"github.com/vgpud/vgpud/pkg/tenant"
	"github.com/vgpud/vgpud/profiles"
)

// Goals from the issue.
const (
	goalP99        = 5 * time.Millisecond
	goalSlowdown   = 1.2
	goalRSSMiB     = 40
	goalIdleCPUPct = 1.0
)

func main() {
	out := flag.String("out", "bench/metrics.json", "where to write the figures")
	scrapes := flag.Int("scrapes", 10000, "scrapes per condition (NVML slowed, at its own speed), over the rounds")
	idle := flag.Duration("idle", 60*time.Second, "how long idle CPU is measured")
	serve := flag.Bool("serve", false, "seed the host, run vgpud and print its /metrics URL until interrupted (no measurement)")
	bin := flag.String("vgpud", "", "vgpud binary to run (default: build ./cmd/vgpud)")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the share loop and exporter alone to this file")
	flag.Parse()
	if err := run(*out, *scrapes, *idle, *serve, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "bench-metrics:", err)
		os.Exit(1)
	}
}

// Result is what the bench writes.
type Result struct {
	Date      string `json:"date"`
	GoVersion string `json:"goVersion"`
	CPUs      int    `json:"cpus"`
	Host      struct {
		GPUs      int    `json:"gpus"`
		Instances int    `json:"instances"`
		Layout    string `json:"layout"`
	} `json:"host"`
	CollectIntervalS float64 `json:"collectIntervalSeconds"`
	Exposition       struct {
		Bytes       int `json:"bytes"`
		GzipBytes   int `json:"gzipBytes"`
		Series      int `json:"series"`
		VgpudSeries int `json:"vgpudSeries"`
	} `json:"exposition"`
	Scrape struct {
		Baseline Latency `json:"baseline"`
		Slowed   Latency `json:"nvmlSlowed100x"`
		// SlowdownStatistic names the statistic the slowdown goal is
		// checked on.
		SlowdownStatistic string `json:"slowdownStatistic"`
		// RatioP99 is the p99 of every slowed scrape over the p99 of every
		// baseline scrape (all rounds pooled): the goal's statistic.
		// RatioP50 likewise, for the typical scrape.
		RatioP99 float64 `json:"ratioP99"`
		RatioP50 float64 `json:"ratioP50"`
		// RoundRatiosP99 are each round's slowed p99 over the p99 of the
		// scrapes right after it at full speed, sorted: how much a round's
		// p99 moves on this machine.
		RoundRatiosP99 []float64 `json:"roundRatiosP99"`
	} `json:"scrape"`
	NVML struct {
		BaselineMeanUs float64 `json:"baselineMeanCallMicroseconds"`
		SlowedMeanUs   float64 `json:"slowedMeanCallMicroseconds"`
		AddedLatency   string  `json:"addedLatency"`
		// ShareWindowS is the share loop's window while NVML was slow
		// (it stretches when the polls take longer than the poll period).
		ShareWindowS float64 `json:"shareWindowSecondsWhileSlow"`
	} `json:"nvml"`
	RSSMiB         float64 `json:"rssMiB"`
	PeakRSSMiB     float64 `json:"peakRssMiB"`
	IdleCPUPercent float64 `json:"idleCpuPercentOfOneCore"`
	IdleSeconds    float64 `json:"idleSeconds"`
	// ExporterIdleCPUPercent is the share loop and the exporter alone (in
	// this process, on the same simulated host, same intervals, after the
	// daemon stopped): what of the daemon's idle CPU is theirs.
	ExporterIdleCPUPercent float64 `json:"shareLoopAndExporterIdleCpuPercentOfOneCore"`
	Goals                  struct {
		P99Ms       float64 `json:"scrapeP99Ms"`
		SlowdownMax float64 `json:"slowdownRatioMax"`
		RSSMiB      float64 `json:"rssMiB"`
		IdleCPUPct  float64 `json:"idleCpuPercent"`
		P99Met      bool    `json:"scrapeP99Met"`
		SlowdownMet bool    `json:"slowdownMet"`
		RSSMet      bool    `json:"rssMet"`
		IdleCPUMet  bool    `json:"idleCpuMet"`
		AllMet      bool    `json:"allMet"`
	} `json:"goals"`
}

// Latency is a scrape latency distribution.
type Latency struct {
	N     int     `json:"n"`
	P50Ms float64 `json:"p50Ms"`
	P90Ms float64 `json:"p90Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

func hostSpec() *sim.Spec {
	s := &sim.Spec{Version: "v1"}
	for i, bus := range []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb} {
		s.GPUs = append(s.GPUs, sim.GPUSpec{Model: "H100-SXM5-80GB", PCI: fmt.Sprintf("0000:%02x:00.0", bus), Flavour: gpu.FlavourVFIO, MIG: true, NUMANode: i / 4})
	}
	return s
}

func specYAML(s *sim.Spec) string {
	var b strings.Builder
	b.WriteString("version: v1\ngpus:\n")
	for _, g := range s.GPUs {
		fmt.Fprintf(&b, "  - {model: %s, pci: %q, flavour: %s, mig: true, numaNode: %d}\n", g.Model, g.PCI, g.Flavour, g.NUMANode)
	}
	return b.String()
}

// seed carves the 56 instances through the manager, as vgpuctl would, and
// sets a workload on each; the daemon then starts on the same state.
func seed(ctx context.Context, state string, spec *sim.Spec, cat *profile.Catalog) (share.Inventory, error) {
	var inv share.Inventory
	host, err := simhost.Open(ctx, simhost.Options{Dir: state, Spec: spec, Catalog: cat,
		Manager: manager.Config{Logger: slog.New(slog.DiscardHandler)}, NoReconcile: true})
	if err != nil {
		return inv, err
	}
	defer host.Close()
	h, m := host.Sim, host.Manager
	if err := m.Refresh(ctx); err != nil {
		return inv, err
	}
	for i := 0; i < 7; i++ {
		class := tenant.BestEffort
		if i%2 == 0 {
			class = tenant.Guaranteed
		}
		inv.Tenants = append(inv.Tenants, share.Tenant{Name: fmt.Sprintf("tenant-%d", i), Guaranteed: class == tenant.Guaranteed})
		if _, err := m.DefineTenant(ctx, tenant.Tenant{Name: fmt.Sprintf("tenant-%d", i), Quota: tenant.UnlimitedQuota(), Class: class}); err != nil {
			return inv, err
		}
	}
	gpus, err := h.GPUs()
	if err != nil {
		return inv, err
	}
	for _, g := range gpus {
		inv.GPUs = append(inv.GPUs, share.GPU{UUID: g[1], PCI: g[0], Model: "H100-SXM5-80GB", MIG: true, Flavour: "vfio", State: "ok", MIGSlots: 8})
	}
	n := 0
	for _, g := range spec.GPUs {
		for s := 0; s < 7; s++ {
			r, err := m.Create(ctx, manager.CreateRequest{Tenant: fmt.Sprintf("tenant-%d", s), Profile: "1g.10gb", GPU: g.PCI})
			if err != nil {
				return inv, fmt.Errorf("create 1g.10gb on %s: %w", g.PCI, err)
			}
			inv.Instances = append(inv.Instances, share.Instance{UUID: r.UUID, Tenant: r.Tenant, Guaranteed: s%2 == 0, GPU: r.GPUUUID,
				Kind: share.MIG, Profile: r.Profile, GI: r.GIID, GIStart: r.GIStart, GISize: r.GISize, ComputeMilli: r.ComputeMilli,
				VRAMBytes: r.VRAMBytes, State: string(store.StateReady)})
			w := workload.Workload{Kind: workload.Steady, Demand: 0.02 + 0.02*float64(s)}
			if s == 6 {
				w = workload.Workload{Kind: workload.Bursty, Demand: 0.1, Seed: uint64(n)}
			}
			if err := h.SetWorkload(fmt.Sprintf("%s/gi%d", g.PCI, r.GIID), w); err != nil {
				return inv, err
			}
			n++
		}
	}
	return inv, m.Shutdown(ctx)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func get(c *http.Client, url string, gz bool) ([]byte, time.Duration, error) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if gz {
		// As Prometheus asks; the transport then does not decompress.
		req.Header.Set("Accept-Encoding", "gzip")
	}
	start := time.Now()
	r, err := c.Do(req)
	if err != nil {
		return nil, 0, err
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	took := time.Since(start)
	if r.StatusCode != http.StatusOK {
		return nil, took, fmt.Errorf("GET %s: %s", url, r.Status)
	}
	return body, took, err
}

// rounds is how many times the bench alternates between NVML at its own
// speed and slowed down.
const rounds = 5

func scrapeTimes(c *http.Client, url string, n int) ([]time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		_, d, err := get(c, url, true)
		if err != nil {
			return ds, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

func latencyOf(ds []time.Duration) Latency {
	ds = append([]time.Duration(nil), ds...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))]) / 1e6 }
	return Latency{N: len(ds), P50Ms: q(0.5), P90Ms: q(0.9), P99Ms: q(0.99), MaxMs: float64(ds[len(ds)-1]) / 1e6}
}

// sample reads the sum of a family's samples (optionally of series
// containing match) from an exposition.
func sample(text []byte, name, match string) float64 {
	sum := 0.0
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != '{' && l[len(name)] != ' ') {
			continue
		}
		if match != "" && !strings.Contains(l, match) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func nvmlMean(text []byte) (sum, count float64) {
	return sample(text, "vgpud_nvml_call_duration_seconds_sum", ""), sample(text, "vgpud_nvml_call_duration_seconds_count", "")
}

func procStatus(pid int, key string) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, key+":") {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[1], 64)
			return v / 1024 // kB -> MiB
		}
	}
	return 0
}

// cpuTicks is utime+stime of pid in clock ticks (100 per second on Linux).
func cpuTicks(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return u + k, nil
}

// cpuProfile is the -cpuprofile flag.
var cpuProfile string

// exporterAlone runs what startMetrics runs (share loop, collector) on
// the host in state and returns their CPU use, percent of one core.
func exporterAlone(ctx context.Context, state string, cat *profile.Catalog, inv share.Inventory, d time.Duration) (float64, error) {
	h, err := sim.Open(filepath.Join(state, "sim"), nil, cat, sim.OpenOptions{})
	if err != nil {
		return 0, err
	}
	defer h.Close()
	if err := h.SetCallLatency(0); err != nil {
		return 0, err
	}
	b := nvmlbackend.New(h.NVML(), cat, nvmlbackend.Options{})
	if err := b.Init(ctx); err != nil {
		return 0, err
	}
	src := share.SourceFunc(func(context.Context) (share.Inventory, error) { return inv, nil })
	loop, err := share.New(src, nvmldriver.New(b), share.Config{Mode: share.Adaptive})
	if err != nil {
		return 0, err
	}
	col, err := metrics.New(metrics.Config{Interval: time.Second, Source: src, Shares: loop, Process: true})
	if err != nil {
		return 0, err
	}
	b.SetObserver(func(op string, took time.Duration, _ gonvml.Return) { col.ObserveNVML(op, took, "") })
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go loop.Run(rctx)
	go col.Run(rctx)
	time.Sleep(5 * time.Second)
	cpu := func() float64 {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return 0, err
		}
		defer pprof.StopCPUProfile()
	}
	c0, w0 := cpu(), time.Now()
	time.Sleep(d)
	return (cpu() - c0) / time.Since(w0).Seconds() * 100, nil
}

func run(outPath string, scrapes int, idle time.Duration, serve bool, bin string) error {
	ctx := context.Background()
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "vgpud-bench-metrics-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	vgpud := bin
	if vgpud == "" {
		goBin, err := exec.LookPath("go")
		if err != nil {
			return fmt.Errorf("the go command builds vgpud (or pass -vgpud): %w", err)
		}
		build := exec.Command(goBin, "build", "-o", dir+"/", "./cmd/vgpud")
		build.Dir = root
		build.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build: %v\n%s", err, out)
		}
		vgpud = filepath.Join(dir, "vgpud")
	}
	cat, err := profile.Load(profiles.FS)
	if err != nil {
		return err
	}
	spec := hostSpec()
	state := filepath.Join(dir, "state")
	fmt.Fprintln(os.Stderr, "seeding 8 x H100 with 56 MIG instances")
	inv, err := seed(ctx, state, spec, cat)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	specPath := filepath.Join(dir, "host.yaml")
	if err := os.WriteFile(specPath, []byte(specYAML(spec)), 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	args := []string{"--sim", "--sim-host", specPath, "--state-dir", state, "--metrics-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--collect-interval", "1s", "--libvirt-socket", "", "--log-level", "warn"}
	env := []string{}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "DBUS_SYSTEM_BUS_ADDRESS=") {
			env = append(env, e)
		}
	}
	if _, err := os.Stat("/run/dbus/system_bus_socket"); err == nil {
		// Keep the daemon off this machine's system bus: a private session bus.
		bus := exec.Command("dbus-daemon", "--session", "--nofork", "--print-address=1")
		stdout, _ := bus.StdoutPipe()
		if err := bus.Start(); err != nil {
			return fmt.Errorf("a private bus is needed on a host with a system bus: %w", err)
		}
		defer bus.Process.Kill()
		addr, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			return err
		}
		args = append(args, "--bus-address", strings.TrimSpace(addr))
	}
	logf, err := os.Create(filepath.Join(dir, "vgpud.log"))
	if err != nil {
		return err
	}
	d := exec.Command(vgpud, args...)
	d.Stdout, d.Stderr, d.Env = logf, logf, env
	d.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		d.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			d.Process.Kill()
		}
	}()
	pid := d.Process.Pid
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
	deadline := time.Now().Add(90 * time.Second)
	var text []byte
	for {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("no metrics with 56 instances and share windows within 90s:\n%s", log)
		}
		body, _, err := get(c, url, false)
		if err == nil && sample(body, "vgpud_share_windows_total", "") >= 3 && strings.Count(string(body), "vgpud_instance_achieved_share_ratio{") == 56 {
			text = body
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if serve {
		fmt.Printf("%s (pid %d, state %s); interrupt to stop\n", url, pid, state)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		return nil
	}
	var res Result
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.GoVersion, res.CPUs = runtime.Version(), runtime.NumCPU()
	res.Host.GPUs, res.Host.Instances, res.Host.Layout = 8, 56, "8 x H100-SXM5-80GB, MIG on, 7 x 1g.10gb each, a workload on every instance"
	res.CollectIntervalS = 1
	res.Exposition.Bytes = len(text)
	for _, l := range strings.Split(string(text), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			res.Exposition.Series++
			if strings.HasPrefix(l, "vgpud_") {
				res.Exposition.VgpudSeries++
			}
		}
	}
	if gz, _, err := get(c, url, true); err == nil {
		res.Exposition.GzipBytes = len(gz)
	}

	// Idle: nobody scrapes; the daemon collects every second (and renders
	// nothing, as nobody asks) and its share loop reads the MIG GPUs once a
	// window.
	fmt.Fprintf(os.Stderr, "idle CPU over %v\n", idle)
	time.Sleep(5 * time.Second)
	t0, err := cpuTicks(pid)
	if err != nil {
		return err
	}
	w0 := time.Now()
	time.Sleep(idle)
	t1, _ := cpuTicks(pid)
	res.IdleSeconds = time.Since(w0).Seconds()
	res.IdleCPUPercent = (t1 - t0) / 100 / res.IdleSeconds * 100
	res.RSSMiB = procStatus(pid, "VmRSS")

	// The two conditions alternate in rounds, so that a change in this
	// machine's load between them does not pass for the daemon's.
	setLatency := func(d time.Duration) error {
		cmd := exec.Command(vgpud, "sim", "--sim", "--state-dir", state, "latency", d.String())
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("vgpud sim latency: %v\n%s", err, out)
		}
		time.Sleep(3 * time.Second)
		return nil
	}
	meanCall := func(phase func() error) (float64, error) {
		before, _, _ := get(c, url, false)
		if err := phase(); err != nil {
			return 0, err
		}
		after, _, _ := get(c, url, false)
		s0, n0 := nvmlMean(before)
		s1, n1 := nvmlMean(after)
		if n1 <= n0 {
			return 0, nil
		}
		return (s1 - s0) / (n1 - n0) * 1e6, nil
	}
	// The mean call time at the simulator's own speed.
	if res.NVML.BaselineMeanUs, err = meanCall(func() error { time.Sleep(5 * time.Second); return nil }); err != nil {
		return err
	}
	// Every NVML call 100x slower: the simulator adds 99x the mean call time.
	add := time.Duration(99 * res.NVML.BaselineMeanUs * float64(time.Microsecond)).Round(time.Microsecond)
	if add < 100*time.Microsecond {
		add = 100 * time.Microsecond
	}
	res.NVML.AddedLatency = add.String()
	var base, slow []time.Duration
	var ratios []float64
	for r := 0; r < rounds; r++ {
		fmt.Fprintf(os.Stderr, "round %d/%d: %d scrapes with NVML slowed by %v, then %d at its own speed\n", r+1, rounds, scrapes/rounds, add, scrapes/rounds)
		if err := setLatency(add); err != nil {
			return err
		}
		var ds []time.Duration
		us, err := meanCall(func() error {
			var err error
			ds, err = scrapeTimes(c, url, scrapes/rounds)
			time.Sleep(2 * time.Second)
			return err
		})
		if err != nil {
			return err
		}
		slow = append(slow, ds...)
		res.NVML.SlowedMeanUs += us / rounds
		after, _, _ := get(c, url, false)
		res.NVML.ShareWindowS = max(res.NVML.ShareWindowS, sample(after, "vgpud_share_window_seconds", ""))
		if err := setLatency(0); err != nil {
			return err
		}
		bs, err := scrapeTimes(c, url, scrapes/rounds)
		if err != nil {
			return err
		}
		base = append(base, bs...)
		ratios = append(ratios, latencyOf(ds).P99Ms/latencyOf(bs).P99Ms)
	}
	sort.Float64s(ratios)
	res.Scrape.RoundRatiosP99 = ratios
	res.Scrape.Baseline, res.Scrape.Slowed = latencyOf(base), latencyOf(slow)
	res.Scrape.SlowdownStatistic = "ratioP99: p99 of all slowed scrapes / p99 of all baseline scrapes, rounds pooled"
	res.PeakRSSMiB = procStatus(pid, "VmHWM")
	res.Scrape.RatioP99 = res.Scrape.Slowed.P99Ms / res.Scrape.Baseline.P99Ms
	res.Scrape.RatioP50 = res.Scrape.Slowed.P50Ms / res.Scrape.Baseline.P50Ms

	g := &res.Goals
	g.P99Ms, g.SlowdownMax, g.RSSMiB, g.IdleCPUPct = float64(goalP99)/1e6, goalSlowdown, goalRSSMiB, goalIdleCPUPct
	g.P99Met = res.Scrape.Baseline.P99Ms < g.P99Ms && res.Scrape.Slowed.P99Ms < g.P99Ms
	g.SlowdownMet = res.Scrape.RatioP99 <= goalSlowdown
	g.RSSMet = res.PeakRSSMiB < goalRSSMiB
	g.IdleCPUMet = res.IdleCPUPercent < goalIdleCPUPct

	// The share loop and the exporter alone, in this process.
	d.Process.Signal(syscall.SIGTERM)
	d.Wait()
	fmt.Fprintf(os.Stderr, "share loop and exporter alone, idle CPU over %v\n", idle)
	if res.ExporterIdleCPUPercent, err = exporterAlone(ctx, state, cat, inv, idle); err != nil {
		return fmt.Errorf("exporter alone: %w", err)
	}
	g.AllMet = g.P99Met && g.SlowdownMet && g.RSSMet && g.IdleCPUMet

	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if !filepath.IsAbs(outPath) {
		outPath = filepath.Join(root, outPath)
	}
	if err := os.WriteFile(outPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s\n", b)
	return nil
}
