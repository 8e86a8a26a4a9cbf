package share

import (
	"math"
	"testing"
)

func TestEstimate(t *testing.T) {
	ts := Instance{Kind: TimeSliced, Guaranteed: true, ComputeMilli: 500}
	mig := Instance{Kind: MIG, Guaranteed: true, ComputeMilli: 142}
	be := Instance{Kind: TimeSliced, ComputeMilli: 500}
	cases := []struct {
		name                   string
		inst                   Instance
		m                      Measured
		achieved, demand, intf float64
	}{
		{"time-sliced below its share gets what it asks", ts, Measured{Busy: 0.3, Clock: 1}, 0.3, 0.3, 0},
		{"time-sliced saturated below its share is starved", ts, Measured{Busy: 0.3, Saturated: true, Clock: 1}, 0.3, 0.5, 0.4},
		{"time-sliced saturated above its share is not", ts, Measured{Busy: 0.7, Saturated: true, Clock: 1}, 0.7, 0.7, 0},
		{"best-effort tenant is owed nothing", be, Measured{Busy: 0.1, Saturated: true, Clock: 1}, 0.1, 0.5, 0},
		{"MIG saturated at full clock gets its slice", mig, Measured{Busy: 1, Saturated: true, Clock: 1}, 0.142, 0.142, 0},
		{"MIG saturated at 80% clock loses 20%", mig, Measured{Busy: 1, Saturated: true, Clock: 0.8}, 0.1136, 0.142, 0.2},
		{"MIG half busy is not starved", mig, Measured{Busy: 0.5, Clock: 0.8}, 0.0568, 0.0568, 0},
		{"a bad clock reading counts as full", ts, Measured{Busy: 0.2, Clock: 0}, 0.2, 0.2, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, d, i := Estimate(c.inst, c.m)
			if math.Abs(a-c.achieved) > 1e-9 || math.Abs(d-c.demand) > 1e-9 || math.Abs(i-c.intf) > 1e-9 {
				t.Errorf("Estimate = %.4f, %.4f, %.4f; want %.4f, %.4f, %.4f", a, d, i, c.achieved, c.demand, c.intf)
			}
		})
	}
}

func TestInterference(t *testing.T) {
	cases := []struct {
		name                       string
		achieved, demand, entitled float64
		want                       float64
	}{
		{"nothing owed", 0.1, 0.5, 0, 0},
		{"nothing wanted", 0, 0, 0.5, 0},
		{"got all it wanted below its share", 0.2, 0.2, 0.5, 0},
		{"starved at its share", 0.3, 0.5, 0.5, 0.4},
		{"demand above share counts the share", 0.25, 0.9, 0.5, 0.5},
		{"more than owed is not negative", 0.6, 0.6, 0.5, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Interference(c.achieved, c.demand, c.entitled); math.Abs(got-c.want) > 1e-9 {
				t.Errorf("Interference(%v, %v, %v) = %v, want %v", c.achieved, c.demand, c.entitled, got, c.want)
			}
		})
	}
}

func TestJain(t *testing.T) {
	cases := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"all equal", []float64{1, 1, 1}, 1},
		{"one has everything", []float64{1, 0, 0, 0}, 0.25},
		{"victim and neighbour", []float64{0.6, 1.25}, 0.8901},
		{"all zero", []float64{0, 0}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Jain(c.xs); math.Abs(got-c.want) > 1e-4 {
				t.Errorf("Jain(%v) = %.4f, want %.4f", c.xs, got, c.want)
			}
		})
	}
	if !math.IsNaN(Jain(nil)) {
		t.Error("Jain of nothing is not NaN")
	}
}

func TestMatchVGPUs(t *testing.T) {
	insts := []Instance{
		{UUID: "by-mdev", MdevUUID: "AAAA-1", TypeID: 1},
		{UUID: "by-vm", VMUUID: "vm-2", TypeID: 1},
		{UUID: "by-type", TypeID: 2},
		{UUID: "ambiguous-1", TypeID: 3},
		{UUID: "ambiguous-2", TypeID: 3},
		{UUID: "not-running", VMUUID: "vm-9", TypeID: 1},
	}
	active := []VGPU{
		{Handle: 10, MdevUUID: "aaaa-1", TypeID: 1},
		{Handle: 11, VMID: "VM-2", TypeID: 1},
		{Handle: 12, TypeID: 2},
		{Handle: 13, TypeID: 3},
		{Handle: 14, TypeID: 3},
	}
	got := matchVGPUs(insts, active)
	want := map[string]uint32{"by-mdev": 10, "by-vm": 11, "by-type": 12}
	if len(got) != len(want) {
		t.Errorf("matched %v, want %v", got, want)
	}
	for k, h := range want {
		if got[k].Handle != h {
			t.Errorf("%s matched handle %d, want %d", k, got[k].Handle, h)
		}
	}
}

func TestTenantShares(t *testing.T) {
	tenants := []Tenant{{Name: "acme", Guaranteed: true}, {Name: "idle"}}
	shares := []InstanceShare{
		{UUID: "a1", Tenant: "acme", Active: true, Entitled: 0.5, Achieved: 0.3, Demand: 0.5, Interference: 0.4},
		{UUID: "a2", Tenant: "acme", Active: true, Entitled: 0.25, Achieved: 0.25, Demand: 0.25},
		{UUID: "a3", Tenant: "acme", Entitled: 0.25},
	}
	got := tenantShares(tenants, shares)
	if len(got) != 2 {
		t.Fatalf("%d tenants, want 2", len(got))
	}
	a := got[0]
	if a.Tenant != "acme" || a.Instances != 3 || math.Abs(a.Entitled-0.75) > 1e-9 || math.Abs(a.Achieved-0.55) > 1e-9 ||
		a.Worst != 0.4 || a.WorstInstance != "a1" {
		t.Errorf("acme: %+v", a)
	}
	if i := got[1]; i.Tenant != "idle" || i.Instances != 0 || i.WorstInstance != "" {
		t.Errorf("idle tenant: %+v", i)
	}
}
