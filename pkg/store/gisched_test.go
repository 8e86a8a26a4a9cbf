package store

import (
	"testing"
	"time"
)

// TestGPUInstanceSchedulersKept: a GPU record holding only GPU-instance
// scheduler pins is kept (not Zero) and reads back whole.
func TestGPUInstanceSchedulersKept(t *testing.T) {
	db := openTest(t, Options{})
	pin := GPUInstanceScheduler{ProfileID: 47, Start: 3, Size: 3, Scheduler: Scheduler{Policy: "equal_share", Timeslice: 5 * time.Millisecond, Since: t0}}
	mustUpdate(t, db, func(tx *Tx) error {
		return tx.PutGPU(GPU{UUID: "GPU-1", GPUInstanceSchedulers: []GPUInstanceScheduler{pin}})
	})
	mustView(t, db, func(tx *Tx) error {
		g, err := tx.GPU("GPU-1")
		if err == nil && (len(g.GPUInstanceSchedulers) != 1 || g.GPUInstanceSchedulers[0] != pin) {
			t.Errorf("read back %+v, want %+v", g.GPUInstanceSchedulers, pin)
		}
		return err
	})
}
