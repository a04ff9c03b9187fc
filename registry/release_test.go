package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// slowLink is a TCP relay on 127.0.0.1 that holds every chunk it relays,
// in either direction, for delay: a store one network hop away (another
// zone, a managed Redis), where each round trip costs about 2*delay.
type slowLink struct {
	ln    net.Listener
	delay atomic.Int64 // nanoseconds
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startSlowLink(t testing.TB, upstream string) *slowLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &slowLink{ln: ln}
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, u)
			l.mu.Unlock()
			l.wg.Go(func() { l.relay(u, c) })
			l.wg.Go(func() { l.relay(c, u) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		l.mu.Lock()
		for _, c := range l.conns {
			_ = c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

func (l *slowLink) relay(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := time.Duration(l.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func (l *slowLink) URL() string { return "redis://" + l.ln.Addr().String() }

// A worker's release batch is answered within the worker's HTTP timeout
// (httpx.AsyncClient(timeout=5.0), RegistrationClient._run) and frees
// every row it names, with Redis a millisecond's round trip away (another
// zone, a managed Redis). RegistrationClient._flush_releases sends every
// release queued behind the one in flight as one array, so a drain's idle
// evictions make batches of thousands, up to the 1 MiB body. Each item
// was one round trip to Redis: 9,000 items took 9 s or more, past the
// operation timeout (5 s), so the call answered 503 with part of the batch
// freed; the worker's retries, the same batch from its first item, each
// stopped at the same place, and the rest stayed placed on the worker
// (R-REG-3, R-REG-7).
func TestReleaseBatchOverSlowLinkWithinWorkerTimeout_RREG3(t *testing.T) {
	srv := redistest.StartServer(t)
	link := startSlowLink(t, srv.Addr)
	h := newRedisHarness(t, link.URL(), "slowrel")
	const n = 9_000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("i%05d", i)
	}
	sid := h.register(map[string]any{"instances": map[string][]string{"/counters": ids}})
	// The worker's encoding: httpx's json= (compact separators), each
	// item's epoch the placement epoch as a decimal string.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		p, err := h.ds.Placement(ctx, "/counters", id, h.clock())
		if err != nil || p.SessionID != sid {
			t.Fatalf("unexpected placement of %s; got %+v, %v; want %s", id, p, err, sid)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sessionId":%q,"namespace":"/counters","id":%q,"epoch":"%d"}`, sid, id, p.Epoch)
	}
	b.WriteByte(']')
	if b.Len() > MaxBody {
		t.Fatalf("BUG: the batch is %d bytes, past the body limit", b.Len())
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	link.delay.Store(int64(500 * time.Microsecond))
	res := h.post("/registry/release", workerToken, b.String())
	link.delay.Store(0)
	want := fmt.Sprintf(`{"released":%d}`, n)
	if res.status != 200 || res.body != want {
		t.Fatalf("unexpected reply; got %d %.200s; want 200 %s", res.status, res.body, want)
	}
	// What keeps the batch inside the worker's timeout is the number of
	// round trips, counted by the redis-server itself, not a stopwatch: a
	// script call per RegisterBatch rows (and a few reads beside them),
	// where a round trip per row was thousands.
	calls := scriptCalls(t, srv)
	if most := (n+directory.RegisterBatch-1)/directory.RegisterBatch + 4; calls > most {
		t.Fatalf("unexpected script calls for a release of %d rows; got %d; want at most %d (one per %d rows)", n, calls, most, directory.RegisterBatch)
	}
	t.Logf("released %d items in %d script calls", n, calls)
	for _, id := range []string{ids[0], ids[n/2], ids[n-1]} {
		if _, err := h.ds.Placement(ctx, "/counters", id, h.clock()); !errors.Is(err, directory.ErrNoPlacement) {
			t.Fatalf("unexpected placement of %s after its release: %v", id, err)
		}
	}
}

// scriptCalls is the number of scripts (EVALSHA, EVAL) srv ran since its
// statistics were last reset (CONFIG RESETSTAT), from INFO commandstats.
func scriptCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	calls, err := srv.CommandCalls()
	if err != nil {
		t.Fatal(err)
	}
	total := int(calls["evalsha"] + calls["eval"])
	if total == 0 {
		t.Fatalf("no script calls in INFO commandstats: %v", calls)
	}
	return total
}

// Every malformed release is refused whole with its own error and frees
// nothing: the body limit (413), JSON that does not parse (400 invalid
// json) and each shape error (400 with the expected shape), byte for
// byte on both stores (R-REG-3, R-REG-7).
func TestReleaseBodyErrorsFreeNothing_RREG3_RREG7(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		sid := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := h.ds.Placement(ctx, "/counters", "alice", h.clock())
		if err != nil || p.SessionID != sid {
			t.Fatalf("unexpected placement of alice; got %+v, %v; want %s", p, err, sid)
		}
		item := fmt.Sprintf(`{"sessionId":%q,"namespace":"/counters","id":"alice","epoch":"%d"}`, sid, p.Epoch)
		big := "[" + item + strings.Repeat(" ", MaxBody) + "]"
		const shape = `{"error":"expected [{ sessionId, namespace, id, epoch? }]"}`
		cases := []struct {
			name   string
			body   string
			status int
			want   string
		}{
			{"body too large", big, 413, `{"error":"body too large"}`},
			{"invalid json", "[" + item, 400, `{"error":"invalid json"}`},
			{"null", `null`, 400, shape},
			{"a string", `"alice"`, 400, shape},
			{"missing id", fmt.Sprintf(`[{"sessionId":%q,"namespace":"/counters"}]`, sid), 400, shape},
			{"epoch a number", fmt.Sprintf(`[{"sessionId":%q,"namespace":"/counters","id":"alice","epoch":%d}]`, sid, p.Epoch), 400, shape},
			{"epoch zero", fmt.Sprintf(`[{"sessionId":%q,"namespace":"/counters","id":"alice","epoch":"0"}]`, sid), 400, shape},
			{"good item then a bad one", "[" + item + `,{"sessionId":null,"namespace":"/counters","id":"x"}]`, 400, shape},
		}
		for _, c := range cases {
			res := h.post("/registry/release", workerToken, c.body)
			if res.status != c.status || res.body != c.want {
				t.Errorf("%s: unexpected reply; got %d %s; want %d %s", c.name, res.status, res.body, c.status, c.want)
			}
		}
		if q, err := h.ds.Placement(ctx, "/counters", "alice", h.clock()); err != nil || q == nil || *q != *p {
			t.Fatalf("unexpected placement of alice after refused releases; got %+v, %v; want %+v", q, err, p)
		}
		if res := h.post("/registry/release", workerToken, "["+item+"]"); res.status != 200 || res.body != `{"released":1}` {
			t.Fatalf("unexpected reply to the well-formed release; got %d %s", res.status, res.body)
		}
	})
}

// A lapsed session's rows are left to re-place on the next request
// (R-PL-2): a release naming it frees nothing, whoever sends it — its
// account is unknown once the session is gone, so any worker key could
// otherwise free another account's rows (R-REG-3, R-TR-2).
func TestReleaseOfLapsedSessionFreesNothing_RREG3_RPL2(t *testing.T) {
	forEachStore(t, func(t *testing.T, h *harness) {
		s := h.register(map[string]any{"instances": map[string][]string{"/counters": {"alice"}}})
		h.advance(testTTL)
		body := `[{"sessionId":"` + s + `","namespace":"/counters","id":"alice"}]`
		if res := h.post("/registry/release", otherToken, body); res.status != 200 || res.body != `{"released":0}` {
			t.Fatalf("unexpected release of a lapsed session's row; got %d %s; want 200 {\"released\":0}", res.status, res.body)
		}
		if p, err := h.ds.Placement(t.Context(), "/counters", "alice", h.clock()); err != nil || p.SessionID != s || p.Live {
			t.Fatalf("unexpected placement after the release; got %+v, %v; want the lapsed session's row kept", p, err)
		}
	})
}
