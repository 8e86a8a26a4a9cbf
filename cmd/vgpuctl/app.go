package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vgpud/vgpud/pkg/dbusapi"
	"github.com/vgpud/vgpud/pkg/version"
)

// api is what the commands need of vgpud; *dbusapi.Client is the real
// one, tests give a fake.
type api interface {
	Close() error
	Version(ctx context.Context) (string, error)
	Status(ctx context.Context) (dbusapi.Status, error)
	Objects(ctx context.Context) (dbusapi.Objects, error)
	GPU(ctx context.Context, id string) (dbusapi.GPU, error)
	Instances(ctx context.Context, tenant string) ([]dbusapi.Instance, error)
	Instance(ctx context.Context, id string) (dbusapi.Instance, error)
	Tenants(ctx context.Context) ([]dbusapi.Tenant, error)
	Tenant(ctx context.Context, name string) (dbusapi.Tenant, error)
	Profiles(ctx context.Context, gpu string) ([]dbusapi.Profile, error)
	Capacity(ctx context.Context) ([]dbusapi.Capacity, error)
	Plan(ctx context.Context, r dbusapi.PlanRequest) (dbusapi.Plan, error)
	Create(ctx context.Context, r dbusapi.CreateRequest) (dbusapi.Instance, error)
	DestroyBehind(ctx context.Context, id string, detach bool) (string, error)
	Attach(ctx context.Context, id, vm string, o dbusapi.AttachOptions) (dbusapi.Instance, error)
	CreateAndAttach(ctx context.Context, r dbusapi.CreateRequest, vm string, o dbusapi.AttachOptions) (dbusapi.Instance, error)
	Detach(ctx context.Context, id string) error
	MigrationSource(ctx context.Context, id string) (string, error)
	PrepareIncoming(ctx context.Context, metadata, vm, tenant string) (dbusapi.Incoming, error)
	CommitIncoming(ctx context.Context, id string) (dbusapi.Attachment, error)
	AbortIncoming(ctx context.Context, id string) error
	CompleteOutgoing(ctx context.Context, id string) error
	CancelOutgoing(ctx context.Context, id string) error
	OutgoingDomainXML(ctx context.Context, id, device string) (string, string, error)
	DefineIncomingDomain(ctx context.Context, id, xml string) error
	UndefineOutgoingDomain(ctx context.Context, id string) error
	UndefineIncomingDomain(ctx context.Context, id string) error
	MigrationTarget(ctx context.Context) (dbusapi.HostVersions, error)
	PrecheckOutgoingLive(ctx context.Context, id string, dst dbusapi.HostVersions) error
	MigrateOutgoingLive(ctx context.Context, id, device, destURI, migrateURI string, dst dbusapi.HostVersions, keepSource bool) error
	HostdevXML(ctx context.Context, id string) (string, error)
	DefineTenant(ctx context.Context, t dbusapi.TenantSpec) (dbusapi.Tenant, error)
	SetQuota(ctx context.Context, name string, q dbusapi.Quota) (dbusapi.Tenant, error)
	UndefineTenant(ctx context.Context, name string, force bool) error
	Apply(ctx context.Context, name string, data []byte, sel string, dryRun bool) (dbusapi.ApplyResult, error)
	Reconcile(ctx context.Context) (dbusapi.ReconcileReport, error)
	Defragment(ctx context.Context, r dbusapi.PlanRequest, apply bool) (dbusapi.DefragResult, error)
	SetMIGMode(ctx context.Context, gpu string, on bool) error
	SetHeterogeneous(ctx context.Context, gpu string, on bool) error
	ClearGPU(ctx context.Context, gpu string) error
	SetGPUScheduler(ctx context.Context, gpu, mode, policy string, timeslice time.Duration) (dbusapi.GPUScheduler, error)
	SetGPUInstanceScheduler(ctx context.Context, gpu string, gi int, mode, policy string, timeslice time.Duration) (dbusapi.GPUScheduler, error)
	Shares(ctx context.Context) ([]dbusapi.ShareRow, error)
	FleetStatus(ctx context.Context) (dbusapi.FleetStatus, error)
	Events(ctx context.Context) (<-chan dbusapi.Event, error)
}

type dialer func(ctx context.Context, address string) (api, error)

func dialBus(ctx context.Context, address string) (api, error) {
	c, err := dbusapi.Dial(ctx, address)
	if err != nil {
		return nil, err
	}
	return c, nil
}

type streams struct {
	in       io.Reader
	out, err io.Writer
}

// app is one vgpuctl invocation: its global flags and its connection.
type app struct {
	streams
	dial    dialer
	connect string
	output  string
	timeout time.Duration
	client  api
	// isTTY says whether out is a terminal (top redraws in place).
	isTTY bool
}

// Exit codes (docs/vgpuctl.md). Scripts tell failures apart by them.
const (
	exitOK          = 0
	exitFailure     = 1 // BackendFailure and anything not listed below
	exitUsage       = 2 // bad flags or arguments; the daemon's InvalidArgument
	exitDenied      = 3 // AccessDenied
	exitNotFound    = 4 // NotFound
	exitNoCapacity  = 5 // NoCapacity
	exitQuota       = 6 // QuotaExceeded
	exitBusy        = 7 // Busy: retry later
	exitConflict    = 8 // Conflict
	exitGPULost     = 9 // GPULost
	exitUnavailable = 10
	exitTimeout     = 11
	exitStale       = 12 // StaleClaim: the fleet scheduler's allocation is stale; reschedule
	exitInterrupted = 130
)

var exitCodes = map[string]int{
	dbusapi.NameInvalidArgument: exitUsage,
	dbusapi.NameAccessDenied:    exitDenied,
	dbusapi.NameNotFound:        exitNotFound,
	dbusapi.NameNoCapacity:      exitNoCapacity,
	dbusapi.NameQuotaExceeded:   exitQuota,
	dbusapi.NameBusy:            exitBusy,
	dbusapi.NameConflict:        exitConflict,
	dbusapi.NameGPULost:         exitGPULost,
	dbusapi.NameUnavailable:     exitUnavailable,
	dbusapi.NameTimeout:         exitTimeout,
	dbusapi.NameBackendFailure:  exitFailure,
	dbusapi.NameStaleClaim:      exitStale,
}

// usageError is a mistake on the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// run executes one command line and returns the exit code.
func run(ctx context.Context, args []string, s streams, dial dialer) int {
	a := &app{streams: s, dial: dial}
	if f, ok := s.out.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			a.isTTY = true
		}
	}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
	err := root.ExecuteContext(ctx)
	if a.client != nil {
		a.client.Close()
	}
	if err == nil {
		return exitOK
	}
	return a.report(ctx, err)
}

// report prints an error as its name and message (the message says what
// to do next) and returns its exit code.
func (a *app) report(ctx context.Context, err error) int {
	var ue usageError
	var de *dbusapi.Error
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(a.err, "vgpuctl: %s\nRun 'vgpuctl --help' for usage.\n", ue.msg)
		return exitUsage
	case errors.As(err, &de):
		if ctx.Err() != nil && de.Name == dbusapi.NameTimeout && errors.Is(ctx.Err(), context.Canceled) {
			fmt.Fprintf(a.err, "vgpuctl: interrupted: %s\n", de.Message)
			return exitInterrupted
		}
		// err, not de.Message: the steps a command wraps around the
		// daemon's answer (migrate run's "the VM moved, but ... run
		// `vgpuctl migrate complete`") say what to do next.
		fmt.Fprintf(a.err, "vgpuctl: %s: %s\n", de.Name, err.Error())
		if code, ok := exitCodes[de.Name]; ok {
			return code
		}
		return exitFailure
	}
	// Cobra's own argument and flag errors.
	msg := err.Error()
	if isCobraUsage(msg) {
		fmt.Fprintf(a.err, "vgpuctl: %s\nRun 'vgpuctl --help' for usage.\n", msg)
		return exitUsage
	}
	fmt.Fprintf(a.err, "vgpuctl: %s: %s\n", dbusapi.NameBackendFailure, msg)
	return exitFailure
}

func isCobraUsage(msg string) bool {
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires at least", "requires at most",
		"invalid argument", "flag needs an argument", "required flag", "if any flags in the group", "none of the others can be",
		"at least one of the flags"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

// api connects on first use: commands that fail on their arguments never
// touch the bus.
func (a *app) api(ctx context.Context) (api, error) {
	if a.client != nil {
		return a.client, nil
	}
	addr := a.connect
	if addr == "" {
		// Read here, not as the flag's default: help would show the
		// variable's value as a second default beside the documented order.
		addr = os.Getenv("VGPUCTL_CONNECT")
	}
	c, err := a.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	a.client = c
	return c, nil
}

// ctx bounds one command by --timeout.
func (a *app) ctx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	if a.timeout <= 0 {
		return context.WithCancel(cmd.Context())
	}
	return context.WithTimeout(cmd.Context(), a.timeout)
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "vgpuctl",
		Short: "Manage vgpud: GPUs carved into MIG instances and vGPUs for libvirt VMs",
		Long: `vgpuctl talks to vgpud over D-Bus (dev.vgpud1 on the system bus).

Reading needs root or membership in group vgpud; changes need root, group
vgpud, or the polkit action dev.vgpud1.manage.

Exit codes: 0 ok, 1 failure, 2 usage or invalid argument, 3 access denied,
4 not found, 5 no capacity, 6 quota exceeded, 7 busy (retry later),
8 conflict, 9 GPU lost, 10 vgpud unreachable, 11 timeout, 130 interrupted.`,
		// --version prints the client's part of `vgpuctl version`
		// without asking vgpud.
		Version:           version.Version,
		SilenceUsage:      true,
		SilenceErrors:     true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "table", "json", "yaml":
				return nil
			}
			return usagef("-o %q: want table, json or yaml", a.output)
		},
	}
	root.SetVersionTemplate("vgpuctl {{.Version}}\n")
	root.Flags().BoolP("version", "v", false, "print vgpuctl's version and exit (vgpuctl version asks vgpud's too)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err.Error()} })
	pf := root.PersistentFlags()
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	pf.StringVarP(&a.connect, "connect", "c", "", "D-Bus address of vgpud's bus, e.g. unix:path=/run/dbus/system_bus_socket (default: $VGPUCTL_CONNECT, $DBUS_SYSTEM_BUS_ADDRESS, the system bus)")
	pf.DurationVar(&a.timeout, "timeout", 2*time.Minute, "give up (and have vgpud cancel and undo the operation) after this long")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))

	root.AddGroup(&cobra.Group{ID: "read", Title: "Inspecting:"}, &cobra.Group{ID: "write", Title: "Changing:"}, &cobra.Group{ID: "other", Title: "Other:"})
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("read", a.gpusCmd(), a.gpuCmd(), a.profilesCmd(), a.capacityCmd(), a.listCmd(), a.showCmd(), a.dumpxmlCmd(), a.planCmd(), a.eventsCmd(), a.topCmd(), a.fleetCmd())
	add("write", a.createCmd(), a.destroyCmd(), a.attachCmd(), a.detachCmd(), a.tenantCmd(), a.applyCmd(), a.reconcileCmd(), a.defragCmd(), a.migrateCmd())
	add("other", a.versionCmd(), a.completionCmd())
	root.AddCommand(a.genDocsCmd())
	root.SetHelpCommandGroupID("other")
	return root
}

// withAPI is a command's RunE with the --timeout context and a connected
// client, the start every vgpud-talking command shares.
func (a *app) withAPI(fn func(ctx context.Context, c api, cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx, cancel := a.ctx(cmd)
		defer cancel()
		c, err := a.api(ctx)
		if err != nil {
			return err
		}
		return fn(ctx, c, cmd, args)
	}
}
