package directory_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A node meeting many sessions it does not know yet — a namespace served
// by hundreds of workers, on its first placement — reads them in
// pipelines below rueidis's BlockingPipeline (2,000 commands). A longer
// pipeline goes over a second, pooled connection: the tracked lease reads
// on it register their keys there, and the node watches only its main
// connection for a close that loses invalidations, so a session
// deregistered after such a close stayed known to the node until its
// known lease ran out (R-LS-2, R-PL-1). Here 800 sessions (2,400
// commands on one server) are resolved by a fresh node, which must not
// open a connection for them.
func TestRedisResolvesManySessionsOnItsConnection_RLS2_RPL1(t *testing.T) {
	srv := redistest.StartServer(t)
	ctx := ctxT(t)
	a := openNode(t, srv.URL(), "many", 10*time.Second)
	now := warmRedis(t, a, time.Now())
	for i := range 800 {
		register(t, a, "w"+strconv.Itoa(i), 1000, now)
	}
	b := openNode(t, srv.URL(), "many", 10*time.Second) // connected: it read the era
	before := infoInt(t, srv, "clients", "connected_clients")
	route, err := b.Place(ctx, &directory.PlaceRequest{NS: "/c", ID: "first", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if route.Owner == nil || !strings.HasPrefix(route.Owner.ClientID, "w") {
		t.Fatalf("unexpected placement; got %+v; want one of the 800 workers", route)
	}
	if after := infoInt(t, srv, "clients", "connected_clients"); after != before {
		t.Fatalf("unexpected connections to Redis after resolving 800 sessions; got %d; want %d (no second connection)", after, before)
	}
}
