package workload

import (
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What the model reports as a driver would: the scheduler log, utilization
// samples, power, energy, clocks and clock event reasons.

// Clock event reasons the model raises, in the order of ReasonName.
const (
	reasonIdle     = 0 // ClocksEventReasonGpuIdle
	reasonPowerCap = 1 // ClocksEventReasonSwPowerCap
	nReasons       = 2
)

var reasonBits = [nReasons]uint64{nvml.ClocksEventReasonGpuIdle, nvml.ClocksEventReasonSwPowerCap}

// bucketNs is the utilization sampling period; samplesKept how many are kept.
const (
	bucketNs    = int64(100 * time.Millisecond)
	samplesKept = 20
	logSize     = len(nvml.VgpuSchedulerLog{}.LogEntries)
)

type utilSample struct {
	ts      uint64 // µs
	sm, mem uint32 // percent
}

type gpuBucket struct {
	t         int64
	busy, mem float64 // fractions of the bucket
	energyMJ  float64 // at the bucket's end
}

// schedLog is the driver's ring of the last 200 scheduler entries.
type schedLog struct {
	entries [logSize]nvml.VgpuSchedulerLogEntry
	head    int // index of the oldest entry
	n       int
	total   uint64
}

func (l *schedLog) add(e nvml.VgpuSchedulerLogEntry) {
	if l.n < logSize {
		l.entries[(l.head+l.n)%logSize] = e
		l.n++
	} else {
		l.entries[l.head] = e
		l.head = (l.head + 1) % logSize
	}
	l.total++
}

// Utilization buckets.

func (r *GPURun) nextBucket() int64 { return r.bucketStart + bucketNs }

func (r *GPURun) flushBuckets() {
	for r.t >= r.bucketStart+bucketNs {
		end := r.bucketStart + bucketNs
		r.buckets = append(r.buckets, gpuBucket{t: end, busy: r.bBusy / float64(bucketNs), mem: r.bMem / float64(bucketNs), energyMJ: r.energyMJ})
		if len(r.buckets) > samplesKept {
			r.buckets = r.buckets[len(r.buckets)-samplesKept:]
		}
		for _, x := range r.order {
			sm := uint32(math.Round(100 * x.bucketRun / float64(bucketNs)))
			x.samples = append(x.samples, utilSample{ts: uint64(end / 1000), sm: sm, mem: uint32(math.Round(float64(sm) * memPerSM))})
			if len(x.samples) > samplesKept {
				x.samples = x.samples[len(x.samples)-samplesKept:]
			}
			x.bucketRun = 0
		}
		r.bBusy, r.bMem = 0, 0
		r.bucketStart = end
	}
}

// memPerSM is how busy the memory is per unit of SM activity.
const memPerSM = 0.55

// account adds dt of GPU activity to the power, clock and utilization
// counters: busy is the fraction of the GPU busy, watts the draw.
func (r *GPURun) account(dt float64, busy, watts float64, throttled bool) {
	r.powerW = watts
	r.energyMJ += watts * dt / 1e6
	r.busy += busy * dt
	r.memBusy += busy * memPerSM * dt
	r.bBusy += busy * dt
	r.bMem += busy * memPerSM * dt
	r.reasons = 0
	if throttled {
		r.reasons |= nvml.ClocksEventReasonSwPowerCap
		r.throttle[reasonPowerCap] += dt
	}
	if busy == 0 {
		r.reasons |= nvml.ClocksEventReasonGpuIdle
		r.throttle[reasonIdle] += dt
	}
}

// Time is the time the model has reached, in ns since the Unix epoch.
func (r *GPURun) Time() int64 { return r.t }

// SchedulerLog copies the scheduler log, oldest entry first, into dst and
// returns how many entries it copied: the driver's ring holds the last
// len(nvml.VgpuSchedulerLog{}.LogEntries).
func (r *GPURun) SchedulerLog(dst []nvml.VgpuSchedulerLogEntry) int {
	n := min(r.log.n, len(dst))
	for i := 0; i < n; i++ {
		dst[i] = r.log.entries[(r.log.head+i)%logSize]
	}
	return n
}

// Sample is one utilization sample of a vGPU: its SM and memory activity,
// in percent, over the 100 ms that end at TimeUs (µs since the Unix epoch).
type Sample struct {
	Handle  uint32
	TimeUs  uint64
	SM, Mem uint32
}

// Samples returns the running instances' utilization samples newer than
// after (µs), instance by instance in handle order, oldest first.
func (r *GPURun) Samples(after uint64) []Sample {
	var out []Sample
	for _, x := range r.order {
		for _, s := range x.samples {
			if s.ts <= after {
				continue
			}
			out = append(out, Sample{Handle: x.handle, TimeUs: s.ts, SM: s.sm, Mem: s.mem})
		}
	}
	return out
}

// LastSecond averages the GPU's busy and memory-busy fractions and its
// power over the last second; ok is false before the first sample (watts
// is then the draw now).
func (r *GPURun) LastSecond() (busy, mem, watts float64, ok bool) {
	n := len(r.buckets)
	if n == 0 {
		return 0, 0, r.powerW, false
	}
	k := min(n, int(int64(1e9)/bucketNs))
	for _, b := range r.buckets[n-k:] {
		busy += b.busy
		mem += b.mem
	}
	watts = r.powerW
	if n > k {
		first, last := r.buckets[n-k-1], r.buckets[n-1]
		watts = (last.energyMJ - first.energyMJ) / 1e3 / (float64(last.t-first.t) / 1e9)
	}
	return busy / float64(k), mem / float64(k), watts, true
}

// EnergyMJ is the energy drawn since the model started, in mJ.
func (r *GPURun) EnergyMJ() float64 { return r.energyMJ }

// Reasons is the bitmask of the clock event reasons raised now
// (nvml.ClocksEventReason*).
func (r *GPURun) Reasons() uint64 { return r.reasons }

// ClockFactor is the SM clock now as a fraction of the maximum.
func (r *GPURun) ClockFactor() float64 { return r.cf }

// Activity is the cumulative busy and DRAM-busy time, in ns, of the whole
// GPU (gi < 0) or of one GPU instance (0 for one that never ran), as GPM
// counts them.
func (r *GPURun) Activity(gi int) (busy, dram float64) {
	if gi < 0 {
		return r.busy, r.memBusy
	}
	if x := r.gis[gi]; x != nil {
		return x.busy, x.dram
	}
	return 0, 0
}
