package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// pinboard under a base path (PINBOARD_BASE_PATH, R-SRV-4) with the real
// worker given that path in its pinboard URL, with a trailing slash: pinned
// strips it (RegistrationClient, Cluster: pinboard_url.rstrip("/")) and
// joins its paths under it — /pb/registry/register, heartbeat, release,
// deregister, and an instance's cluster calls to /pb/{ns}/{id}/…. So the
// worker registers and heartbeats (R-REG-1, R-REG-2), a client request and
// an attested cluster call reach it (R-DP-1, R-TR-6), an idle instance's
// release frees its placement (R-REG-3), and a plain stop deregisters
// (R-REG-3); outside the base path
// nothing answers but 404. No other test runs the real worker under a
// base path.
func TestBasePathRealWorker_RSRV4_RREG3_RTR6(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pb := StartPinboard(t, PinboardOptions{BasePath: "/pb"})
	if !strings.HasSuffix(pb.URL, "/pb") {
		t.Fatalf("BUG: the pinboard URL %s does not end with the base path", pb.URL)
	}
	w := StartWorker(t, pb, WorkerOptions{Name: "w1", Headroom: 100,
		Env: []string{"PINBOARD_URL=" + pb.URL + "/", "COUNTERS_IDLE_TIMEOUT=1"}})
	if _, err := w.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	// Through the cold-start quarantine (R-CS-1).
	r, err := getWithRetry(ctx, pb.URL+"/counters/alice/whoami")
	if err != nil || r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"worker":"w1"`) {
		t.Fatalf("unexpected answer for /pb/counters/alice/whoami; got %s (err %v); want 200 from w1", r, err)
	}
	root := strings.TrimSuffix(pb.URL, "/pb")
	if r, err := do(ctx, http.MethodGet, root+"/counters/alice/whoami", nil, nil); err != nil || r.Status != http.StatusNotFound {
		t.Fatalf("unexpected answer outside the base path; got %s (err %v); want 404", r, err)
	}
	// alice calls bob, an id nobody hosts: pinned sends the call to
	// <pinboard_url>/counters/bob/caller with its session's identity.
	status, seen := clusterCall(ctx, t, pb, "alice", "/counters/bob/caller")
	if status != http.StatusOK || seen.Caller == nil || *seen.Caller != "/counters/alice" || seen.Depth == nil || *seen.Depth != 1 {
		t.Fatalf("unexpected cluster call answer; got %d %+v; want 200 from bob attested as called by /counters/alice at depth 1", status, seen)
	}
	// bob, idle past COUNTERS_IDLE_TIMEOUT, is evicted and its release
	// (POST /pb/registry/release) frees its placement.
	if err := awaitFreed(ctx, pb, "/counters", "bob", time.Now().Add(20*time.Second)); err != nil {
		t.Fatalf("unexpected placement: bob's release never freed it: %v\n%s", err, w.Output())
	}
	// A plain stop deregisters (POST /pb/registry/deregister).
	stopDeregistered(ctx, t, w)
	if out := pb.Output(); !strings.Contains(out, "msg=deregister") {
		t.Fatalf("unexpected pinboard log: no deregister\n%s", out)
	}
}
