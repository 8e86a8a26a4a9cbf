package sim

// Workload is the demand model of one vGPU or MIG instance: what fraction of
// a GPU it would use if nothing held it back.
type Workload struct {
	// Kind is idle, steady, bursty or noisy.
	Kind string `json:"kind"`
	// Demand is the steady demand in [0,1] of a whole GPU.
	Demand float64 `json:"demand"`
}
