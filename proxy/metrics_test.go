package proxy

import (
	"io"
	"net"
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
	connects int
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

func (r *recorder) UpstreamConnect() {
	r.mu.Lock()
	r.connects++
	r.mu.Unlock()
}

// connectsSeen returns how many worker connections were opened.
func (r *recorder) connectsSeen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.connects
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

// A request the worker's connection fails to take (it reset the connection
// while the body went out) counts as kind "write", not "read": nothing
// was read from it (pinboard_proxy_upstream_errors_total, R-DP-4).
func TestWriteFailureCountedAsWrite_RDP4(t *testing.T) {
	var m recorder
	rg := newRig(t, func(o *Options) { o.Metrics = &m; o.SmallBody = 16 << 20 })
	rg.warm()
	ln := rawListener(t, func(c net.Conn) {
		// Take the start of the request, then reset the connection.
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Read(make([]byte, 1024))
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	})
	w := rawWorker("w", ln)
	rg.serveIDs(t, w, "alice")
	req, _ := http.NewRequest("POST", rg.url+"/counters/alice/x", strings.NewReader(strings.Repeat("x", 16<<20)))
	res, body := rg.do(req)
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("unexpected answer; got %d %s; want 502", res.StatusCode, body)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.upstream) != 1 || m.upstream[0] != "write" {
		t.Fatalf("unexpected upstream error kinds; got %q; want [write]", m.upstream)
	}
}

// A worker's refusal of an upgrade cut short (its body never whole) is
// answered 502 "owner unreachable" and counted as kind "read", as the same
// failure on any other request is (pinboard_proxy_upstream_errors_total,
// R-DP-4).
func TestCutUpgradeRefusalCountedAsRead_RDP4(t *testing.T) {
	var m recorder
	rg, w := newRigWorker(t, func(o *Options) { o.Metrics = &m })
	w.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		conn, _, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 10\r\n\r\nabc")
	})
	_, br := rg.dialUpgrade("/counters/alice/ws", "")
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusBadGateway {
		t.Fatalf("unexpected answer; got %v, %v; want 502", res, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.upstream) != 1 || m.upstream[0] != "read" {
		t.Fatalf("unexpected upstream error kinds; got %q; want [read]", m.upstream)
	}
}

// A worker whose streamed answer breaks off — its connection closed or
// reset under a body larger than SmallBody or unsized, an event stream
// included, or its chunked framing malformed — counts one upstream error,
// "read" or "invalid", as the same failure under a small body read whole
// does (it is answered 502 there, TestInvalidAnswerToldApart_RDP4); the
// client sees the body cut. Before, nothing counted it: a worker crashing
// mid-download or mid-stream showed in no metric, its requests as 2xx. A
// stream that its client left or that shutdown ended is no worker's
// failure and counts none (pinboard_proxy_upstream_errors_total, R-DP-2,
// R-DP-4).
func TestBrokenStreamCountedAsUpstreamError_RDP2_RDP4(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 50 * time.Millisecond
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"
	reset := func(c net.Conn) { _ = c.(*net.TCPConn).SetLinger(0) }
	for _, tc := range []struct {
		name   string
		answer func(c net.Conn)
		req    string
		client func(rg *rig, c net.Conn)
		want   []string
	}{
		{"download cut", func(c net.Conn) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", nil, []string{"read"}},
		{"unsized download reset", func(c net.Conn) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
			time.Sleep(50 * time.Millisecond)
			reset(c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", nil, []string{"read"}},
		{"event stream reset", func(c net.Conn) {
			_, _ = io.WriteString(c, sse)
			time.Sleep(50 * time.Millisecond)
			reset(c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", nil, []string{"read"}},
		{"event stream to HTTP/1.0 cut", func(c net.Conn) {
			_, _ = io.WriteString(c, sse)
		}, "GET /counters/alice/x HTTP/1.0\r\nHost: x\r\n\r\n", nil, []string{"read"}},
		{"event stream malformed chunk", func(c net.Conn) {
			_, _ = io.WriteString(c, sse+"zz\r\n")
			time.Sleep(time.Second)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", nil, []string{"invalid"}},
		{"client leaves idle stream", func(c net.Conn) {
			_, _ = io.WriteString(c, sse)
			_, _ = io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", func(rg *rig, c net.Conn) {
			time.Sleep(100 * time.Millisecond)
			_ = c.Close()
		}, nil},
		{"client leaves idle download", func(c net.Conn) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
			_, _ = io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", func(rg *rig, c net.Conn) {
			time.Sleep(100 * time.Millisecond)
			_ = c.Close()
		}, nil},
		{"shutdown ends streams", func(c net.Conn) {
			_, _ = io.WriteString(c, sse)
			_, _ = io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", func(rg *rig, c net.Conn) {
			waitUntil(t, "the stream", func() bool { return rg.p.OpenStreams() == 1 })
			rg.p.CloseStreams()
		}, nil},
		{"shutdown cuts a download", func(c net.Conn) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nabc")
			_, _ = io.Copy(io.Discard, c)
		}, "GET /counters/alice/x HTTP/1.1\r\nHost: x\r\n\r\n", func(rg *rig, c net.Conn) {
			waitUntil(t, "the stream", func() bool { return rg.p.OpenStreams() == 1 })
			rg.p.CloseStreams()
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m recorder
			rg := newRig(t, func(o *Options) { o.Metrics = &m })
			rg.warm()
			w, _ := rawRequestWorkerNoDrain(t, func(c net.Conn, r *http.Request) bool {
				tc.answer(c)
				return false
			})
			rg.serveIDs(t, w, "alice")
			c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, tc.req)
			if tc.client != nil {
				tc.client(rg, c)
			} else {
				_, _ = io.Copy(io.Discard, c)
			}
			waitUntil(t, "the stream's end", func() bool { return rg.p.OpenStreams() == 0 && len(m.requestsSeen()) == 1 })
			m.mu.Lock()
			defer m.mu.Unlock()
			if len(m.upstream) != len(tc.want) || len(tc.want) > 0 && m.upstream[0] != tc.want[0] {
				t.Fatalf("unexpected upstream error kinds; got %q; want %q", m.upstream, tc.want)
			}
		})
	}
}
