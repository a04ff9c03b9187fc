package proxy

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// A new placement whose worker cannot be dialed for a moment — a dial or
// TLS handshake past the dial timeout while the worker stalls, a full
// accept backlog — is not moved off it: the row was visible from the
// claim on, and a request for the same id on a connection already open
// may have activated it there; moved, the id ran on two workers. Only a
// refused connection (nothing listens) moves it (R-PL-1, R-DP-4).
func TestDialFailureOtherThanRefusedKeepsPlacement_RPL1_RDP4(t *testing.T) {
	for _, tc := range []struct {
		name  string
		err   error
		moves bool
	}{
		{"timeout", os.ErrDeadlineExceeded, false},
		{"refused", syscall.ECONNREFUSED, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, nil)
			rg.warm()
			a, b := newStandin(t, "a"), newStandin(t, "b")
			rg.add(a, 1000, "/counters")
			rg.add(b, 1, "/counters")
			if res, body := rg.get("/counters/warm/value", nil); res.StatusCode != 200 || decodeSeen(t, body).Worker != "a" {
				t.Fatalf("unexpected warm-up reply; got %d %s", res.StatusCode, body)
			}
			route, ok := rg.store.Lookup([]byte("/counters"), []byte("warm"), rg.now())
			if !ok {
				t.Fatal("no route for warm")
			}
			pool := route.Owner.Ext().(*ownerState).up.pool
			// The warm-up's connection is busy with a slow request, so the
			// next one dials; while that dial fails, the slow one ends and
			// a second request for the new id rides its connection to a.
			release, entered := make(chan struct{}), make(chan struct{})
			a.route("/slow", func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				<-release
				_, _ = w.Write([]byte("slow"))
			})
			var mu sync.Mutex
			served := map[string]bool{}
			for _, s := range []*standin{a, b} {
				s.route("/who", func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					served[s.name] = true
					mu.Unlock()
					_, _ = w.Write([]byte(s.name))
				})
			}
			realDial := pool.dial
			var once atomic.Bool
			pool.dial = func(addr string) (net.Conn, error) {
				if !once.CompareAndSwap(false, true) {
					return realDial(addr)
				}
				close(release)
				waitUntil(t, "the pooled connection back", func() bool {
					pool.mu.Lock()
					defer pool.mu.Unlock()
					return len(pool.idle) == 1
				})
				if res, body := rg.get("/counters/alice/who", nil); res.StatusCode != 200 || body != "a" {
					t.Errorf("unexpected reply to the concurrent request; got %d %s; want a's", res.StatusCode, body)
				}
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: tc.err}
			}
			go func() { _, _ = rg.get("/counters/warm/slow", nil) }()
			select {
			case <-entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the slow request never reached a")
			}
			res, body := rg.get("/counters/alice/who", nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.moves && (res.StatusCode != 200 || body != "b"):
				t.Fatalf("unexpected answer after a refused connection; got %d %s; want b's (the id moved)", res.StatusCode, body)
			case !tc.moves && (res.StatusCode != 502 || served["b"]):
				t.Fatalf("unexpected answer after a dial %s; got %d %s, served %v; want 502 and alice on a alone", tc.name, res.StatusCode, body, served)
			}
		})
	}
}

// hookStore runs after once, after the first Release: moveOff's release
// of a refused placement, the window in which another node may claim the
// id.
type hookStore struct {
	*directory.Memory
	once  sync.Once
	after func()
}

func (s *hookStore) Release(ctx context.Context, req *directory.ReleaseRequest, now time.Time) (bool, error) {
	ok, err := s.Memory.Release(ctx, req, now)
	s.once.Do(s.after)
	return ok, err
}

// pickSession ranks one session first.
type pickSession string

func (p pickSession) Rank(dst []int, cands []directory.Candidate, _ *directory.PickInput) []int {
	for i := range cands {
		if cands[i].SessionID == string(p) {
			return append(dst, i)
		}
	}
	return append(dst, 0)
}

// After a refusal the retry's placement excludes the refuser only from a
// new placement: a live row another node claimed on it since — its lease
// healthy again, the same rendezvous pick — is resolved to, not replaced;
// replaced, the other node's request ran the id there and this one on
// another worker (R-PL-1, R-PL-6).
func TestRetryAfterRefusalKeepsNewerLivePlacement_RPL1_RPL6(t *testing.T) {
	hs := &hookStore{}
	rg := newRig(t, func(o *Options) {
		hs.Memory = o.Store.(*directory.Memory)
		o.Store = hs
	})
	rg.warm()
	a, b := newStandin(t, "a"), newStandin(t, "b")
	var refusedOnce atomic.Bool
	a.route("/value", func(w http.ResponseWriter, r *http.Request) {
		if refusedOnce.CompareAndSwap(false, true) {
			refuseActivation(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"worker":"a"}`))
	})
	rg.add(a, 1000, "/counters")
	rg.add(b, 1, "/counters")
	var other directory.Route
	hs.after = func() {
		r, err := hs.Memory.Place(context.Background(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now(),
			Policy: pickSession(a.session.Load().(string))})
		if err != nil || !r.Placed || r.Owner.SessionID != a.session.Load().(string) {
			t.Errorf("unexpected claim of the other node; got %+v, %v; want a new placement on a", r, err)
		}
		other = r
	}
	res, body := rg.get("/counters/alice/value", nil)
	if res.StatusCode != 200 || decodeSeen(t, body).Worker != "a" {
		t.Fatalf("unexpected answer; got %d %s; want a's, on the other node's placement", res.StatusCode, body)
	}
	p, err := rg.store.Placement(t.Context(), "/counters", "alice", rg.now())
	if err != nil || p.Epoch != other.Epoch || p.SessionID != a.session.Load().(string) {
		t.Fatalf("unexpected placement; got %+v, %v; want the other node's (a at epoch %d) kept", p, err, other.Epoch)
	}
}
