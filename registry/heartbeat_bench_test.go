package registry

import (
	"testing"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// BenchmarkHeartbeat is one heartbeat end to end in process: auth, body
// decode, session read, challenge probe over loopback, renewal, ack.
func BenchmarkHeartbeat(b *testing.B) {
	benchHeartbeat(b, newHarness(b))
}

// BenchmarkHeartbeatRedis is BenchmarkHeartbeat on a Redis directory (a
// redis-server of its own on 127.0.0.1): the session read before the
// probe and the heartbeat script are the round trips a heartbeat costs
// (one once the node knows the session, docs/DIRECTORY.md "Heartbeats").
func BenchmarkHeartbeatRedis(b *testing.B) {
	srv := redistest.StartServer(b)
	benchHeartbeat(b, newRedisHarness(b, srv.URL(), "bench"))
}

func benchHeartbeat(b *testing.B, h *harness) {
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
