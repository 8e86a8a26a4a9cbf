package dbusapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/google/uuid"
)

// Client talks to vgpud over D-Bus. Its methods are safe for concurrent
// use. A call's context bounds it: the remaining time is sent as the
// operation's timeout, and a cancelled context cancels the operation in
// the daemon (which undoes what it did).
type Client struct {
	conn *dbus.Conn
	mgr  dbus.BusObject
}

// Dial connects to the bus at address ("" is the system bus, honouring
// $DBUS_SYSTEM_BUS_ADDRESS). A bare path is taken as a unix socket.
func Dial(ctx context.Context, address string) (*Client, error) {
	if strings.HasPrefix(address, "/") {
		address = "unix:path=" + address
	}
	type result struct {
		conn *dbus.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// Not dbus.WithContext: that would close the connection when ctx
		// ends; ctx only bounds connecting.
		var r result
		if address == "" {
			r.conn, r.err = dbus.ConnectSystemBus()
		} else {
			r.conn, r.err = dbus.Connect(address)
		}
		done <- r
	}()
	where := "the system bus"
	if address != "" {
		where = address
	}
	select {
	case r := <-done:
		if r.err != nil {
			return nil, &Error{Name: NameUnavailable, Message: fmt.Sprintf("cannot connect to D-Bus at %s (%v); is dbus running? Pick another bus with --connect", where, r.err)}
		}
		return &Client{conn: r.conn, mgr: r.conn.Object(BusName, ManagerPath)}, nil
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, &Error{Name: NameTimeout, Message: fmt.Sprintf("connecting to D-Bus at %s took too long", where)}
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection, for callers that need raw D-Bus.
func (c *Client) Conn() *dbus.Conn { return c.conn }

// callOpts adds the context's deadline and an operation id to options.
func callOpts(ctx context.Context, o map[string]dbus.Variant) (map[string]dbus.Variant, string) {
	if o == nil {
		o = map[string]dbus.Variant{}
	}
	if dl, ok := ctx.Deadline(); ok {
		if ms := time.Until(dl).Milliseconds(); ms > 0 {
			o[OptTimeout] = dbus.MakeVariant(uint64(ms))
		}
	}
	id := uuid.NewString()
	o[OptOperationID] = dbus.MakeVariant(id)
	return o, id
}

// call calls a Manager method that reads.
func (c *Client) call(ctx context.Context, what, method string, args []any, out ...any) error {
	return c.callOn(ctx, c.mgr, 0, what, ManagerInterface+"."+method, args, out...)
}

// callOn calls method ("interface.member") on obj. The message is built
// here because godbus's Object.Call drops every flag but NoAutoStart and
// NoReplyExpected, and changes need FlagAllowInteractiveAuthorization.
func (c *Client) callOn(ctx context.Context, obj dbus.BusObject, flags dbus.Flags, what, method string, args []any, out ...any) error {
	if ctx.Value(noAutoStart{}) != nil {
		flags |= dbus.FlagNoAutoStart
	}
	i := strings.LastIndexByte(method, '.')
	msg := &dbus.Message{Type: dbus.TypeMethodCall, Flags: flags, Body: args, Headers: map[dbus.HeaderField]dbus.Variant{
		dbus.FieldPath:        dbus.MakeVariant(obj.Path()),
		dbus.FieldDestination: dbus.MakeVariant(obj.Destination()),
		dbus.FieldInterface:   dbus.MakeVariant(method[:i]),
		dbus.FieldMember:      dbus.MakeVariant(method[i+1:]),
	}}
	if len(args) > 0 {
		msg.Headers[dbus.FieldSignature] = dbus.MakeVariant(dbus.SignatureOf(args...))
	}
	call := <-c.conn.SendWithContext(ctx, msg, make(chan *dbus.Call, 1)).Done
	if call.Err != nil {
		return fromDBus(ctx, what, call.Err)
	}
	if err := call.Store(out...); err != nil {
		return &Error{Name: NameBackendFailure, Message: fmt.Sprintf("%s: unexpected reply (%v); update vgpuctl and vgpud together", what, err)}
	}
	return nil
}

// long calls a Manager method that changes state, whose last argument is
// its options; when ctx is cancelled before the reply, the daemon is asked
// to cancel. The call allows interactive authorization: a caller polkit
// authorizes (auth_admin_keep) may be asked for a password.
func (c *Client) long(ctx context.Context, what, method string, args []any, o map[string]dbus.Variant, out ...any) error {
	o, id := callOpts(ctx, o)
	err := c.callOn(ctx, c.mgr, dbus.FlagAllowInteractiveAuthorization, what, ManagerInterface+"."+method, append(args, o), out...)
	if err != nil && ctx.Err() == context.Canceled {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.mgr.CallWithContext(cctx, ManagerInterface+".Cancel", 0, id).Err
	}
	return err
}

// Status reads the manager object's properties.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var props map[string]dbus.Variant
	if err := c.callOn(ctx, c.mgr, 0, "status", propertiesInterface+".GetAll", []any{ManagerInterface}, &props); err != nil {
		return Status{}, err
	}
	return Status{
		Version: str(props, "Version"), DriverVersion: str(props, "DriverVersion"), Degraded: str(props, "Degraded"),
		GPUs: len(paths(props, "GPUs")), Instances: len(paths(props, "Instances")), Tenants: len(paths(props, "Tenants")),
	}, nil
}

// Version is the daemon's version; anyone may read it.
func (c *Client) Version(ctx context.Context) (string, error) {
	var v dbus.Variant
	if err := c.callOn(ctx, c.mgr, 0, "version", propertiesInterface+".Get", []any{ManagerInterface, "Version"}, &v); err != nil {
		return "", err
	}
	s, _ := v.Value().(string)
	return s, nil
}

// Objects is every object vgpud exports, as one GetManagedObjects gives them.
type Objects struct {
	GPUs      []GPU
	Instances []Instance
	Tenants   []Tenant
}

// Objects reads every GPU, instance and tenant in one call.
func (c *Client) Objects(ctx context.Context) (Objects, error) {
	var objs map[dbus.ObjectPath]map[string]map[string]dbus.Variant
	if err := c.callOn(ctx, c.mgr, 0, "list objects", objectManagerInterface+".GetManagedObjects", nil, &objs); err != nil {
		return Objects{}, err
	}
	var out Objects
	for _, ifaces := range objs {
		if p, ok := ifaces[GPUInterface]; ok {
			out.GPUs = append(out.GPUs, gpuFrom(p))
		}
		if p, ok := ifaces[InstanceInterface]; ok {
			out.Instances = append(out.Instances, instanceFrom(p))
		}
		if p, ok := ifaces[TenantInterface]; ok {
			out.Tenants = append(out.Tenants, tenantFrom(p))
		}
	}
	sort.Slice(out.GPUs, func(i, j int) bool { return out.GPUs[i].PCI < out.GPUs[j].PCI })
	sort.Slice(out.Instances, func(i, j int) bool {
		a, b := out.Instances[i], out.Instances[j]
		if a.Tenant != b.Tenant {
			return a.Tenant < b.Tenant
		}
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.UUID < b.UUID
	})
	sort.Slice(out.Tenants, func(i, j int) bool { return out.Tenants[i].Name < out.Tenants[j].Name })
	return out, nil
}

// GPUs lists the host's GPUs.
func (c *Client) GPUs(ctx context.Context) ([]GPU, error) {
	o, err := c.Objects(ctx)
	return o.GPUs, err
}

// Instances lists instances, of one tenant when tenant is not "".
func (c *Client) Instances(ctx context.Context, tenant string) ([]Instance, error) {
	o, err := c.Objects(ctx)
	if err != nil {
		return nil, err
	}
	if tenant == "" {
		return o.Instances, nil
	}
	found := false
	for _, t := range o.Tenants {
		found = found || t.Name == tenant
	}
	if !found {
		return nil, &Error{Name: NameNotFound, Message: fmt.Sprintf("no tenant %s (run `vgpuctl tenant list`)", tenant)}
	}
	var out []Instance
	for _, in := range o.Instances {
		if in.Tenant == tenant {
			out = append(out, in)
		}
	}
	return out, nil
}

// Tenants lists the tenants.
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	o, err := c.Objects(ctx)
	return o.Tenants, err
}

func (c *Client) getAll(ctx context.Context, what string, path dbus.ObjectPath, iface string) (map[string]dbus.Variant, error) {
	var props map[string]dbus.Variant
	err := c.callOn(ctx, c.conn.Object(BusName, path), 0, what, propertiesInterface+".GetAll", []any{iface}, &props)
	return props, err
}

// Instance reads one instance by UUID.
func (c *Client) Instance(ctx context.Context, id string) (Instance, error) {
	if _, err := uuid.Parse(id); err != nil {
		return Instance{}, &Error{Name: NameInvalidArgument, Message: fmt.Sprintf("%q is not an instance UUID (run `vgpuctl list`)", id)}
	}
	p, err := c.getAll(ctx, "instance "+id, InstancePath(id), InstanceInterface)
	if err != nil {
		return Instance{}, err
	}
	return instanceFrom(p), nil
}

// Tenant reads one tenant.
func (c *Client) Tenant(ctx context.Context, name string) (Tenant, error) {
	if !validLabel(name) {
		return Tenant{}, &Error{Name: NameNotFound, Message: fmt.Sprintf("no tenant %q: tenant names are lower-case letters, digits and '-' (run `vgpuctl tenant list`)", name)}
	}
	p, err := c.getAll(ctx, "tenant "+name, TenantPath(name), TenantInterface)
	if err != nil {
		return Tenant{}, err
	}
	return tenantFrom(p), nil
}

// GPU reads one GPU by PCI address, UUID or index.
func (c *Client) GPU(ctx context.Context, id string) (GPU, error) {
	gpus, err := c.GPUs(ctx)
	if err != nil {
		return GPU{}, err
	}
	for _, g := range gpus {
		if strings.EqualFold(g.PCI, id) || g.UUID == id || fmt.Sprint(g.Index) == id || strings.EqualFold(strings.TrimPrefix(g.PCI, "0000:"), id) {
			return g, nil
		}
	}
	return GPU{}, &Error{Name: NameNotFound, Message: fmt.Sprintf("no GPU %q on this host (run `vgpuctl gpus`)", id)}
}

// Profiles lists the profiles of the host's GPU models, or of one GPU's.
func (c *Client) Profiles(ctx context.Context, gpu string) ([]Profile, error) {
	var rows []profileEntry
	if err := c.call(ctx, "list profiles", "ListProfiles", []any{gpu}, &rows); err != nil {
		return nil, err
	}
	out := make([]Profile, 0, len(rows))
	for _, r := range rows {
		p := Profile{Model: r.Model, Name: r.Name, Kind: r.Kind, VRAMBytes: r.VRAMBytes, ComputeMilli: r.Compute, MaxPerGPU: int(r.MaxPerGPU), Flows: []string{}}
		if r.Flows != "" {
			p.Flows = strings.Split(r.Flows, ",")
		}
		out = append(out, p)
	}
	return out, nil
}

func capacityFrom(rows []capacityEntry) []Capacity {
	out := make([]Capacity, 0, len(rows))
	for _, r := range rows {
		out = append(out, Capacity{Model: r.Model, Profile: r.Profile, Kind: r.Kind, Count: int(r.Count), GPUs: int(r.GPUs)})
	}
	return out
}

func movesFrom(rows []moveEntry) []Move {
	out := make([]Move, 0, len(rows))
	for _, r := range rows {
		out = append(out, Move{Instance: r.Instance, Profile: r.Profile, FromGPU: r.FromGPU, FromStart: int(r.FromStart), ToGPU: r.ToGPU, ToStart: int(r.ToStart)})
	}
	return out
}

// Capacity says how many more of each profile fit now.
func (c *Client) Capacity(ctx context.Context) ([]Capacity, error) {
	var rows []capacityEntry
	if err := c.call(ctx, "capacity", "GetCapacity", nil, &rows); err != nil {
		return nil, err
	}
	return capacityFrom(rows), nil
}

// PlanRequest asks where a profile would go.
type PlanRequest struct {
	Tenant, Profile, GPU string
}

// Plan answers where a request would go; nothing changes.
func (c *Client) Plan(ctx context.Context, r PlanRequest) (Plan, error) {
	p := Plan{Tenant: r.Tenant, Profile: r.Profile}
	var start int32
	var moves []moveEntry
	var free []capacityEntry
	o := map[string]dbus.Variant{}
	if r.GPU != "" {
		o["gpu"] = dbus.MakeVariant(r.GPU)
	}
	err := c.call(ctx, "plan "+r.Profile, "Plan", []any{r.Tenant, r.Profile, o},
		&p.Fits, &p.Model, &p.GPU, &p.GPUUUID, &start, &p.Device, &p.VRAMBytes, &p.ComputeMilli, &p.Reason, &p.Refusal,
		&p.QuotaOK, &p.QuotaMessage, &moves, &free)
	if err != nil {
		return Plan{}, err
	}
	p.Start, p.Moves, p.FreeAfter = int(start), movesFrom(moves), capacityFrom(free)
	return p, nil
}

// CreateRequest asks for one instance.
type CreateRequest struct {
	Tenant, Profile string
	// GPU pins the GPU; UUID makes retries idempotent; Affinity is none,
	// spread or pack.
	GPU, UUID, Affinity string
	// PlacementConsumer is the consumer UUID of a fleet scheduler's
	// Placement allocation that the create must honour (docs/fleet.md).
	PlacementConsumer string
}

func (r CreateRequest) options() map[string]dbus.Variant {
	o := map[string]dbus.Variant{}
	for k, v := range map[string]string{"gpu": r.GPU, "uuid": r.UUID, "affinity": r.Affinity, OptPlacementConsumer: r.PlacementConsumer} {
		if v != "" {
			o[k] = dbus.MakeVariant(v)
		}
	}
	return o
}

// noAutoStart marks a context whose calls must not start vgpud through
// D-Bus activation.
type noAutoStart struct{}

// readBack reads an object after a change that succeeded. A caller that
// polkit lets change but not read gets what the reply said (fallback)
// instead of an error: the change happened, and a retry must not repeat it.
// So does a caller whose change was the last one a stopping vgpud finished:
// the read never activates vgpud again (that would start it while
// `systemctl stop` runs, cancelling the stop job), and finding it gone
// is no error. Nor is an object another client removed between the reply
// and the read (NotFound): the change succeeded, and reporting it failed
// would have a script retry what was done.
func readBack[T any](ctx context.Context, read func(context.Context) (T, error), fallback T) (T, error) {
	v, err := read(context.WithValue(ctx, noAutoStart{}, true))
	if n := ErrorName(err); n == NameAccessDenied || n == NameUnavailable || n == NameNotFound {
		return fallback, nil
	}
	return v, err
}

// Create admits and carves one instance and returns it. A caller who may
// not read gets only what the reply says: its UUID, tenant and profile.
// Its PlacementBehind says when the create did not keep its Placement
// promise.
func (c *Client) Create(ctx context.Context, r CreateRequest) (Instance, error) {
	var path dbus.ObjectPath
	var id string
	behind := c.watchBehind(ctx)
	if err := c.long(ctx, "create "+r.Profile, "CreateInstance", []any{r.Tenant, r.Profile}, r.options(), &path, &id); err != nil {
		behind("")
		return Instance{}, err
	}
	lag := behind(id)
	in, err := readBack(ctx, func(ctx context.Context) (Instance, error) { return c.Instance(ctx, id) },
		Instance{UUID: id, Tenant: r.Tenant, Profile: r.Profile})
	in.PlacementBehind = lag
	return in, err
}

// Destroy releases an instance; detach first detaches it from its VM.
func (c *Client) Destroy(ctx context.Context, id string, detach bool) error {
	_, err := c.DestroyBehind(ctx, id, detach)
	return err
}

// DestroyBehind is Destroy that also returns what the destroy left
// Placement behind on ("" when it kept its promise: the allocation
// removed and the GPU's inventory published before it returned).
func (c *Client) DestroyBehind(ctx context.Context, id string, detach bool) (string, error) {
	o := map[string]dbus.Variant{}
	if detach {
		o["detach"] = dbus.MakeVariant(true)
	}
	behind := c.watchBehind(ctx)
	if err := c.long(ctx, "destroy "+id, "DestroyInstance", []any{id}, o); err != nil {
		behind("")
		return "", err
	}
	return behind(id), nil
}

// watchBehind starts collecting the PlacementBehind signals of a change
// about to be called; the function it returns stops, and says what the
// signals for instance id said. The daemon sends the signal to this
// connection alone (unicast: no match rule needed), before its reply, and
// godbus hands a signal to a channel with room before it reads the next
// message, so by the reply the signal is in the channel. Only vgpud's own
// signals count: the sender must own BusName.
func (c *Client) watchBehind(ctx context.Context) func(id string) string {
	// Read per call: a restarted vgpud has another unique name. Without
	// it (no owner yet) the call fails anyway.
	var owner string
	_ = c.conn.BusObject().CallWithContext(ctx, "org.freedesktop.DBus.GetNameOwner", 0, BusName).Store(&owner)
	ch := make(chan *dbus.Signal, 256)
	c.conn.Signal(ch)
	return func(id string) string {
		defer c.conn.RemoveSignal(ch)
		var said []string
		for {
			select {
			case sig, ok := <-ch:
				if !ok {
					return strings.Join(said, "; ")
				}
				if sig.Name != ManagerInterface+".PlacementBehind" || len(sig.Body) != 3 || sig.Sender != owner {
					continue
				}
				if got, _ := sig.Body[1].(string); got == id && id != "" {
					detail, _ := sig.Body[2].(string)
					said = append(said, detail)
				}
			default:
				return strings.Join(said, "; ")
			}
		}
	}
}

// AttachOptions modify Attach and CreateAndAttach.
type AttachOptions struct {
	Display bool
	// RamFB adds a boot framebuffer to the display (implies Display).
	RamFB bool
	// Tenant, when set, must own the instance.
	Tenant string
}

// Attach makes an instance a hostdev of a VM and returns the instance (for
// a caller who may not read, only its UUID and the attachment).
func (c *Client) Attach(ctx context.Context, id, vm string, ao AttachOptions) (Instance, error) {
	o := map[string]dbus.Variant{}
	if ao.Display {
		o["display"] = dbus.MakeVariant(true)
	}
	if ao.RamFB {
		o["ramfb"] = dbus.MakeVariant(true)
	}
	if ao.Tenant != "" {
		o["tenant"] = dbus.MakeVariant(ao.Tenant)
	}
	var vmUUID string
	var live bool
	if err := c.long(ctx, "attach "+id+" to "+vm, "Attach", []any{id, vm}, o, &vmUUID, &live); err != nil {
		return Instance{}, err
	}
	return readBack(ctx, func(ctx context.Context) (Instance, error) { return c.Instance(ctx, id) },
		Instance{UUID: id, Tenant: ao.Tenant, Attachment: &Attachment{VM: vm, VMUUID: vmUUID, Live: live}})
}

// CreateAndAttach creates an instance and attaches it to a VM (for a
// caller who may not read, the instance is what the reply says).
func (c *Client) CreateAndAttach(ctx context.Context, r CreateRequest, vm string, ao AttachOptions) (Instance, error) {
	o := r.options()
	if ao.Display {
		o["display"] = dbus.MakeVariant(true)
	}
	if ao.RamFB {
		o["ramfb"] = dbus.MakeVariant(true)
	}
	var path dbus.ObjectPath
	var id string
	var live bool
	behind := c.watchBehind(ctx)
	if err := c.long(ctx, "attach a new "+r.Profile+" to "+vm, "CreateAndAttach", []any{r.Tenant, r.Profile, vm}, o, &path, &id, &live); err != nil {
		behind("")
		return Instance{}, err
	}
	lag := behind(id)
	in, err := readBack(ctx, func(ctx context.Context) (Instance, error) { return c.Instance(ctx, id) },
		Instance{UUID: id, Tenant: r.Tenant, Profile: r.Profile, Attachment: &Attachment{VM: vm, Live: live}})
	in.PlacementBehind = lag
	return in, err
}

// Detach removes an instance from its VM.
func (c *Client) Detach(ctx context.Context, id string) error {
	return c.long(ctx, "detach "+id, "Detach", []any{id}, nil)
}

// HostdevXML is the <hostdev> element of an instance.
func (c *Client) HostdevXML(ctx context.Context, id string) (string, error) {
	var doc string
	err := c.call(ctx, "hostdev XML of "+id, "GetHostdevXML", []any{id}, &doc)
	return doc, err
}

// TenantSpec defines a tenant.
type TenantSpec struct {
	Name                           string
	Quota                          Quota
	Class                          string
	AllowedModels, AllowedProfiles []string
}

// DefineTenant defines a tenant and returns it (for a caller who may not
// read, the definition it sent).
func (c *Client) DefineTenant(ctx context.Context, t TenantSpec) (Tenant, error) {
	o := map[string]dbus.Variant{}
	if len(t.AllowedModels) > 0 {
		o["allowed-models"] = dbus.MakeVariant(t.AllowedModels)
	}
	if len(t.AllowedProfiles) > 0 {
		o["allowed-profiles"] = dbus.MakeVariant(t.AllowedProfiles)
	}
	var path dbus.ObjectPath
	if err := c.long(ctx, "define tenant "+t.Name, "DefineTenant",
		[]any{t.Name, uint64(t.Quota.VRAMBytes), uint64(t.Quota.ComputeMilli), uint64(t.Quota.MaxInstances), t.Class}, o, &path); err != nil {
		return Tenant{}, err
	}
	class := t.Class
	if class == "" {
		class = "best-effort" // what vgpud makes of no class
	}
	sent := Tenant{Name: t.Name, Class: class, Quota: t.Quota, AllowedModels: nonNilStrings(t.AllowedModels), AllowedProfiles: nonNilStrings(t.AllowedProfiles), Instances: []string{}}
	return readBack(ctx, func(ctx context.Context) (Tenant, error) { return c.Tenant(ctx, t.Name) }, sent)
}

// SetQuota replaces a tenant's quota and returns the tenant (for a caller
// who may not read, only its name and the quota it sent).
func (c *Client) SetQuota(ctx context.Context, name string, q Quota) (Tenant, error) {
	if err := c.long(ctx, "set quota of "+name, "SetQuota", []any{name, uint64(q.VRAMBytes), uint64(q.ComputeMilli), uint64(q.MaxInstances)}, nil); err != nil {
		return Tenant{}, err
	}
	sent := Tenant{Name: name, Quota: q, AllowedModels: []string{}, AllowedProfiles: []string{}, Instances: []string{}}
	return readBack(ctx, func(ctx context.Context) (Tenant, error) { return c.Tenant(ctx, name) }, sent)
}

// UndefineTenant removes a tenant; force destroys its instances first.
func (c *Client) UndefineTenant(ctx context.Context, name string, force bool) error {
	return c.long(ctx, "undefine tenant "+name, "UndefineTenant", []any{name, force}, nil)
}

// Apply applies (or with dryRun only diffs) a declarative configuration.
// Cancelling ctx asks vgpud to stop the apply between changes; the
// changes it has done stay (an apply is a series of operations, each
// finished or undone on its own, not one that is undone as a whole).
func (c *Client) Apply(ctx context.Context, name string, data []byte, sel string, dryRun bool) (ApplyResult, error) {
	o := map[string]dbus.Variant{}
	if name != "" {
		o["name"] = dbus.MakeVariant(name)
	}
	var changes, result, summary string
	if err := c.long(ctx, "apply "+name, "Apply", []any{string(data), sel, dryRun}, o, &changes, &result, &summary); err != nil {
		var e *Error
		if !dryRun && errors.Is(ctx.Err(), context.Canceled) && errors.As(err, &e) && e.Name == NameTimeout {
			// fromDBus's words for a cancelled operation promise an undo
			// that an apply does not make.
			return ApplyResult{}, &Error{Name: NameTimeout, Message: "apply " + name + ": cancelled; vgpud was asked to stop the apply: it begins no further change, " +
				"a change under way finishes or is undone on its own, and the changes already done stay (an apply is not undone as a whole); " +
				"run `vgpuctl apply --dry-run` with the same file to see what is left"}
		}
		return ApplyResult{}, err
	}
	return ApplyResult{DryRun: dryRun, Changes: []byte(changes), Result: []byte(result), Summary: summary}, nil
}

// Reconcile runs a reconcile pass now.
func (c *Client) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var usec uint64
	var r ReconcileReport
	var foreign []foreignEntry
	if err := c.long(ctx, "reconcile", "Reconcile", nil, nil, &usec, &r.Finished, &r.Undone, &r.Recreated, &r.Lost, &r.Failed, &foreign, &r.Attachments, &r.Pending); err != nil {
		return ReconcileReport{}, err
	}
	r.DurationSeconds = float64(usec) / 1e6
	r.Foreign = []Foreign{}
	for _, f := range foreign {
		r.Foreign = append(r.Foreign, Foreign(f))
	}
	return r, nil
}

// Defragment plans, or with apply performs, the moves that admit a request.
func (c *Client) Defragment(ctx context.Context, r PlanRequest, apply bool) (DefragResult, error) {
	o := map[string]dbus.Variant{}
	if r.GPU != "" {
		o["gpu"] = dbus.MakeVariant(r.GPU)
	}
	var moves []moveEntry
	var res DefragResult
	var start int32
	if err := c.long(ctx, "defragment for "+r.Profile, "Defragment", []any{r.Tenant, r.Profile, apply}, o, &moves, &res.GPU, &start, &res.Applied); err != nil {
		return DefragResult{}, err
	}
	res.Moves, res.Start = movesFrom(moves), int(start)
	return res, nil
}

// SetMIGMode turns MIG on or off on a GPU.
func (c *Client) SetMIGMode(ctx context.Context, gpu string, on bool) error {
	return c.long(ctx, "set MIG mode of "+gpu, "SetMIGMode", []any{gpu, on}, nil)
}

// SetHeterogeneous allows mixed vGPU sizes on a GPU, or not.
func (c *Client) SetHeterogeneous(ctx context.Context, gpu string, on bool) error {
	return c.long(ctx, "set heterogeneous mode of "+gpu, "SetHeterogeneous", []any{gpu, on}, nil)
}

// GPUScheduler is what SetGPUScheduler answers: the GPU's scheduler mode
// and whether the pinned setting waits for the GPU's VMs to stop.
type GPUScheduler struct {
	Mode    string `json:"mode"`
	Pending bool   `json:"pending"`
	Detail  string `json:"detail,omitempty"`
}

// SetGPUScheduler pins a GPU's vGPU scheduler policy and time slice (mode
// pinned, or "" with a policy) or hands it to the share loop (adaptive).
func (c *Client) SetGPUScheduler(ctx context.Context, gpu, mode, policy string, timeslice time.Duration) (GPUScheduler, error) {
	var r GPUScheduler
	err := c.long(ctx, "set the vGPU scheduler of "+gpu, "SetGPUScheduler", []any{gpu, mode, policy, uint64(timeslice / time.Microsecond)}, nil, &r.Mode, &r.Pending, &r.Detail)
	return r, err
}

// SetGPUInstanceScheduler pins the vGPU scheduler of GPU instance gi of
// a Blackwell GB20x GPU (mode pinned, or "" with a policy) or drops the
// pin (adaptive).
func (c *Client) SetGPUInstanceScheduler(ctx context.Context, gpu string, gi int, mode, policy string, timeslice time.Duration) (GPUScheduler, error) {
	var r GPUScheduler
	if gi < 0 || gi > math.MaxInt32 {
		return r, &Error{Name: NameInvalidArgument, Message: fmt.Sprintf("GPU instance id %d is out of range (0..%d)", gi, math.MaxInt32)}
	}
	err := c.long(ctx, fmt.Sprintf("set the scheduler of GPU instance %d of %s", gi, gpu), "SetGPUInstanceScheduler",
		[]any{gpu, int32(gi), mode, policy, uint64(timeslice / time.Microsecond)}, nil, &r.Mode, &r.Pending, &r.Detail)
	return r, err
}

// ClearGPU returns a failed GPU to service (an operator checked it).
func (c *Client) ClearGPU(ctx context.Context, gpu string) error {
	return c.long(ctx, "clear GPU "+gpu, "ClearGPU", []any{gpu}, nil)
}

// Shares reads per-instance entitled and achieved compute.
func (c *Client) Shares(ctx context.Context) ([]ShareRow, error) {
	var rows []shareEntry
	if err := c.call(ctx, "shares", "GetShares", nil, &rows); err != nil {
		return nil, err
	}
	known := func(v float64) *float64 {
		if v < 0 {
			return nil
		}
		return &v
	}
	out := make([]ShareRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, ShareRow{Instance: r.Instance, EntitledMilli: r.Entitled, AchievedMilli: known(r.Achieved), DemandMilli: known(r.Demand), Interference: known(r.Interference)})
	}
	return out, nil
}

// Cancel asks vgpud to cancel an operation by its operation id.
func (c *Client) Cancel(ctx context.Context, id string) error {
	return c.callOn(ctx, c.mgr, dbus.FlagAllowInteractiveAuthorization, "cancel "+id, ManagerInterface+".Cancel", []any{id})
}

// Events follows vgpud's signals until ctx ends; the channel is closed
// then, or when the connection closes. Reading the objects first checks
// that the caller may (the bus policy hides the signals from others).
func (c *Client) Events(ctx context.Context) (<-chan Event, error) {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := c.Status(sctx)
	cancel()
	if err != nil {
		return nil, err
	}
	ch := make(chan *dbus.Signal, 256)
	c.conn.Signal(ch)
	if err := c.conn.AddMatchSignalContext(ctx, dbus.WithMatchSender(BusName), dbus.WithMatchPathNamespace(ManagerPath)); err != nil {
		c.conn.RemoveSignal(ch)
		return nil, fromDBus(ctx, "follow events", err)
	}
	out := make(chan Event, 256)
	go func() {
		defer close(out)
		defer c.conn.RemoveSignal(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case sig, ok := <-ch:
				if !ok {
					return
				}
				e, ok := eventFrom(sig)
				if !ok {
					continue
				}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

func describe(p dbus.ObjectPath) (kind, id string) {
	k, v := parsePath(p)
	switch k {
	case kindGPU:
		return "gpu", v
	case kindInstance:
		return "instance", v
	case kindTenant:
		return "tenant", v
	}
	return "manager", ""
}

func eventFrom(sig *dbus.Signal) (Event, bool) {
	iface, member := "", sig.Name
	if i := strings.LastIndexByte(sig.Name, '.'); i >= 0 {
		iface, member = sig.Name[:i], sig.Name[i+1:]
	}
	e := Event{Time: time.Now().UTC(), Signal: member, Object: string(sig.Path)}
	e.Kind, e.ID = describe(sig.Path)
	s := func(i int) string {
		if i < len(sig.Body) {
			v, _ := sig.Body[i].(string)
			return v
		}
		return ""
	}
	switch iface + "." + member {
	case objectManagerInterface + ".InterfacesAdded":
		if len(sig.Body) < 2 {
			return e, false
		}
		p, _ := sig.Body[0].(dbus.ObjectPath)
		e.Object = string(p)
		e.Kind, e.ID = describe(p)
		if ifaces, ok := sig.Body[1].(map[string]map[string]dbus.Variant); ok {
			for name, props := range ifaces {
				if strings.HasPrefix(name, "dev.vgpud1.") {
					e.Changed = plain(props)
				}
			}
		}
	case objectManagerInterface + ".InterfacesRemoved":
		if len(sig.Body) < 1 {
			return e, false
		}
		p, _ := sig.Body[0].(dbus.ObjectPath)
		e.Object = string(p)
		e.Kind, e.ID = describe(p)
	case propertiesInterface + ".PropertiesChanged":
		if len(sig.Body) < 2 {
			return e, false
		}
		if props, ok := sig.Body[1].(map[string]dbus.Variant); ok {
			e.Changed = plain(props)
		}
	case ManagerInterface + ".OperationFinished":
		e.Operation, e.Kind, e.ID = s(0), kindOfID(s(1)), s(1)
	case ManagerInterface + ".OperationFailed":
		e.Operation, e.Kind, e.ID, e.Message = s(0), kindOfID(s(1)), s(1), s(2)
	case ManagerInterface + ".GPULost":
		e.Kind, e.ID, e.Message = "gpu", s(0), s(2)
		e.Object = string(GPUPath(s(0)))
	case ManagerInterface + ".VMEvent":
		e.Kind, e.ID, e.Message, e.Operation = "vm", s(0), s(1), s(2)
	case ManagerInterface + ".PolicySwitched":
		e.Kind, e.ID, e.Message = "gpu", s(0), s(1)
	case ManagerInterface + ".PlacementBehind":
		e.Operation, e.Kind, e.ID, e.Message = s(0), "instance", s(1), s(2)
	case ManagerInterface + ".HostDrift":
		e.Operation, e.ID, e.Message = s(0), s(1), s(2)
		e.Kind = "gpu"
		if s(0) == "missing" {
			e.Kind = "instance"
		}
	default:
		return e, false
	}
	return e, true
}

func kindOfID(id string) string {
	if _, err := uuid.Parse(id); err == nil {
		return "instance"
	}
	return "manager"
}

func plain(props map[string]dbus.Variant) map[string]any {
	out := make(map[string]any, len(props))
	for k, v := range props {
		switch x := v.Value().(type) {
		case dbus.ObjectPath:
			out[k] = string(x)
		case []dbus.ObjectPath:
			s := make([]string, len(x))
			for i, p := range x {
				s[i] = string(p)
			}
			out[k] = s
		default:
			out[k] = x
		}
	}
	return out
}

// Property readers: a missing or mistyped property reads as the zero
// value, so an older daemon without a newer property still works.

func str(p map[string]dbus.Variant, k string) string {
	v, _ := p[k].Value().(string)
	return v
}

func u64(p map[string]dbus.Variant, k string) uint64 {
	v, _ := p[k].Value().(uint64)
	return v
}

func i32(p map[string]dbus.Variant, k string) int {
	v, _ := p[k].Value().(int32)
	return int(v)
}

func boolean(p map[string]dbus.Variant, k string) bool {
	v, _ := p[k].Value().(bool)
	return v
}

func strs(p map[string]dbus.Variant, k string) []string {
	v, _ := p[k].Value().([]string)
	if v == nil {
		return []string{}
	}
	return v
}

func paths(p map[string]dbus.Variant, k string) []dbus.ObjectPath {
	v, _ := p[k].Value().([]dbus.ObjectPath)
	return v
}

func instanceIDs(p map[string]dbus.Variant, k string) []string {
	out := []string{}
	for _, x := range paths(p, k) {
		if id, ok := InstanceID(x); ok {
			out = append(out, id)
		}
	}
	return out
}

func gpuFrom(p map[string]dbus.Variant) GPU {
	g := GPU{
		PCI: str(p, "PCI"), UUID: str(p, "UUID"), Index: i32(p, "Index"), Model: str(p, "Model"), Product: str(p, "Product"),
		MemoryBytes: u64(p, "MemoryBytes"), NUMANode: i32(p, "NUMANode"), KernelDriver: str(p, "KernelDriver"),
		State: str(p, "State"), Reason: str(p, "Reason"),
		MIG:       GPUMIG{Capable: boolean(p, "MIGCapable"), Enabled: boolean(p, "MIGEnabled"), Pending: boolean(p, "MIGPending"), Instances: []GPUInstance{}},
		VGPU:      GPUVGPU{Flavour: str(p, "VGPUFlavour"), Heterogeneous: boolean(p, "Heterogeneous"), TotalVFs: i32(p, "TotalVFs"), NumVFs: i32(p, "NumVFs")},
		Instances: instanceIDs(p, "Instances"),
	}
	if m := str(p, "SchedulerMode"); m != "" {
		g.Scheduler = &GPUSchedulerState{Mode: m, Policy: str(p, "SchedulerPolicy"),
			Timeslice: time.Duration(u64(p, "SchedulerTimesliceUsec")) * time.Microsecond, Pending: boolean(p, "SchedulerPending")}
	}
	if errs := strs(p, "Errors"); len(errs) > 0 {
		g.Errors = errs
	}
	var gis []migInstanceWire
	if v, ok := p["MIGInstances"]; ok {
		_ = v.Store(&gis)
	}
	for _, gi := range gis {
		g.MIG.Instances = append(g.MIG.Instances, GPUInstance{ID: int(gi.ID), ProfileID: int(gi.ProfileID), Profile: gi.Profile,
			Start: int(gi.Start), Size: int(gi.Size), ComputeInstances: int(gi.Compute)})
	}
	var scheds []giSchedulerWire
	if v, ok := p["GPUInstanceSchedulers"]; ok {
		_ = v.Store(&scheds)
	}
	var lastIDs []int32
	if v, ok := p["GPUInstanceSchedulerLastIDs"]; ok {
		_ = v.Store(&lastIDs)
	}
	for i, x := range scheds {
		last := int(x.ID)
		if i < len(lastIDs) {
			// A service older than the property leaves it out.
			last = int(lastIDs[i])
		}
		g.GPUInstanceSchedulers = append(g.GPUInstanceSchedulers, GPUInstanceScheduler{GPUInstance: int(x.ID), Profile: x.Profile, Start: int(x.Start), Size: int(x.Size),
			LastGPUInstance:   last,
			GPUSchedulerState: GPUSchedulerState{Mode: x.Mode, Policy: x.Policy, Timeslice: time.Duration(x.TimesliceUsec) * time.Microsecond, Pending: x.Pending}})
	}
	return g
}

func instanceFrom(p map[string]dbus.Variant) Instance {
	in := Instance{
		UUID: str(p, "UUID"), Tenant: str(p, "Tenant"), Kind: str(p, "Kind"), Profile: str(p, "Profile"), Model: str(p, "Model"),
		GPU: str(p, "GPU"), GPUUUID: str(p, "GPUUUID"), VRAMBytes: u64(p, "VRAMBytes"), ComputeMilli: u64(p, "ComputeMilli"),
		State: str(p, "State"), Reason: str(p, "Reason"),
		Created: fromUsec(u64(p, "CreatedTimestamp")), Updated: fromUsec(u64(p, "UpdatedTimestamp")),
	}
	if in.Kind == "mig" || in.Kind == "mig-vgpu" {
		in.MIG = &InstanceMIG{GPUInstanceProfileID: i32(p, "GPUInstanceProfileID"), Start: i32(p, "GPUInstanceStart"), Size: i32(p, "GPUInstanceSize"),
			GPUInstanceID: i32(p, "GPUInstanceID"), ComputeInstanceID: i32(p, "ComputeInstanceID"),
			ComputeInstanceProfileID: i32(p, "ComputeInstanceProfileID"), ComputeInstanceStart: i32(p, "ComputeInstanceStart"),
			ComputeInstanceSlices: i32(p, "ComputeInstanceSlices")}
	}
	if in.Kind == "vgpu" || in.Kind == "mig-vgpu" {
		in.VGPU = &InstanceVGPU{TypeID: i32(p, "VGPUTypeID"), Type: str(p, "VGPUType"), Flow: str(p, "Flow"), VF: str(p, "VF"),
			MdevUUID: str(p, "MdevUUID"), MdevParent: str(p, "MdevParent")}
	}
	if vm := str(p, "VM"); vm != "" {
		in.Attachment = &Attachment{VM: vm, VMUUID: str(p, "VMUUID"), URI: str(p, "VMURI"), Live: boolean(p, "Live"), Since: fromUsec(u64(p, "AttachedTimestamp"))}
	}
	return in
}

func tenantFrom(p map[string]dbus.Variant) Tenant {
	return Tenant{
		Name: str(p, "Name"), Class: str(p, "Class"),
		Quota:         Quota{VRAMBytes: Limit(u64(p, "VRAMQuota")), ComputeMilli: Limit(u64(p, "ComputeQuota")), MaxInstances: Limit(u64(p, "MaxInstances"))},
		Usage:         Usage{VRAMBytes: u64(p, "VRAMUsed"), ComputeMilli: u64(p, "ComputeUsed"), Instances: u64(p, "InstancesUsed")},
		AllowedModels: strs(p, "AllowedModels"), AllowedProfiles: strs(p, "AllowedProfiles"),
		Instances: instanceIDs(p, "Instances"), Created: fromUsec(u64(p, "CreatedTimestamp")),
		NotInCatalog: nilIfEmpty(strs(p, "NotInCatalog")),
	}
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

// validLabel reports whether name can be a tenant name (and so an object
// path element once '-' is mapped).
func validLabel(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
