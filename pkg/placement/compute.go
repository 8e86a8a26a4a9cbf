package placement

import (
	"fmt"

	"github.com/vgpud/vgpud/pkg/profile"
)

// ComputeSlot is a compute instance inside a GPU instance: Size compute
// slices from Start, of compute-instance profile ProfileID.
type ComputeSlot struct {
	Start, Size, ProfileID int
}

// ComputeGI is a GPU instance that may take a compute instance: its
// compute slices and the compute instances it holds.
type ComputeGI struct {
	// ID identifies the GPU instance to the caller (placement never reads it).
	ID     string
	Slices int
	Used   []ComputeSlot
}

// ComputeDecision is where a compute instance goes.
type ComputeDecision struct {
	GI    string
	Start int
	// Free is how many compute slices the GPU instance has left once the
	// compute instance sits there.
	Free int
}

// ComputeStart returns the start at which a compute instance of profile p
// fits in gi, by the driver's rules for CreateComputeInstanceWithPlacement
// (otherwise INSUFFICIENT_RESOURCES or INVALID_ARGUMENT): a start from
// profile.ComputeInstanceStarts, no overlap with the compute instances
// there, fewer than p.MaxInstances of the profile already. Of the legal
// starts the lowest is taken: the starts are aligned to the profile's
// size, so filling from slice 0 keeps the higher aligned runs whole for
// larger compute instances. ErrNoCapacity when none fits.
func ComputeStart(gi ComputeGI, p profile.ComputeInstanceProfile) (int, error) {
	if p.Slices <= 0 || p.Slices > gi.Slices {
		return 0, fmt.Errorf("a compute instance of %d slices in a GPU instance of %d: %w", p.Slices, gi.Slices, ErrUnknownProfile)
	}
	count, used := 0, 0
	for _, u := range gi.Used {
		if u.ProfileID == p.ID {
			count++
		}
		used += u.Size
	}
	if count >= p.MaxInstances {
		return 0, fmt.Errorf("the GPU instance holds %d compute instances of %d slices, the most it takes: %w", count, p.Slices, ErrNoCapacity)
	}
	for _, s := range profile.ComputeInstanceStarts(gi.Slices, p.Slices) {
		if computeFree(gi.Used, s, p.Slices) {
			return s, nil
		}
	}
	if gi.Slices-used >= p.Slices {
		return 0, fmt.Errorf("%d of %d compute slices are free, but not at a start a %d-slice compute instance may take: %w", gi.Slices-used, gi.Slices, p.Slices, ErrNoCapacity)
	}
	return 0, fmt.Errorf("%d of %d compute slices are free, %d wanted: %w", gi.Slices-used, gi.Slices, p.Slices, ErrNoCapacity)
}

// PlaceCompute picks, among GPU instances that may share, the one for a
// compute instance of profile p: the fullest that still takes it (best
// fit, so the others keep their room), the first listed on a tie.
// ErrNoCapacity when none does.
func PlaceCompute(gis []ComputeGI, p profile.ComputeInstanceProfile) (ComputeDecision, error) {
	best := ComputeDecision{Free: -1}
	for _, gi := range gis {
		start, err := ComputeStart(gi, p)
		if err != nil {
			continue
		}
		free := gi.Slices - p.Slices
		for _, u := range gi.Used {
			free -= u.Size
		}
		if best.Free < 0 || free < best.Free {
			best = ComputeDecision{GI: gi.ID, Start: start, Free: free}
		}
	}
	if best.Free < 0 {
		return best, fmt.Errorf("none of %d GPU instances takes a %d-slice compute instance: %w", len(gis), p.Slices, ErrNoCapacity)
	}
	return best, nil
}

func computeFree(used []ComputeSlot, start, size int) bool {
	for _, u := range used {
		if start < u.Start+u.Size && u.Start < start+size {
			return false
		}
	}
	return true
}
