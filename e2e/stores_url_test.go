package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// TestRedisURLForms_RSRV3: the REDIS_URL forms beyond redis:// work in the
// binary against real servers, with a real worker routed through them:
// rediss:// trusting a private CA through SSL_CERT_FILE (Go's system-root
// override, the counterpart of Node's NODE_EXTRA_CA_CERTS), and
// redis+sentinel:// finding its master through a sentinel.
func TestRedisURLForms_RSRV3(t *testing.T) {
	requireSuite(t)
	cases := []struct {
		name  string
		start func(t *testing.T) (env []string, master *redistest.Server)
	}{
		{"rediss", func(t *testing.T) ([]string, *redistest.Server) {
			srv := redistest.StartTLSServer(t)
			return []string{"REDIS_URL=" + srv.TLSURL(), "SSL_CERT_FILE=" + srv.CAFile}, srv
		}},
		{"sentinel", func(t *testing.T) ([]string, *redistest.Server) {
			srv := redistest.StartServer(t)
			sent := redistest.StartSentinel(t, srv, "pinboard-master")
			return []string{"REDIS_URL=" + sent.URL()}, srv
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			env, master := tc.start(t)
			f := StartWarmFleet(t, ctx, FleetOptions{Workers: []string{"w1"}, Headroom: sharedHeadroom,
				LeaseTTL: 3 * time.Second, PinboardEnv: env})
			r, err := do(ctx, http.MethodGet, f.Pinboard.URL+"/counters/alice/value", nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"worker":"w1"`) {
				t.Fatalf("unexpected reply through %s; got %s", tc.name, r)
			}
			// The directory is in that Redis, not in memory.
			n, err := master.Do("DBSIZE")
			if err != nil {
				t.Fatal(err)
			}
			if k, _ := strconv.Atoi(strings.TrimSpace(n)); k == 0 {
				t.Fatalf("unexpected empty Redis behind %s; got DBSIZE %q", tc.name, n)
			}
		})
	}
}
