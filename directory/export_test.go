package directory

import "context"

// MemoryQueues exposes the number of control queues to tests.
func MemoryQueues(m *Memory) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queues)
}

// Revalidate runs the era and connection check once, as the periodic
// check would.
func (r *Redis) Revalidate(ctx context.Context) error { return r.revalidate(ctx) }
