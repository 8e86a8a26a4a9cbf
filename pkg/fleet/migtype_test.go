package fleet

import (
	"context"
	"testing"
)

// TestFleetMigrationConsumerTypeKept: a migration consumer the source's
// pass writes (its move at MigrationSource left undone while Placement
// did not answer) is written as Move writes it, consumer_type MIGRATION,
// not as an instance's.
func TestFleetMigrationConsumerTypeKept(t *testing.T) {
	srv, c := startPlacement(t)
	src, dst := startMigHost(t, "type-src", c), startMigHost(t, "type-dst", c)
	src.pass(t)
	dst.pass(t)
	rec := src.running(t)
	settled(t, c, rec.UUID, src, src, dst)
	srv.Stop()
	if _, err := src.m().MigrationSource(context.Background(), rec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := srv.Run(); err != nil {
		t.Fatal(err)
	}
	src.pass(t)
	mc := migrationConsumerOf(t, src, rec.UUID)
	if got := holder(t, c, mc, src, dst); got != src.name {
		t.Fatalf("migration consumer allocated on %q after the pass, want %s", got, src.name)
	}
	cons, err := c.Consumer(context.Background(), mc)
	if err != nil || cons.ConsumerType != MigrationConsumerType {
		t.Fatalf("migration consumer written by the pass: type %q (%v), want %s", cons.ConsumerType, err, MigrationConsumerType)
	}
	if err := src.m().CancelOutgoing(context.Background(), rec.UUID); err != nil {
		t.Fatal(err)
	}
	src.pass(t)
	if cons, err := c.Consumer(context.Background(), rec.UUID); err != nil || cons.ConsumerType != ConsumerType {
		t.Fatalf("the instance's consumer after the VM stayed: type %q (%v), want %s", cons.ConsumerType, err, ConsumerType)
	}
	settled(t, c, rec.UUID, src, src, dst)
}
