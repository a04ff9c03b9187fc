package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// retry503 answers as the reference worker's _retry_503 does: 503, the
// detail as FastAPI encodes it, Retry-After: 1.
func retry503(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write(body)
	}
}

// A worker that cannot take a new activation — its host drains without the
// worker draining (LocalDirectory.wind_down_all), or it is at max_instances,
// which its headroom does not show — answers 503 with a detail and no
// marker. Its placement is released and the id placed once more on
// another worker, as for an in-band refusal; before, the 503 was relayed
// and the row stayed, so the id answered 503 on every retry for as long
// as the condition lasted (R-PL-6, R-PL-3).
func TestDeclinedActivationMoves_RPL6(t *testing.T) {
	for name, detail := range map[string][]byte{"draining host": bodyHostDraining, "at capacity": bodyAtCapacity} {
		t.Run(name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			a, b := newStandin(t, "a"), newStandin(t, "b")
			a.route("/value", retry503(detail))
			rg.add(a, 1000, "/counters")
			rg.add(b, 1, "/counters")
			res, body := rg.get("/counters/alice/value", nil)
			if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
				t.Fatalf("unexpected reply after a decline; got %d %s; want b's answer", res.StatusCode, body)
			}
			if p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now()); p.SessionID != b.session.Load().(string) {
				t.Fatalf("unexpected owner after the decline; got %s; want b's session", p.SessionID)
			}

			// Both decline: one more placement, then the worker's own
			// answer as it is, and no row left for the client's retry.
			b.route("/value", retry503(detail))
			res, body = rg.get("/counters/carol/value", nil)
			if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || body != string(detail) {
				t.Fatalf("unexpected reply after two declines; got %d %v %s; want the worker's 503", res.StatusCode, res.Header, body)
			}
			if _, err := rg.store.Placement(t.Context(), "/counters", "carol", rg.now()); !errors.Is(err, directory.ErrNoPlacement) {
				t.Fatalf("unexpected placement left after the declines: %v", err)
			}

			// A streamed upload cannot be sent again: the answer is relayed,
			// and the placement is released all the same.
			b.route("/value", nil)
			res, body = rg.postEarlyAnswered("/counters/dave/value", 256<<10)
			if res.StatusCode != 503 || body != string(detail) {
				t.Fatalf("unexpected reply to a streamed upload declined; got %d %s; want the worker's 503", res.StatusCode, body)
			}
			if _, err := rg.store.Placement(t.Context(), "/counters", "dave", rg.now()); !errors.Is(err, directory.ErrNoPlacement) {
				t.Fatalf("unexpected placement left after the declined upload: %v", err)
			}
		})
	}
}

// A worker that released an id fences its epoch (pinned _fencing.py
// FenceTable.admit) and answers 503 "released placement epoch; retry" to
// requests carrying it until its release reaches pinboard. The proxy
// releases that placement itself and places the id again: a fresh epoch,
// which the fence admits, on the same worker here (R-PL-1, R-PL-6).
func TestReleasedEpochPlacedAgain_RPL1_RPL6(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	var mu sync.Mutex
	fenced := ""
	w.route("/value", func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		epoch := r.Header.Get("Pinboard-Epoch")
		if fenced == "" {
			fenced = epoch
		}
		stale := epoch == fenced
		mu.Unlock()
		if stale {
			retry503(bodyReleasedEpoch)(rw, r)
			return
		}
		_, _ = rw.Write([]byte("epoch " + epoch))
	})
	before, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()})
	if err != nil {
		t.Fatal(err)
	}
	res, body := rg.get("/counters/alice/value", nil)
	if res.StatusCode != 200 || !strings.HasPrefix(body, "epoch ") {
		t.Fatalf("unexpected reply after the fence; got %d %s; want the worker's answer", res.StatusCode, body)
	}
	after, err := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch <= before.Epoch || body != "epoch "+strconv.FormatUint(after.Epoch, 10) {
		t.Fatalf("unexpected placement after the fence; got epoch %d (answer %q); want one past %d", after.Epoch, body, before.Epoch)
	}
}

// Other 503s of the worker's — "activation queue full", "instance past its
// wind-down deadline", an application's own — are relayed and leave the
// placement where it is.
func TestOther503sLeavePlacement_RPL6(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	placed, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if before.Epoch != placed.Epoch {
		t.Fatalf("unexpected placement; got %+v; want epoch %d", before, placed.Epoch)
	}
	for _, detail := range []string{`{"detail":"activation queue full; retry"}`, `{"detail":"instance past its wind-down deadline; retry"}`, `{"detail":"host draining; retry!"}`} {
		w.route("/value", retry503([]byte(detail)))
		res, body := rg.get("/counters/alice/value", nil)
		if res.StatusCode != 503 || body != detail {
			t.Fatalf("unexpected reply; got %d %s; want the worker's %s", res.StatusCode, body, detail)
		}
		if p, _ := rg.store.Placement(t.Context(), "/counters", "alice", rg.now()); p.Epoch != before.Epoch || p.SessionID != before.SessionID {
			t.Fatalf("unexpected placement after %s; got %+v; want %+v", detail, p, before)
		}
	}
}

// A WebSocket upgrade declined the same way — the worker's resolve
// dependency raises before accept, sent as an HTTP denial response — is
// placed once more elsewhere (R-PL-6, R-DP-2).
func TestDeclinedUpgradeMoves_RPL6_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	a.route("/ws", retry503(bodyAtCapacity))
	b.route("/ws", func(w http.ResponseWriter, r *http.Request) {
		if conn, _, ok := accept101(w); ok {
			conn.Close()
		}
	})
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	if line := rg.upgrade("/counters/alice/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") {
		t.Fatalf("unexpected answer after a decline; got %q; want b's 101", line)
	}
	b.route("/ws", retry503(bodyAtCapacity))
	if line := rg.upgrade("/counters/carol/ws"); !strings.HasPrefix(line, "HTTP/1.1 503") {
		t.Fatalf("unexpected answer after two declines; got %q; want the worker's 503", line)
	}
	if _, err := rg.store.Placement(t.Context(), "/counters", "carol", rg.now()); !errors.Is(err, directory.ErrNoPlacement) {
		t.Fatalf("unexpected placement left after the declines: %v", err)
	}
}

// postEarlyAnswered POSTs size bytes to path through the rig on a raw
// connection, the body written in the background, and returns the answer
// and its body. The answer may come before the body is all up, and the
// connection close right after it: the rest of the body's write then
// fails, and net/http's client returns that write error instead of the
// answer whenever the error is in first (Transport.roundTrip), so a test
// using it failed now and then with "write: broken pipe".
func (rg *rig) postEarlyAnswered(path string, size int) (*http.Response, string) {
	rg.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		rg.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go func() { // ends at the first failed write, at the latest when c closes
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: pb\r\nContent-Length: %d\r\n\r\n", path, size); err == nil {
			_, _ = c.Write(make([]byte, size))
		}
	}()
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		rg.t.Fatalf("cannot read the answer to POST %s: %v", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		rg.t.Fatalf("cannot read the answer's body to POST %s: %v", path, err)
	}
	return res, string(b)
}

// A worker that declined a new activation — full at its max_instances,
// its host draining, its lease unhealthy — is ranked last for new ids on
// this node for declineMemory: headroom does not show why it declined, so
// before, it kept winning new ids first and each one paid a round trip to
// it, a release and a second placement before it moved (R-PL-6, R-PL-3).
// Once the memory passes it is asked again, and it stays a fallback while
// it lasts: with only decliners left, they are still tried.
func TestDeclinerRankedLastForNewIds_RPL6_RPL3(t *testing.T) {
	for name, answer := range map[string]http.HandlerFunc{
		"at capacity":     retry503(bodyAtCapacity),
		"draining host":   retry503(bodyHostDraining),
		"lease unhealthy": refuseActivation,
	} {
		t.Run(name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			a, b := newStandin(t, "a"), newStandin(t, "b")
			a.route("/value", answer)
			rg.add(a, 1000, "/counters")
			rg.add(b, 1, "/counters")
			for i := range 10 {
				res, body := rg.get(fmt.Sprintf("/counters/id-%d/value", i), nil)
				if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
					t.Fatalf("unexpected reply for id-%d; got %d %s; want b's answer", i, res.StatusCode, body)
				}
			}
			if n := a.hits.Load(); n != 1 {
				t.Fatalf("unexpected requests to the decliner for 10 new ids; got %d; want 1", n)
			}

			// The memory passes: a is asked again, and serves.
			a.route("/value", nil)
			rg.advance(declineMemory + time.Millisecond)
			res, body := rg.get("/counters/later/value", nil)
			if res.StatusCode != 200 || decodeSeen(t, body).Worker != "a" {
				t.Fatalf("unexpected reply once the memory passed; got %d %s; want a's answer", res.StatusCode, body)
			}

			// Both decline: each is remembered, and still tried.
			a.route("/value", answer)
			b.route("/value", answer)
			for _, id := range []string{"x", "y"} {
				before := a.hits.Load() + b.hits.Load()
				res, _ := rg.get("/counters/"+id+"/value", nil)
				if res.StatusCode != 503 {
					t.Fatalf("unexpected reply from two decliners for %s; got %d; want 503", id, res.StatusCode)
				}
				if n := a.hits.Load() + b.hits.Load() - before; n != 2 {
					t.Fatalf("unexpected requests to the decliners for %s; got %d; want 2 (one each)", id, n)
				}
			}
		})
	}
}

// A decline for want of room is the answer of one host, one namespace:
// each PinnedHost of a worker has its own max_instances and its own
// wind-down (pinned hosting/host.py PinnedHost, hosting/directory.py
// LocalDirectory.get). The worker that declined stays first for new ids
// of its other namespaces, by headroom and affinity as before; only an
// in-band refusal, for the lease its hosts share, ranks it last in all of
// them. Before, a worker full in one namespace was ranked last in every
// namespace it serves, and with a decline every 3 s it lost its new ids
// elsewhere for as long as that one host stayed full (R-PL-6, R-PL-4,
// R-PL-3).
func TestDeclineRankedLastInItsNamespaceOnly_RPL6_RPL4(t *testing.T) {
	for name, tc := range map[string]struct {
		answer     http.HandlerFunc
		everywhere bool
	}{
		"at capacity":     {retry503(bodyAtCapacity), false},
		"draining host":   {retry503(bodyHostDraining), false},
		"lease unhealthy": {refuseActivation, true},
	} {
		t.Run(name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			a, b := newStandin(t, "a"), newStandin(t, "b")
			a.route("/full", tc.answer)
			rg.add(a, 1000, "/threads", "/counters")
			rg.add(b, 1, "/threads", "/counters")
			res, body := rg.get("/threads/t1/full", nil)
			if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
				t.Fatalf("unexpected reply after a decline; got %d %s; want b's answer", res.StatusCode, body)
			}
			want := "a"
			if tc.everywhere {
				want = "b"
			}
			for i := range 5 {
				res, body := rg.get(fmt.Sprintf("/counters/c%d/value", i), nil)
				if res.StatusCode != 200 || decodeSeen(t, body).Worker != want {
					t.Fatalf("unexpected owner of a new id in the other namespace; got %d %s; want %s's answer", res.StatusCode, body, want)
				}
			}
			// In its own namespace the decliner is still ranked last.
			res, body = rg.get("/threads/t2/value", nil)
			if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" {
				t.Fatalf("unexpected owner of a new id in the declining namespace; got %d %s; want b's answer", res.StatusCode, body)
			}
		})
	}
}

// A decline is placed again at the time it came back, not at the time the
// request was first resolved: a worker whose lease lapsed while the
// declining worker answered is dead (R-LS-2) and takes no new id. Before,
// the re-placement checked leases at the earlier time and put the id on
// the dead worker (R-PL-1, R-PL-6).
func TestDeclineReplacedAtAnswerTime_RPL1_RPL6(t *testing.T) {
	rg := newRig(t, nil) // 10 s leases
	rg.warm()
	a, b, c := newStandin(t, "a"), newStandin(t, "b"), newStandin(t, "c")
	a.route("/value", func(w http.ResponseWriter, r *http.Request) {
		rg.advance(6 * time.Second) // b's lease lapses meanwhile
		retry503(bodyAtCapacity)(w, r)
	})
	rg.add(a, 1000, "/counters")
	// alice is on a, which has not activated it yet.
	if r, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()}); err != nil || !r.Placed {
		t.Fatalf("cannot place alice on a: %+v, %v", r, err)
	}
	rg.add(b, 500, "/counters")
	rg.add(c, 1, "/counters")
	rg.advance(5 * time.Second)
	if _, err := rg.store.Heartbeat(t.Context(), &directory.Beat{SessionID: c.session.Load().(string), Sub: "p:worker", Headroom: 1}, rg.now()); err != nil {
		t.Fatal(err)
	}
	res, body := rg.get("/counters/alice/value", nil)
	if res.StatusCode != 200 || decodeSeen(t, body).Worker != "c" {
		t.Fatalf("unexpected reply after the decline; got %d %s; want c's answer (b's lease lapsed)", res.StatusCode, body)
	}
	p, err := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if err != nil || !p.Live || p.SessionID != c.session.Load().(string) {
		t.Fatalf("unexpected placement after the decline; got %+v, %v; want c's, live", p, err)
	}
}

// A new placement on a worker whose advertise URL refuses connections — it
// died, and its lease still runs — is released and made on another worker
// at once: nothing reached the dead one (no activation, a streamed body
// unread), and before, every new id it won answered 502 "owner
// unreachable" until its lease lapsed. The dead worker is then ranked last
// for new ids (the decline memory). An id placed on it before keeps its
// owner until the lease decides (R-LS-2, R-PL-1, R-DP-4).
func TestNewPlacementOnDeadWorkerMoves_RLS2_RPL1(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	b.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
		if conn, _, ok := accept101(rw); ok {
			conn.Close()
		}
	})
	if res, body := rg.get("/counters/bob/value", nil); res.StatusCode != 200 || decodeSeen(t, body).Worker != "a" {
		t.Fatalf("unexpected reply while a lives; got %d %s; want a's answer", res.StatusCode, body)
	}
	a.srv.Close()
	owner := func(id string) string {
		p, err := rg.store.Placement(t.Context(), "/counters", id, rg.now())
		if err != nil {
			return err.Error()
		}
		return p.SessionID
	}
	for _, id := range []string{"alice", "carol"} {
		res, body := rg.get("/counters/"+id+"/value", nil)
		if res.StatusCode != 200 || decodeSeen(t, body).Worker != "b" || owner(id) != b.session.Load().(string) {
			t.Fatalf("unexpected reply for new id %s with a dead; got %d %s, owner %s; want b's answer and row", id, res.StatusCode, body, owner(id))
		}
	}
	// A streamed (chunked) body: nothing of it was read for a.
	req, _ := http.NewRequest("POST", rg.url+"/counters/dave/value", io.MultiReader(strings.NewReader(strings.Repeat("x", 100<<10))))
	if res, body := rg.do(req); res.StatusCode != 200 || decodeSeen(t, body).BodyLen != 100<<10 || owner("dave") != b.session.Load().(string) {
		t.Fatalf("unexpected reply to a streamed upload for a new id with a dead; got %d %s; want b's answer with the whole body", res.StatusCode, body)
	}
	// A WebSocket handshake for a new id.
	if line := rg.upgrade("/counters/erin/ws"); !strings.HasPrefix(line, "HTTP/1.1 101") || owner("erin") != b.session.Load().(string) {
		t.Fatalf("unexpected handshake answer for a new id with a dead; got %q, owner %s; want b's 101", line, owner("erin"))
	}
	// bob was a's before: its lease, not this request, moves it.
	if res, body := rg.get("/counters/bob/value", nil); res.StatusCode != 502 || body != `{"error":"owner unreachable"}` || owner("bob") != a.session.Load().(string) {
		t.Fatalf("unexpected reply for an id the dead worker held; got %d %s, owner %s; want 502 and a's row", res.StatusCode, body, owner("bob"))
	}
}

// A new placement moved off a dead worker (its advertise URL refuses
// connections) onto a second dead one is released there too: one move per
// request, so the client gets 502 "owner unreachable", but its retry finds
// the id free and places it on a live worker, both dead ones ranked last
// (the decline memory). Before, the row stayed on the second dead worker,
// and every retry of that id — a request or a WebSocket handshake — was
// answered 502 until that worker's lease lapsed: two workers gone at once
// (a host with two of them, a deploy) made every new id they won in that
// window unreachable for up to a lease (R-DP-3, R-LS-2, R-PL-1).
func TestNewPlacementOnSecondDeadWorkerReleased_RDP3_RLS2_RPL1(t *testing.T) {
	for _, kind := range []string{"request", "websocket"} {
		t.Run(kind, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			a, b, c := newStandin(t, "a"), newStandin(t, "b"), newStandin(t, "c")
			c.route("/ws", func(rw http.ResponseWriter, r *http.Request) {
				if conn, _, ok := accept101(rw); ok {
					conn.Close()
				}
			})
			rg.add(a, 1e6, "/counters")
			rg.add(b, 1e3, "/counters")
			rg.add(c, 1, "/counters")
			a.srv.Close()
			b.srv.Close()
			owner := func() string {
				p, err := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
				if err != nil {
					return err.Error()
				}
				if !p.Live {
					return "none"
				}
				return map[string]string{a.session.Load().(string): "a", b.session.Load().(string): "b", c.session.Load().(string): "c"}[p.SessionID]
			}
			try := func() (int, string) {
				if kind == "websocket" {
					line := rg.upgrade("/counters/alice/ws")
					code, _ := strconv.Atoi(strings.Fields(line + " x x")[1])
					return code, line
				}
				res, body := rg.get("/counters/alice/value", nil)
				return res.StatusCode, body
			}
			if code, got := try(); code != 502 || owner() == "b" {
				t.Fatalf("unexpected first reply with a and b dead; got %d %s, owner %s; want 502 and b's new row released", code, got, owner())
			}
			want := 200
			if kind == "websocket" {
				want = 101
			}
			if code, got := try(); code != want || owner() != "c" {
				t.Fatalf("unexpected reply to the client's retry; got %d %s, owner %s; want %d from c", code, got, owner(), want)
			}
		})
	}
}
