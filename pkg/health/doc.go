// Package health follows the GPUs while vgpud runs: what the kernel
// (uevents about the GPUs' PCI functions, their SR-IOV virtual functions and
// mediated devices) and the driver (NVML events: XIDs, double-bit ECC
// errors, a GPU becoming unavailable, MIG reconfigured by another client)
// say about them, and what that means for the records.
//
// A GPU that fell off the bus or reported a critical XID is marked failed
// in the manager (new carving there is refused, the GPU reads "failed" or
// "lost" with the reason), and the host is reconciled, which marks the
// instances of a lost GPU lost. A failed GPU is re-read every RecoverProbe;
// when it is back (a lost GPU answers again; a GPU that reported an XID
// was re-bound to its driver, i.e. reset, or was lost and came back) it is
// cleared and reconciled, which re-creates its instances.
//
// Uevents are debounced: a burst is handled once it has been quiet for
// UeventSettle, and a storm at least every ten settle periods, so a
// thousand events cause a handful of re-reads, not a thousand.
//
// Beside the events it runs the periodic discovery (discovery.go): every
// DiscoveryInterval the records are compared with the whole host
// (manager.CheckDrift), and a daemon degraded for want of a driver looks
// for it every few seconds. Before any of this, WaitDriver (startup.go)
// holds the start until the driver is loaded and the SR-IOV VFs are there,
// up to driverWait.
//
// It owns the uevent and NVML event intake, the debouncer, the failure
// state machine, the XID catalogue, the periodic discovery and the
// start-up wait for the driver. It reaches the manager, discovery
// and the event sources through the interfaces of Config; of their
// packages it uses the types only (pkg/manager's events and reports,
// pkg/gpu/nvml's Event). Only cmd/vgpud (and tests) import it.
//
// Imports: pkg/gpu, pkg/gpu/nvml, pkg/manager, pkg/profile, pkg/uevent.
package health
