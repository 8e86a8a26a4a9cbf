package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

// busyFleet fills n H100s to about three quarters through Place itself, the
// state the daemon sees in steady operation.
func busyFleet(tb testing.TB, n int, seed uint64) []GPU {
	tb.Helper()
	h := h100Grid()
	fleet := gpus(h, "H100", make([][]Slot, n)...)
	rng := rand.New(rand.NewPCG(seed, 1))
	used, id := 0, 0
	for used < n*h.Slices*3/4 {
		p := h.Profiles[rng.IntN(len(h.Profiles))]
		d, err := Place(fleet, Request{Profile: p.Name})
		if err != nil {
			continue
		}
		for i := range fleet {
			if fleet[i].ID == d.GPU {
				id++
				fleet[i].Used = append(fleet[i].Used, Slot{Start: d.Start, Size: p.Size, ProfileID: p.ID,
					Instance: fmt.Sprint("i", id), Movable: rng.IntN(3) == 0})
			}
		}
		used += p.Size
		if id > 10*n {
			break
		}
	}
	return fleet
}

// BenchmarkPlace8GPUs is one placement decision on a busy 8-GPU H100 fleet;
// the budget is 1 ms.
func BenchmarkPlace8GPUs(b *testing.B) {
	fleet := busyFleet(b, 8, 1)
	h := h100Grid()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_, _ = Place(fleet, Request{Profile: h.Profiles[i%len(h.Profiles)].Name})
		i++
	}
}

// BenchmarkPlaceEmpty8GPUs is the widest search: every start is legal.
func BenchmarkPlaceEmpty8GPUs(b *testing.B) {
	fleet := gpus(h100Grid(), "H100", make([][]Slot, 8)...)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = Place(fleet, Request{Profile: "1g.10gb"})
	}
}

// BenchmarkDefragment8GPUs plans moves for requests refused for
// fragmentation on busy 8-GPU fleets.
func BenchmarkDefragment8GPUs(b *testing.B) {
	h := h100Grid()
	type job struct {
		fleet []GPU
		req   Request
	}
	var jobs []job
	for seed := uint64(1); len(jobs) < 32 && seed < 2000; seed++ {
		fleet := busyFleet(b, 8, seed)
		for _, p := range h.Profiles {
			req := Request{Profile: p.Name}
			if _, err := Place(fleet, req); errors.Is(err, ErrFragmented) {
				jobs = append(jobs, job{fleet, req})
			}
		}
	}
	if len(jobs) == 0 {
		b.Fatal("no fragmented request found")
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		j := jobs[i%len(jobs)]
		_, _, _ = Defragment(j.fleet, j.req)
		i++
	}
}

func BenchmarkPlaceVGPU8GPUs(b *testing.B) {
	hosts := make([]VGPUHost, 8)
	for i := range hosts {
		hosts[i] = host(fmt.Sprint("G", i), i%2 == 0, nil)
	}
	hosts[1].Current = map[string]int{"H100XM-20C": 2}
	hosts[2].Current = map[string]int{"H100XM-40C": 1, "H100XM-8C": 2}
	wanted := map[string]int{"H100XM-80C": 1, "H100XM-40C": 3, "H100XM-20C": 4, "H100XM-8C": 10}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = PlaceVGPU(hosts, VGPURequest{Type: "H100XM-8C", Wanted: wanted})
	}
}
