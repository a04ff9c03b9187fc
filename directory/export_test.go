package directory

// MemoryQueues exposes the number of control queues to tests.
func MemoryQueues(m *Memory) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queues)
}
