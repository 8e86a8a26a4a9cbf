// Package config is the daemon's configuration: /etc/vgpud/vgpud.yaml
// (format v1, read strictly: an unknown key is an error), the command-line
// flags that override it, the defaults, and the validation that names the
// key at fault. It also says which settings a reload (SIGHUP) applies to
// the running daemon (Reloadable, Changed) and keeps the holder that
// running parts read them from.
//
// It only reads and checks: opening what the settings name (the state, the
// host, libvirt, the metrics endpoint, Placement) is cmd/vgpud's wiring.
// Only cmd/vgpud (and tests) import it.
//
// Imports: pkg/metricsweb, pkg/placementapi, pkg/profile, pkg/virt.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/vgpud/vgpud/pkg/metricsweb"
	"github.com/vgpud/vgpud/pkg/virt"
)

// DefaultPath is read when --config is not given; absent is fine.
const DefaultPath = "/etc/vgpud/vgpud.yaml"

// Config is the daemon's whole configuration: /etc/vgpud/vgpud.yaml, with
// command-line flags overriding the file.
type Config struct {
	// Version of the file format: "v1".
	Version string `json:"version,omitempty"`
	// StateDir holds state.db (and the simulated host under sim/).
	StateDir string `json:"stateDir,omitempty"`
	// Sim runs on the simulated host instead of the real driver.
	Sim bool `json:"sim,omitempty"`
	// SimHost is a simulated host description file; "" is the built-in host.
	SimHost string `json:"simHost,omitempty"`
	// SimMirror also writes the simulated sysfs tree to disk (STATE/sim/sys).
	SimMirror bool `json:"simMirror,omitempty"`
	// SysfsRoot is where sysfs is mounted (tests point it elsewhere).
	SysfsRoot string `json:"sysfsRoot,omitempty"`
	// MdevctlDir is mdevctl's config directory, read to tell the mdevs
	// mdevctl defines (with --sim: the simulated host's, STATE/sim/mdevctl.d).
	MdevctlDir string `json:"mdevctlDir,omitempty"`
	// ProfilesDir overrides and extends the built-in catalog.
	ProfilesDir string `json:"profilesDir,omitempty"`
	// LibvirtURI and LibvirtSocket select the libvirt daemon. The socket
	// is "auto" (found as libvirt's clients find it: virtqemud's socket,
	// else libvirtd's or virtproxyd's; see pkg/virt socket.go), a path, or
	// "" to run without libvirt.
	LibvirtURI    string `json:"libvirtURI,omitempty"`
	LibvirtSocket string `json:"libvirtSocket,omitempty"`
	// MetricsListen is the Prometheus endpoint's address: host:port, or
	// unix:PATH for a Unix socket ("" disables it).
	MetricsListen string `json:"metricsListen,omitempty"`
	// MetricsWebConfigFile is an exporter-toolkit web configuration file
	// (TLS, basic auth; pkg/metricsweb) for the endpoint; "" serves plain
	// HTTP to whoever can connect. Applied on SIGHUP.
	MetricsWebConfigFile string `json:"metricsWebConfigFile,omitempty"`
	// MetricsSocketMode and MetricsSocketGroup are a unix: endpoint's
	// permission bits (default "0660") and group (default: the daemon's).
	MetricsSocketMode  SocketMode `json:"metricsSocketMode,omitzero"`
	MetricsSocketGroup string     `json:"metricsSocketGroup,omitempty"`
	// BusAddress overrides the system bus address (tests use a private bus).
	BusAddress string `json:"busAddress,omitempty"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel,omitempty"`
	// DriverWait bounds how long start-up waits for the NVIDIA driver.
	DriverWait Duration `json:"driverWait,omitempty"`
	// CollectInterval is the metrics collection period.
	CollectInterval Duration `json:"collectInterval,omitempty"`
	// UndefinePolicy is what happens to a VM's instances when it is
	// undefined: release (destroy them) or keep.
	UndefinePolicy string `json:"undefinePolicy,omitempty"`
	// GPUReset says whether vgpud may reset a GPU to carry a MIG mode
	// change through (allow) or leaves the change pending with the manual
	// procedure (never).
	GPUReset string `json:"gpuReset,omitempty"`
	// GroupAccess is what group vgpud may do over D-Bus: manage (read
	// and change) or read (changes then need polkit's dev.vgpud1.manage).
	GroupAccess string `json:"groupAccess,omitempty"`
	// CriticalXIDs are the XIDs that mark a GPU failed: its instances are
	// reported, new carving on it is refused until it is reset or comes
	// back. Other XIDs are counted and logged only.
	CriticalXIDs []uint `json:"criticalXIDs,omitempty"`
	// UeventSettle is how long a burst of uevents must be quiet before
	// vgpud re-reads the host; a storm is re-read at least every ten
	// settle periods, never once per event.
	UeventSettle Duration `json:"ueventSettle,omitempty"`
	// RecoverProbe is how often a failed or lost GPU is re-read to see
	// whether it came back.
	RecoverProbe Duration `json:"recoverProbe,omitempty"`
	// DiscoveryInterval is how often the whole host is re-read and the
	// records compared with it without an event (drift: devices gone or
	// made behind vgpud's back).
	DiscoveryInterval Duration `json:"discoveryInterval,omitempty"`
	// ApplyMaxChanges bounds the changes one declarative apply document
	// may make; a larger one is refused before its first change.
	ApplyMaxChanges int `json:"applyMaxChanges,omitempty"`
	// GPUConcurrency is how many GPUs the start-up reconcile and a
	// declarative apply work on at once: the driver runs the calls of
	// different GPUs side by side, so recovery takes about as long as the
	// slowest GPU.
	GPUConcurrency int `json:"gpuConcurrency,omitempty"`
	// Fleet publishes the host's GPUs to OpenStack Placement (pkg/fleet,
	// docs/fleet.md); applied on SIGHUP.
	Fleet *FleetConfig `json:"fleet,omitempty"`

	file  string
	flags *flagValues
	// reloadable holds the settings running parts read on every use; Load
	// keeps the holder and a reload swaps what it holds (see Reloadable).
	reloadable *atomic.Pointer[Reloadable]
}

// Reloadable are the settings a SIGHUP applies to the running daemon; the
// rest take effect at the next start.
type Reloadable struct {
	CriticalXIDs map[uint64]bool
	UeventSettle time.Duration
	RecoverProbe time.Duration
	// DiscoveryInterval paces the periodic discovery (pkg/health).
	DiscoveryInterval time.Duration
	// LogLevel is the level a reload set (the logger holds it; it is kept
	// here so the next reload compares with what is in force).
	LogLevel string
}

// Reloadable returns the reloadable settings in force now.
func (c *Config) Reloadable() *Reloadable {
	if c.reloadable == nil || c.reloadable.Load() == nil {
		return c.reloadableValues()
	}
	return c.reloadable.Load()
}

func (c *Config) reloadableValues() *Reloadable {
	l := &Reloadable{CriticalXIDs: map[uint64]bool{}, UeventSettle: c.UeventSettle.Duration, RecoverProbe: c.RecoverProbe.Duration,
		DiscoveryInterval: c.DiscoveryInterval.Duration, LogLevel: c.LogLevel}
	for _, x := range c.CriticalXIDs {
		l.CriticalXIDs[uint64(x)] = true
	}
	return l
}

// ApplyReloadable makes next's reloadable settings the ones in force.
func (c *Config) ApplyReloadable(next *Config) {
	if c.reloadable == nil {
		c.reloadable = new(atomic.Pointer[Reloadable])
	}
	c.reloadable.Store(next.reloadableValues())
}

// defaultCriticalXIDs: errors after which a GPU needs a reset (NVIDIA's
// XID catalogue): 48 double-bit ECC, 62 internal micro-controller halt,
// 64 row-remapping failure, 79 fallen off the bus, 94/95 contained and
// uncontained ECC errors, 119/120 GSP timeout and error. Application
// faults (13, 31, 43, 45) are not: the guest's program failed, not the GPU.
var defaultCriticalXIDs = []uint{48, 62, 64, 79, 94, 95, 119, 120}

// StateDirEnv names the default state directory in place of
// /var/lib/vgpud, so `vgpud sim` verbs and `vgpud inventory` find a
// daemon's state without --state-dir each time (a configuration file's
// stateDir and the flag still win).
const StateDirEnv = "VGPUD_STATE_DIR"

// Default is the configuration with nothing set: what an empty file and
// no flags give.
func Default() *Config {
	stateDir := "/var/lib/vgpud"
	if d := os.Getenv(StateDirEnv); d != "" {
		stateDir = d
	}
	return &Config{
		StateDir:          stateDir,
		SysfsRoot:         "/sys",
		MdevctlDir:        "/etc/mdevctl.d",
		ProfilesDir:       "/etc/vgpud/profiles.d",
		LibvirtURI:        "qemu:///system",
		LibvirtSocket:     virt.AutoSocket,
		MetricsListen:     "127.0.0.1:9835",
		LogLevel:          "info",
		DriverWait:        Duration{2 * time.Minute},
		CollectInterval:   Duration{time.Second},
		UndefinePolicy:    "release",
		GPUReset:          "allow",
		GroupAccess:       "manage",
		CriticalXIDs:      slices.Clone(defaultCriticalXIDs),
		UeventSettle:      Duration{500 * time.Millisecond},
		RecoverProbe:      Duration{5 * time.Second},
		DiscoveryInterval: Duration{time.Minute},
		ApplyMaxChanges:   DefaultApplyMaxChanges,
		GPUConcurrency:    DefaultGPUConcurrency,
	}
}

// flagValues holds the flags' raw values until Load decides which win.
type flagValues struct {
	cfg  Config
	file string
	// given names the flags the command line set, as the load at start
	// found them; a reload applies the same ones, so a flag wins over the
	// file at every reload as it did at start.
	given []string
}

// BindFlags defines the daemon's flags on fs, each defaulting to c's
// value; Load applies those the command line set.
func (c *Config) BindFlags(fs *pflag.FlagSet) {
	v := &flagValues{cfg: *c}
	c.flags = v
	fs.StringVar(&v.file, "config", "", "configuration file (default "+DefaultPath+" when present)")
	fs.StringVar(&v.cfg.StateDir, "state-dir", c.StateDir, "state directory (state.db; the simulated host under sim/); $"+StateDirEnv+" sets its default")
	fs.BoolVar(&v.cfg.Sim, "sim", false, "run on the simulated GPU host instead of the NVIDIA driver")
	fs.StringVar(&v.cfg.SimHost, "sim-host", "", "simulated host description (YAML); default: the built-in host")
	fs.BoolVar(&v.cfg.SimMirror, "sim-mirror", false, "also write the simulated sysfs tree to STATE/sim/sys for inspection")
	fs.StringVar(&v.cfg.SysfsRoot, "sysfs-root", c.SysfsRoot, "sysfs mount point")
	fs.StringVar(&v.cfg.MdevctlDir, "mdevctl-dir", c.MdevctlDir, "mdevctl's config directory (read only)")
	fs.StringVar(&v.cfg.ProfilesDir, "profiles-dir", c.ProfilesDir, "directory of catalog files overriding the built-in ones")
	fs.StringVar(&v.cfg.LibvirtURI, "libvirt-uri", c.LibvirtURI, "libvirt connection URI")
	fs.StringVar(&v.cfg.LibvirtSocket, "libvirt-socket", c.LibvirtSocket, `libvirt daemon socket: "auto" (virtqemud's, else libvirtd's or virtproxyd's, under /run/libvirt), a path, or "" for none`)
	fs.StringVar(&v.cfg.MetricsListen, "metrics-listen", c.MetricsListen, "address of the Prometheus /metrics endpoint: host:port, or unix:PATH for a Unix socket (empty: off)")
	fs.StringVar(&v.cfg.MetricsWebConfigFile, "metrics-web-config-file", "", "exporter-toolkit web configuration file (TLS, basic auth) for the /metrics endpoint")
	fs.Var(&v.cfg.MetricsSocketMode, "metrics-socket-mode", "permission bits of a unix: metrics endpoint, in octal")
	fs.StringVar(&v.cfg.MetricsSocketGroup, "metrics-socket-group", "", "group of a unix: metrics endpoint (default: the daemon's)")
	fs.StringVar(&v.cfg.BusAddress, "bus-address", "", "D-Bus bus address (default: the system bus, or $DBUS_SYSTEM_BUS_ADDRESS)")
	fs.StringVar(&v.cfg.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.DurationVar(&v.cfg.DriverWait.Duration, "driver-wait", c.DriverWait.Duration, "how long start-up waits for the NVIDIA driver")
	fs.DurationVar(&v.cfg.CollectInterval.Duration, "collect-interval", c.CollectInterval.Duration, "metrics collection interval")
	fs.StringVar(&v.cfg.UndefinePolicy, "undefine-policy", c.UndefinePolicy, "when a VM is undefined: release or keep its instances")
	fs.StringVar(&v.cfg.GPUReset, "gpu-reset", c.GPUReset, "whether vgpud may reset a GPU to commit a MIG mode change: allow or never")
	fs.UintSliceVar(&v.cfg.CriticalXIDs, "critical-xids", c.CriticalXIDs, "XIDs that mark a GPU failed until it is reset")
	fs.DurationVar(&v.cfg.UeventSettle.Duration, "uevent-settle", c.UeventSettle.Duration, "quiet time after a burst of uevents before the host is re-read")
	fs.DurationVar(&v.cfg.RecoverProbe.Duration, "recover-probe", c.RecoverProbe.Duration, "how often a failed or lost GPU is re-read")
	fs.DurationVar(&v.cfg.DiscoveryInterval.Duration, "discovery-interval", c.DiscoveryInterval.Duration, "how often the host is re-read and compared with the records without an event")
}

// Load reads the configuration file, then applies the flags the user set:
// those fs saw parsed, or with fs nil (SIGHUP) those the load at start saw.
// The names are kept rather than a flag set: the set BindFlags was given
// is not always the one parsed (cobra parses a command's merged set, and
// visiting its persistent set then finds nothing set). A file that reads
// but does not validate is an *InvalidError.
func (c *Config) Load(fs *pflag.FlagSet) error {
	v := c.flags
	if fs != nil {
		v.given = nil
		fs.Visit(func(f *pflag.Flag) { v.given = append(v.given, f.Name) })
	}
	file, explicit := v.file, v.file != ""
	if !explicit {
		file = DefaultPath
	}
	next := Default()
	data, err := os.ReadFile(file)
	switch {
	case err == nil:
		if err := yaml.UnmarshalStrict(data, next); err != nil {
			return fmt.Errorf("configuration %s: %s", file, strings.TrimPrefix(err.Error(), "error unmarshaling JSON: while decoding JSON: "))
		}
		next.file = file
	case errors.Is(err, os.ErrNotExist) && !explicit:
	default:
		return fmt.Errorf("configuration: %w", err)
	}
	for _, name := range v.given {
		switch name {
		case "state-dir":
			next.StateDir = v.cfg.StateDir
		case "sim":
			next.Sim = v.cfg.Sim
		case "sim-host":
			next.SimHost = v.cfg.SimHost
		case "sim-mirror":
			next.SimMirror = v.cfg.SimMirror
		case "sysfs-root":
			next.SysfsRoot = v.cfg.SysfsRoot
		case "mdevctl-dir":
			next.MdevctlDir = v.cfg.MdevctlDir
		case "profiles-dir":
			next.ProfilesDir = v.cfg.ProfilesDir
		case "libvirt-uri":
			next.LibvirtURI = v.cfg.LibvirtURI
		case "libvirt-socket":
			next.LibvirtSocket = v.cfg.LibvirtSocket
		case "metrics-listen":
			next.MetricsListen = v.cfg.MetricsListen
		case "metrics-web-config-file":
			next.MetricsWebConfigFile = v.cfg.MetricsWebConfigFile
		case "metrics-socket-mode":
			next.MetricsSocketMode = v.cfg.MetricsSocketMode
		case "metrics-socket-group":
			next.MetricsSocketGroup = v.cfg.MetricsSocketGroup
		case "bus-address":
			next.BusAddress = v.cfg.BusAddress
		case "log-level":
			next.LogLevel = v.cfg.LogLevel
		case "driver-wait":
			next.DriverWait = v.cfg.DriverWait
		case "collect-interval":
			next.CollectInterval = v.cfg.CollectInterval
		case "undefine-policy":
			next.UndefinePolicy = v.cfg.UndefinePolicy
		case "gpu-reset":
			next.GPUReset = v.cfg.GPUReset
		case "critical-xids":
			next.CriticalXIDs = slices.Clone(v.cfg.CriticalXIDs)
		case "uevent-settle":
			next.UeventSettle = v.cfg.UeventSettle
		case "recover-probe":
			next.RecoverProbe = v.cfg.RecoverProbe
		case "discovery-interval":
			next.DiscoveryInterval = v.cfg.DiscoveryInterval
		}
	}
	if err := next.validate(); err != nil {
		where := "flags"
		if next.file != "" {
			where = next.file + " (or flags)"
		}
		return &InvalidError{fmt.Errorf("configuration %s: %w", where, err)}
	}
	next.flags = v
	holder := c.reloadable
	*c = *next
	// The holder outlives a load: parts that kept it see what a later
	// reload applies.
	c.reloadable = holder
	c.ApplyReloadable(next)
	return nil
}

func (c *Config) validate() error {
	if c.Version != "" && c.Version != "v1" {
		return fmt.Errorf("version: %q is not supported; this build reads v1", c.Version)
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		if abs, err := filepath.Abs(c.StateDir); err == nil && c.StateDir != "" {
			c.StateDir = abs
		} else {
			return fmt.Errorf("stateDir: %q must be a directory path", c.StateDir)
		}
	}
	if err := c.Fleet.validate(); err != nil {
		return err
	}
	if c.SimHost != "" && !c.Sim {
		return errors.New("simHost: only with sim (pass --sim)")
	}
	for _, p := range []struct{ key, val string }{
		{"sysfsRoot", c.SysfsRoot}, {"profilesDir", c.ProfilesDir}, {"libvirtSocket", c.LibvirtSocket}, {"simHost", c.SimHost},
		{"mdevctlDir", c.MdevctlDir},
	} {
		if p.val != "" && !filepath.IsAbs(p.val) && (p.key != "libvirtSocket" || p.val != virt.AutoSocket) {
			if p.key == "libvirtSocket" {
				return fmt.Errorf("libvirtSocket: %q must be %q, an absolute path, or empty (no libvirt)", p.val, virt.AutoSocket)
			}
			return fmt.Errorf("%s: %q must be an absolute path", p.key, p.val)
		}
	}
	if c.SysfsRoot == "" {
		return errors.New("sysfsRoot: must be set (/sys on a host)")
	}
	if c.LibvirtURI != "" {
		if u, err := url.Parse(c.LibvirtURI); err != nil || u.Scheme == "" {
			return fmt.Errorf("libvirtURI: %q is not a libvirt URI (like qemu:///system)", c.LibvirtURI)
		}
	}
	if c.BusAddress != "" && !strings.Contains(c.BusAddress, ":") {
		return fmt.Errorf("busAddress: %q is not a D-Bus address (like unix:path=/run/dbus/system_bus_socket)", c.BusAddress)
	}
	if err := c.validateMetricsAccess(); err != nil {
		return err
	}
	if _, err := c.Level(); err != nil {
		return err
	}
	if c.DriverWait.Duration < 0 || c.DriverWait.Duration > time.Hour {
		return fmt.Errorf("driverWait: %v must be 0..1h", c.DriverWait.Duration)
	}
	if c.CollectInterval.Duration < 100*time.Millisecond || c.CollectInterval.Duration > time.Hour {
		return fmt.Errorf("collectInterval: %v must be 100ms..1h", c.CollectInterval.Duration)
	}
	if c.GPUReset != "allow" && c.GPUReset != "never" {
		return fmt.Errorf("gpuReset: %q must be allow or never", c.GPUReset)
	}
	if c.UndefinePolicy != "release" && c.UndefinePolicy != "keep" {
		return fmt.Errorf("undefinePolicy: %q must be release or keep", c.UndefinePolicy)
	}
	if c.GroupAccess != "manage" && c.GroupAccess != "read" {
		return fmt.Errorf("groupAccess: %q must be manage or read", c.GroupAccess)
	}
	for _, x := range c.CriticalXIDs {
		// The driver numbers XIDs from 1; 999 is its "unknown XID".
		if x == 0 || x > 999 {
			return fmt.Errorf("criticalXIDs: %d is not an XID (1..999)", x)
		}
	}
	if c.UeventSettle.Duration < 10*time.Millisecond || c.UeventSettle.Duration > time.Minute {
		return fmt.Errorf("ueventSettle: %v must be 10ms..1m", c.UeventSettle.Duration)
	}
	if c.RecoverProbe.Duration < 100*time.Millisecond || c.RecoverProbe.Duration > 10*time.Minute {
		return fmt.Errorf("recoverProbe: %v must be 100ms..10m", c.RecoverProbe.Duration)
	}
	if c.DiscoveryInterval.Duration < time.Second || c.DiscoveryInterval.Duration > time.Hour {
		return fmt.Errorf("discoveryInterval: %v must be 1s..1h", c.DiscoveryInterval.Duration)
	}
	if c.ApplyMaxChanges < 1 || c.ApplyMaxChanges > maxApplyChanges {
		return fmt.Errorf("applyMaxChanges: %d must be 1..%d", c.ApplyMaxChanges, maxApplyChanges)
	}
	if c.GPUConcurrency < 1 || c.GPUConcurrency > maxGPUConcurrency {
		return fmt.Errorf("gpuConcurrency: %d must be 1..%d", c.GPUConcurrency, maxGPUConcurrency)
	}
	return nil
}

// validateMetricsAccess checks the metrics endpoint's address and access
// settings; the web configuration file's contents are read when the
// endpoint starts and at each reload (metricsweb.Load).
func (c *Config) validateMetricsAccess() error {
	path, isUnix := strings.CutPrefix(c.MetricsListen, metricsweb.UnixPrefix)
	switch {
	case c.MetricsListen == "":
	case isUnix:
		if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.HasSuffix(path, "/") {
			return fmt.Errorf("metricsListen: %q: a Unix socket is unix: and an absolute path, like unix:/run/vgpud/metrics.sock", c.MetricsListen)
		}
		// sun_path holds 108 bytes with the terminating NUL; the socket
		// is made under a name 5 bytes longer first.
		if len(path)+len(".new")+1 > 107 {
			return fmt.Errorf("metricsListen: %q: a Unix socket path must be at most 102 bytes", c.MetricsListen)
		}
	default:
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return fmt.Errorf("metricsListen: %q: %w (host:port, or unix:PATH)", c.MetricsListen, err)
		}
	}
	if !isUnix && (c.MetricsSocketMode != SocketMode{} || c.MetricsSocketGroup != "") {
		return fmt.Errorf("metricsSocketMode, metricsSocketGroup: only with a unix: metricsListen (it is %q)", c.MetricsListen)
	}
	if c.MetricsWebConfigFile != "" && !filepath.IsAbs(c.MetricsWebConfigFile) {
		return fmt.Errorf("metricsWebConfigFile: %q must be an absolute path", c.MetricsWebConfigFile)
	}
	return nil
}

// DefaultGPUConcurrency is gpuConcurrency's default: the manager's
// (manager.DefaultRecoveryConcurrency; a test keeps them equal, so this
// package need not import the manager).
const DefaultGPUConcurrency = 16

// DefaultApplyMaxChanges is applyMaxChanges' default: pkg/apply's
// (apply.DefaultMaxChanges; a test keeps them equal).
const DefaultApplyMaxChanges = 1024

// maxGPUConcurrency caps gpuConcurrency at the most GPUs a host has.
const maxGPUConcurrency = 64

// maxApplyChanges caps applyMaxChanges: every change is one manager
// operation, and a document beyond this is better split.
const maxApplyChanges = 65536

// Level is LogLevel as a slog level.
func (c *Config) Level() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return l, fmt.Errorf("logLevel: %q must be debug, info, warn or error", c.LogLevel)
	}
	return l, nil
}

// SimDir is where the simulated host lives.
func (c *Config) SimDir() string { return filepath.Join(c.StateDir, "sim") }

// File is the configuration file the last Load read ("": none).
func (c *Config) File() string { return c.file }

// Reload loads the configuration again with the flags the load at start
// saw, as a SIGHUP does; c is not changed.
func (c *Config) Reload() (*Config, error) {
	next := Default()
	next.flags = c.flags
	return next, next.Load(nil)
}

// InvalidError is a configuration that was read but does not validate;
// the message names the key at fault.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }

func (e *InvalidError) Unwrap() error { return e.Err }
