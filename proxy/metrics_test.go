package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a Metrics that keeps every call, for tests of what the data
// plane records.
type recorder struct {
	mu       sync.Mutex
	requests []recorded
	upstream []string
	hits     int
	misses   int
	placed   int
	replaced int
}

type recorded struct {
	ns     string
	routed bool
	status int
}

func (r *recorder) Request(ns []byte, status int, _ time.Duration) {
	r.mu.Lock()
	r.requests = append(r.requests, recorded{string(ns), ns != nil, status})
	r.mu.Unlock()
}

func (r *recorder) UpstreamError(kind string) {
	r.mu.Lock()
	r.upstream = append(r.upstream, kind)
	r.mu.Unlock()
}

func (r *recorder) Resolve(hit bool) {
	r.mu.Lock()
	if hit {
		r.hits++
	} else {
		r.misses++
	}
	r.mu.Unlock()
}

func (r *recorder) Placement(replaced bool) {
	r.mu.Lock()
	if replaced {
		r.replaced++
	} else {
		r.placed++
	}
	r.mu.Unlock()
}

func (r *recorder) requestsSeen() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]recorded(nil), r.requests...)
}

// A relayed WebSocket counts as one request with its 101, status class
// 1xx, under its namespace (pinboard_proxy_requests_total).
func TestWebSocketRequestCountedAs101_RDP2(t *testing.T) {
	var m recorder
	rg, w := newRigWorker(t, func(o *Options) { o.Metrics = &m })
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		if conn, _, ok := accept101(rw); ok {
			time.Sleep(100 * time.Millisecond)
			conn.Close()
		}
	})
	c, br := rg.dialUpgrade("/counters/alice/ws", "")
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer; got %q, %v; want a 101", line, err)
	}
	_, _ = io.Copy(io.Discard, br)
	c.Close()
	waitUntil(t, "the relay's end", func() bool { return rg.p.OpenWebSockets() == 0 })
	got := m.requestsSeen()
	want := []recorded{{"/counters", true, 101}}
	if len(got) != 1 || got[0] != want[0] {
		t.Fatalf("unexpected requests recorded; got %v; want %v", got, want)
	}
}
