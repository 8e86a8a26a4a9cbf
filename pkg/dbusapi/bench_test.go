package dbusapi

import (
	"context"
	"testing"

	testbus "github.com/vgpud/vgpud/internal/testenv/dbus"
	"github.com/vgpud/vgpud/pkg/manager"
)

// BenchmarkDBusReadRoundTrip is one read call through a real dbus-daemon:
// client, bus, service, manager and back.
func BenchmarkDBusReadRoundTrip(b *testing.B) {
	e := newEnv(b, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	for _, p := range []string{"3g.40gb", "L4-4Q", "A10-4Q"} {
		e.create("acme", p, "")
	}
	ctx := context.Background()
	b.Run("ListGPUs", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rows []gpuEntry
			if err := e.client.call(ctx, "list", "ListGPUs", nil, &rows); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("GetManagedObjects", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.client.Objects(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PropertyGet", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := e.client.Version(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDBusCreateDestroy is a create and a destroy of one instance over
// the bus, signals included.
func BenchmarkDBusCreateDestroy(b *testing.B) {
	for _, prof := range []string{"1g.10gb", "L4-4Q"} {
		b.Run(prof, func(b *testing.B) {
			e := newEnv(b, testbus.Options{}, nil)
			e.tenant("acme", unlimitedQuota())
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				in, err := e.client.Create(ctx, CreateRequest{Tenant: "acme", Profile: prof})
				if err != nil {
					b.Fatal(err)
				}
				if err := e.client.Destroy(ctx, in.UUID, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkManagerCreateDestroy is the same work without D-Bus: the
// baseline the bus's share of BenchmarkDBusCreateDestroy is read against.
func BenchmarkManagerCreateDestroy(b *testing.B) {
	e := newEnv(b, testbus.Options{}, nil)
	e.tenant("acme", unlimitedQuota())
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec, err := e.m.Create(ctx, manager.CreateRequest{Tenant: "acme", Profile: "L4-4Q"})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.m.Destroy(ctx, rec.UUID, manager.DestroyOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
