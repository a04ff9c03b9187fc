package registry

import (
	"testing"
)

// BenchmarkHeartbeat is one heartbeat end to end in process: auth, body
// decode, session read, challenge probe over loopback, renewal, ack.
func BenchmarkHeartbeat(b *testing.B) {
	h := newHarness(b)
	session := h.register(nil)
	bodies := make([]string, 256)
	for i := range bodies {
		bodies[i] = h.beatBody(session, nil)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := h.post("/registry/heartbeat", workerToken, bodies[i%len(bodies)])
		if res.status != 200 {
			b.Fatalf("unexpected reply %d %s", res.status, res.body)
		}
	}
}
