package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// PINBOARD_BASE_PATH=/pb%C3%B8 and a worker given the same URL with the
// escape in lower case (equivalent, RFC 3986 section 6.2.2.1): httpx
// (RegistrationClient, _ClusterTransport) sends the escape as written,
// and the node matches it. Before, it compared byte for byte: every
// request 404, the worker never registered (R-SRV-4).
func TestBasePathLowerCaseEscapes_RSRV4(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pb := StartPinboard(t, PinboardOptions{BasePath: "/pb%C3%B8"})
	lower := strings.TrimSuffix(pb.URL, "%C3%B8") + "%c3%b8"
	if r, err := do(ctx, http.MethodGet, lower+"/registry/health", pb.operator(), nil); err != nil || r.Status != http.StatusOK {
		t.Errorf("GET %s/registry/health: got %s (err %v); want 200", lower, r, err)
	}
	w := StartWorker(t, pb, WorkerOptions{Name: "w1", Headroom: 100, Env: []string{"PINBOARD_URL=" + lower}})
	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	if _, err := w.WaitRegistered(rctx); err != nil {
		t.Fatalf("worker given PINBOARD_URL=%s never registered: %v\n%s", lower, err, w.Output())
	}
}
