package virt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"
)

// Defaults for LiveMigration fields left zero.
const (
	DefaultMaxDowntime      = 500 * time.Millisecond
	DefaultMigrationTimeout = 10 * time.Minute
	// abortTimeout bounds the DomainAbortJob sent when a live migration's
	// context ends.
	abortTimeout = 10 * time.Second
)

var (
	// ErrDomainRunning: an offline migration of a domain that runs.
	ErrDomainRunning = errors.New("domain is running")
	// ErrUndefineRefused: libvirt refuses to undefine a shut-off domain
	// for what it holds beside its definition (snapshots, checkpoints);
	// libvirt's message (the wrapped *LibvirtError) says which.
	ErrUndefineRefused = errors.New("libvirt refuses to undefine the domain")
	// ErrMigrationInterrupted: the connection to libvirtd broke while it
	// ran a migration. The migration may have finished, failed or still be
	// running; look the domain up on both ends before doing anything else.
	// A migration is never repeated on its own.
	ErrMigrationInterrupted = errors.New("connection to libvirtd broke during the migration; its outcome is unknown")
	// ErrMigrationAborted: the migration was cancelled (AbortMigration, or
	// the caller's context ended and the job was aborted); the domain runs
	// on the source.
	ErrMigrationAborted = errors.New("migration aborted")
)

// LiveMigration says how to move a running domain.
type LiveMigration struct {
	// DestURI is the libvirt URI the source's libvirtd opens to the
	// destination's (the migration is peer-to-peer: go-libvirt has no
	// client side to drive the five steps of a managed migration over two
	// connections), e.g. qemu+tls://host-b/system.
	DestURI string
	// MigrateURI is QEMU's data channel, tcp://address:port on the
	// destination. Empty lets the destination choose, which names its
	// hostname: it must resolve from the source.
	MigrateURI string
	// DestXML is the destination's live definition
	// (MigrationXML.Live), VIR_MIGRATE_PARAM_DEST_XML; empty keeps the
	// source's.
	DestXML string
	// PersistXML is the destination's persistent configuration
	// (MigrationXML.Persistent), VIR_MIGRATE_PARAM_PERSIST_XML; empty
	// keeps the source's, vGPU included.
	PersistXML string
	// Dest is the destination's versions, for CheckLiveMigration.
	Dest HostVersions
	// MaxDowntime bounds the pause at switch-over (default 500 ms): a
	// vGPU's state moves while the guest is paused.
	MaxDowntime time.Duration
	// Bandwidth caps the transfer in MiB/s; 0 is unlimited.
	Bandwidth uint64
	// KeepSource keeps the source's persistent definition; by default it
	// is undefined once the destination runs the domain.
	KeepSource bool
	// Timeout bounds the whole migration (default 10 min); at its end the
	// job is aborted.
	Timeout time.Duration
	// OnProgress, when set, is called every ProgressEvery (default 1 s)
	// with the job's state while the migration runs.
	OnProgress    func(MigrationProgress)
	ProgressEvery time.Duration
}

// MigrateLive moves a running domain to the destination. It first reads
// the domain's live definition and refuses, with ErrLiveMigrationRefused,
// a domain holding a vGPU where either end is too old (CheckLiveMigration);
// then it sets the maximum downtime and runs a peer-to-peer, pre-copy
// migration (never post-copy: a VFIO device cannot fault pages in from the
// source), persistent on the destination, the source's definition
// undefined unless KeepSource. When ctx or Timeout ends first the job is
// aborted and the error wraps ErrMigrationAborted and ErrTimeout (or the
// cancellation).
func (c *Conn) MigrateLive(ctx context.Context, ref string, m LiveMigration) error {
	name, err := c.parseRef(ref)
	if err != nil {
		return err
	}
	if m.DestURI == "" {
		return fmt.Errorf("migrate %s: no destination URI", name)
	}
	if m.MaxDowntime <= 0 {
		m.MaxDowntime = DefaultMaxDowntime
	}
	if m.Timeout <= 0 {
		m.Timeout = DefaultMigrationTimeout
	}
	if err := c.PrecheckLive(ctx, name, m.Dest); err != nil {
		return err
	}
	unlock := c.locks.lock("migrate:" + name)
	defer unlock()
	attempts := 0
	return c.doTimeout(ctx, m.Timeout, "migrate", func(r *rpc) error {
		if attempts++; attempts > 1 {
			return fmt.Errorf("migrate %s: %w", name, ErrMigrationInterrupted)
		}
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		if st, err := r.state(d); err != nil {
			return err
		} else if !st.active {
			return fmt.Errorf("migrate %s live: the domain is not running", name)
		}
		if m.DestXML != "" {
			if err := checkSame(d, m.DestXML); err != nil {
				return err
			}
		}
		if m.PersistXML != "" {
			if err := checkSame(d, m.PersistXML); err != nil {
				return err
			}
		}
		ms := uint64(m.MaxDowntime / time.Millisecond)
		if err := call0(r, func(l *libvirt.Libvirt) error { return l.DomainMigrateSetMaxDowntime(d, ms, 0) }); err != nil {
			return fmt.Errorf("migrate %s: set max downtime %d ms: %w", name, ms, err)
		}
		return c.perform(r, d, m)
	})
}

// perform runs the migration call, polls progress meanwhile, and aborts
// the job when the context ends before libvirt answers.
func (c *Conn) perform(r *rpc, d libvirt.Domain, m LiveMigration) error {
	params := []libvirt.TypedParam{}
	str := func(field, v string) {
		if v != "" {
			params = append(params, libvirt.TypedParam{Field: field, Value: *libvirt.NewTypedParamValueString(v)})
		}
	}
	str(libvirt.MigrateParamURI, m.MigrateURI)
	str(libvirt.MigrateParamDestXML, m.DestXML)
	str(libvirt.MigrateParamPersistXML, m.PersistXML)
	if m.Bandwidth > 0 {
		params = append(params, libvirt.TypedParam{Field: libvirt.MigrateParamBandwidth, Value: *libvirt.NewTypedParamValueUllong(m.Bandwidth)})
	}
	flags := libvirt.MigrateLive | libvirt.MigratePeer2peer | libvirt.MigratePersistDest | libvirt.MigrateAbortOnError
	if !m.KeepSource {
		flags |= libvirt.MigrateUndefineSource
	}
	stop := make(chan struct{})
	defer close(stop)
	if m.OnProgress != nil {
		go c.watch(d, m, stop)
	}
	err := call0(r, func(l *libvirt.Libvirt) error {
		_, err := l.DomainMigratePerform3Params(d, libvirt.OptString{m.DestURI}, params, nil, flags)
		return err
	})
	if err == nil {
		return nil
	}
	if r.ctx.Err() != nil {
		// go-libvirt's call is abandoned, not cancelled: stop the job
		// itself, or it goes on after the caller gave up.
		if aerr := c.abortAbandoned(d.Name); aerr != nil {
			return fmt.Errorf("migrate %s: %w: %w; abort the job: %w", d.Name, ErrMigrationInterrupted, err, aerr)
		}
		return fmt.Errorf("migrate %s: %w: %w", d.Name, ErrMigrationAborted, err)
	}
	var le *LibvirtError
	if errors.As(err, &le) && libvirt.ErrorNumber(le.Code) == libvirt.ErrOperationAborted {
		return fmt.Errorf("migrate %s: %w: %w", d.Name, ErrMigrationAborted, err)
	}
	return fmt.Errorf("migrate %s to %s: %w", d.Name, m.DestURI, err)
}

// abortAbandoned aborts the job of a migration whose caller gave up. The
// job may not have started yet (libvirt then refuses the abort as invalid)
// so the abort is retried until it is taken or abortTimeout passes; a
// domain that no longer runs on the source has already moved.
func (c *Conn) abortAbandoned(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), abortTimeout)
	defer cancel()
	for {
		err := c.AbortMigration(ctx, name)
		var le *LibvirtError
		if err == nil || !errors.As(err, &le) || libvirt.ErrorNumber(le.Code) != libvirt.ErrOperationInvalid {
			return err
		}
		if d, derr := c.Domain(ctx, name); derr != nil || !d.Running {
			return fmt.Errorf("the domain no longer runs on the source (%v): the migration finished after its deadline", derr)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// watch reports progress until stop closes.
func (c *Conn) watch(d libvirt.Domain, m LiveMigration, stop <-chan struct{}) {
	every := m.ProgressEvery
	if every <= 0 {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		p, err := c.MigrationProgress(ctx, d.Name)
		cancel()
		if err == nil && p.Active {
			m.OnProgress(p)
		}
	}
}

// checkSame refuses a definition for another domain than d.
func checkSame(d libvirt.Domain, doc string) error {
	var def libvirtxml.Domain
	if err := def.Unmarshal(doc); err != nil {
		return fmt.Errorf("%w: parse: %w", ErrBadDestXML, err)
	}
	if def.Name != d.Name || def.UUID != uuid.UUID(d.UUID).String() {
		return fmt.Errorf("%w: definition of %s (%s) given for %s (%s)", ErrBadDestXML, def.Name, def.UUID, d.Name, uuid.UUID(d.UUID))
	}
	return nil
}

// MigrationProgress is a domain's job as DomainGetJobStats reports it.
type MigrationProgress struct {
	// Active says a job runs (a migration, or another job libvirt
	// reports the same way).
	Active bool
	// Operation is libvirt's virDomainJobOperation (5: outgoing
	// migration).
	Operation int
	Elapsed   time.Duration
	// Remaining is libvirt's estimate; 0 when it has none.
	Remaining time.Duration
	// Data* count every byte to move: memory, disks and device state.
	DataTotal, DataProcessed, DataRemaining uint64
	// Memory* count the guest memory; MemoryIteration is the pre-copy
	// pass.
	MemoryTotal, MemoryProcessed, MemoryRemaining, MemoryIteration uint64
	// VFIOData is the device state moved so far (libvirt 10.6 and later).
	VFIOData uint64
}

// Outgoing says the job moves the domain to another host: an outgoing
// migration, or an active job whose operation libvirt does not name
// (which may be one).
func (p MigrationProgress) Outgoing() bool {
	return p.Active && (p.Operation == int(libvirt.DomainJobOperationStrMigrationOut) || p.Operation == int(libvirt.DomainJobOperationStrUnknown))
}

// MigrationProgress reads the domain's current job.
func (c *Conn) MigrationProgress(ctx context.Context, ref string) (MigrationProgress, error) {
	name, err := c.parseRef(ref)
	if err != nil {
		return MigrationProgress{}, err
	}
	var out MigrationProgress
	err = c.do(ctx, "job stats", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		type stats struct {
			typ    int32
			params []libvirt.TypedParam
		}
		s, err := call(r, func(l *libvirt.Libvirt) (stats, error) {
			t, p, err := l.DomainGetJobStats(d, 0)
			return stats{t, p}, err
		})
		if err != nil {
			return fmt.Errorf("domain %s: job stats: %w", name, err)
		}
		out = progressFrom(libvirt.DomainJobType(s.typ), s.params)
		return nil
	})
	return out, err
}

func progressFrom(typ libvirt.DomainJobType, params []libvirt.TypedParam) MigrationProgress {
	p := MigrationProgress{Active: typ == libvirt.DomainJobBounded || typ == libvirt.DomainJobUnbounded}
	u := map[string]*uint64{
		libvirt.DomainJobDataTotal:           &p.DataTotal,
		libvirt.DomainJobDataProcessed:       &p.DataProcessed,
		libvirt.DomainJobDataRemaining:       &p.DataRemaining,
		libvirt.DomainJobMemoryTotal:         &p.MemoryTotal,
		libvirt.DomainJobMemoryProcessed:     &p.MemoryProcessed,
		libvirt.DomainJobMemoryRemaining:     &p.MemoryRemaining,
		libvirt.DomainJobMemoryIteration:     &p.MemoryIteration,
		libvirt.DomainJobVfioDataTransferred: &p.VFIOData,
	}
	for _, tp := range params {
		switch v := tp.Value.I.(type) {
		case uint64:
			switch tp.Field {
			case libvirt.DomainJobTimeElapsed:
				p.Elapsed = time.Duration(v) * time.Millisecond
			case libvirt.DomainJobTimeRemaining:
				p.Remaining = time.Duration(v) * time.Millisecond
			default:
				if dst, ok := u[tp.Field]; ok {
					*dst = v
				}
			}
		case int32:
			if tp.Field == libvirt.DomainJobOperationStr {
				p.Operation = int(v)
			}
		}
	}
	return p
}

// AbortMigration cancels the domain's running job (DomainAbortJob); the
// migration call then fails with ErrMigrationAborted and the domain keeps
// running on the source. With no job running libvirt refuses
// (operation invalid).
func (c *Conn) AbortMigration(ctx context.Context, ref string) error {
	name, err := c.parseRef(ref)
	if err != nil {
		return err
	}
	return c.do(ctx, "abort job", func(r *rpc) error {
		d, err := r.lookup(name)
		if err != nil {
			return err
		}
		if err := call0(r, func(l *libvirt.Libvirt) error { return l.DomainAbortJob(d) }); err != nil {
			return fmt.Errorf("domain %s: abort job: %w", name, err)
		}
		return nil
	})
}
