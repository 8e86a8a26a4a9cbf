package manager

// Decisions is how many placements m's admission searched for (decide):
// tests count them to see a create decide once.
func Decisions(m *Manager) int64 { return m.decisions.Load() }
