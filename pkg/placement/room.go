package placement

// VGPURoom is how many more vGPUs of type t the host takes now (0 when it
// is unavailable, locked to another type, or full).
func VGPURoom(h VGPUHost, t string) int { return vgpuRoom(&h, t) }
