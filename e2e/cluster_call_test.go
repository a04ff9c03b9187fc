package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// callerSeen is /counters/{id}/caller: the attested calling instance as
// the real worker verified it.
type callerSeen struct {
	Worker string  `json:"worker"`
	ID     string  `json:"id"`
	Caller *string `json:"caller"`
	Depth  *int    `json:"depth"`
}

// clusterCall has the instance /counters/{from} call path through pinned's
// cluster client and returns the callee's answer.
func clusterCall(ctx context.Context, t *testing.T, pb *Pinboard, from, path string) (status int, seen callerSeen) {
	t.Helper()
	r, err := doWithRetry(ctx, http.MethodGet, pb.URL+"/counters/"+from+"/call?path="+url.QueryEscape(path), nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("cannot make %s call %s: %s (err %v)", from, path, r, err)
	}
	var out struct {
		Worker string          `json:"worker"`
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	}
	if err := r.JSON(&out); err != nil {
		t.Fatal(err)
	}
	if out.Status == http.StatusOK {
		if err := json.Unmarshal(out.Body, &seen); err != nil {
			t.Fatalf("cannot decode the callee's answer %s: %v", out.Body, err)
		}
	}
	return out.Status, seen
}

// Attested cluster calls with the real worker (R-TR-6, R-PL-4): an
// instance calling an id it does not host goes through pinboard with its
// session and secret (pinned.pinboard.cluster); pinboard places each new
// id on the caller's own worker — for callers on either worker, though
// the small headroom would otherwise spread them — and the callee's pinned
// verifies an attestation naming the caller. A client forging the cluster
// headers is refused, and a client's own request is attested with no
// caller. On both stores.
func TestAttestedClusterCallPrefersCaller_RTR6_RPL4(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, storeEnv []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		f := StartWarmFleet(t, ctx, FleetOptions{PinboardEnv: storeEnv, Workers: []string{"w1", "w2"}, Headroom: 2})
		pb := f.Pinboard
		// One calling instance on each worker.
		callers := map[string]string{}
		for i := 0; len(callers) < 2; i++ {
			if i == 40 {
				t.Fatalf("unexpected placement: 40 ids never reached both workers (%v)", callers)
			}
			id := "caller-" + strconv.Itoa(i)
			w, r, err := whoami(ctx, pb, id)
			if err != nil {
				t.Fatalf("%v (%s)", err, r)
			}
			if _, ok := callers[w]; !ok {
				callers[w] = id
			}
		}
		for _, w := range []string{"w1", "w2"} {
			from := callers[w]
			for i := range 8 {
				callee := "callee-" + w + "-" + strconv.Itoa(i)
				status, seen := clusterCall(ctx, t, pb, from, "/counters/"+callee+"/caller")
				if status != http.StatusOK {
					t.Fatalf("unexpected answer to %s's cluster call to %s; got %d; want 200", from, callee, status)
				}
				if seen.Worker != w || seen.ID != callee {
					t.Fatalf("unexpected callee for %s's call to a new id; got %v; want %s on %s, the caller's own worker (R-PL-4)", from, seen, callee, w)
				}
				if seen.Caller == nil || *seen.Caller != "/counters/"+from || seen.Depth == nil || *seen.Depth != 1 {
					t.Fatalf("unexpected attested caller at %s; got %v; want /counters/%s at depth 1 (R-TR-6)", callee, seen, from)
				}
				p, code, err := getPlacement(ctx, pb, "/counters", callee)
				if err != nil || code != http.StatusOK || p.ClientID != f.Records[w].ClientID {
					t.Fatalf("unexpected placement of %s; got %d %+v (err %v); want %s's", callee, code, p, err, w)
				}
			}
		}
		// A client's own request carries no caller.
		r, err := doWithRetry(ctx, http.MethodGet, pb.URL+"/counters/"+callers["w1"]+"/caller", nil)
		var direct callerSeen
		if err != nil || r.Status != http.StatusOK || r.JSON(&direct) != nil || direct.Caller != nil {
			t.Fatalf("unexpected answer to a client's request; got %s (err %v); want 200 with no caller", r, err)
		}
		// A client forging the cluster headers: a wrong secret, an
		// unknown session. Neither reaches a worker as an attested call.
		for _, c := range []struct {
			session, want string
		}{
			{f.Records["w1"].SessionID, "invalid caller session secret"},
			{"0123456789abcdef0123456789abcdef", "unknown caller session"},
		} {
			r, err := do(ctx, http.MethodGet, pb.URL+"/counters/forged-callee/caller", http.Header{
				"Pinboard-From":           {"/counters/" + callers["w1"]},
				"Pinboard-Session":        {c.session},
				"Pinboard-Session-Secret": {"guessed"},
			}, nil)
			var eb errorBody
			if err != nil || r.Status != http.StatusForbidden || r.JSON(&eb) != nil || eb.Error != c.want {
				t.Fatalf("unexpected answer to a forged cluster call; got %s (err %v); want 403 {\"error\":%q}", r, err, c.want)
			}
		}
		if _, code, _ := getPlacement(ctx, pb, "/counters", "forged-callee"); code != http.StatusNotFound {
			t.Fatalf("unexpected placement made by a forged cluster call; got %d", code)
		}
		if strings.Contains(pb.Output(), "panic") {
			t.Fatalf("unexpected panic in pinboard's log")
		}
	})
}

func (s callerSeen) String() string {
	b, _ := json.Marshal(s)
	return string(b)
}
