// Command vgpuctl is vgpud's command-line client, in the manner of virsh:
// it lists GPUs, profiles, capacity, instances and tenants, creates and
// destroys instances, attaches them to libvirt VMs, sets tenant quotas and
// applies declarative layouts, all through vgpud's D-Bus API (dev.vgpud1).
// Output is a table, or with -o json|yaml a stable, documented schema
// (docs/vgpuctl.md); exit codes say what kind of failure happened.
//
// It imports pkg/dbusapi (the typed client) and pkg/tenant (quantities).
//
// Imports: pkg/dbusapi, pkg/tenant, pkg/version.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], streams{in: os.Stdin, out: os.Stdout, err: os.Stderr}, dialBus)
	stop()
	os.Exit(code)
}
