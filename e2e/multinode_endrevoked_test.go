package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/tools/redistest"
)

// An event stream relayed by one node ends when its worker's session is
// ended through another node (docs/PROTOCOL.md, "Streams of an ended
// session end"; R-LS-2, R-DP-2, R-SRV-1): the node that relays it learns
// of the ended session from Redis alone. The worker is frozen (SIGSTOP)
// so that it cannot end the stream itself, and its session is
// deregistered through node 0 long before its lease would run out; the
// stream goes through node 1, which must end it well before that lease
// runs out (any later, and the lease ending there would explain it).
func TestMultiNodeEventStreamOfSessionEndedElsewhereEnds_RLS2_RDP2(t *testing.T) {
	requireSuite(t)
	srv := redistest.StartServer(t)
	const ttl = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := StartMultiFleet(t, ctx, MultiFleetOptions{
		RedisURL: srv.URL(), Nodes: 2, Workers: []string{"w1", "w2"},
		Headroom: sharedHeadroom, LeaseTTL: ttl,
	})
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := f.Nodes[0], f.Nodes[1]
	type event struct {
		N      int    `json:"n"`
		Worker string `json:"worker"`
	}
	res := openEventStream(ctx, t, b.URL+"/tickers/elsewhere/events?count=100000&interval=0.2", 500*time.Millisecond)
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first := readEvent[event](t, br)
	victim := f.Worker(first.Worker)
	recs, r, err := a.Workers(ctx)
	if err != nil {
		t.Fatalf("cannot list workers: %v (%s)", err, r)
	}
	var sid string
	for _, rec := range recs {
		if rec.AdvertiseURL == victim.URL {
			sid = rec.SessionID
		}
	}
	if sid == "" {
		t.Fatalf("%s not listed by node 0: %s", victim.Name, r)
	}

	victim.proc.signal(syscall.SIGSTOP)
	defer victim.proc.signal(syscall.SIGCONT)
	floor, err := victim.LeaseFloor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.expectOK(a.postJSON(ctx, "/registry/deregister", map[string]any{"sessionId": sid})); err != nil {
		t.Fatalf("cannot deregister %s through node 0: %v", victim.Name, err)
	}
	deregistered := time.Now()
	type end struct {
		at  time.Time
		err error
	}
	ended := make(chan end, 1)
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				ended <- end{time.Now(), err}
				return
			}
		}
	}()
	var e end
	select {
	case e = <-ended:
	case <-time.After(time.Until(floor)):
		t.Fatalf("the event stream through node 1 still open %v after its session was deregistered through node 0 (its lease runs out at %v)",
			time.Since(deregistered).Round(time.Millisecond), floor.Sub(deregistered).Round(time.Millisecond))
	}
	if e.err != nil {
		t.Fatalf("unexpected end of the event stream; got %v; want a clean end", e.err)
	}
	t.Logf("event stream through node 1 ended %v after the deregistration through node 0", e.at.Sub(deregistered).Round(time.Millisecond))
}

// An event stream relayed by one node from a worker frozen (SIGSTOP)
// ends once the store drops the frozen worker's session, whichever node's
// sweep drops it: the node relaying the stream learns of it from Redis if
// another node swept (R-LS-2, R-DP-2, R-SRV-1). Reconnecting through the
// same node reaches the id's new owner.
func TestMultiNodeFrozenWorkerEventStreamEnds_RLS2_RDP2(t *testing.T) {
	requireSuite(t)
	srv := redistest.StartServer(t)
	const ttl = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := StartMultiFleet(t, ctx, MultiFleetOptions{
		RedisURL: srv.URL(), Nodes: 2, Workers: []string{"w1", "w2"},
		Headroom: sharedHeadroom, LeaseTTL: ttl,
	})
	if err := f.WarmUp(ctx); err != nil {
		t.Fatal(err)
	}
	type event struct {
		N      int    `json:"n"`
		Worker string `json:"worker"`
	}
	b := f.Nodes[1]
	url := b.URL + "/tickers/frozen-elsewhere/events?count=100000&interval=0.2"
	res := openEventStream(ctx, t, url, 500*time.Millisecond)
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	first := readEvent[event](t, br)
	victim := f.Worker(first.Worker)
	victim.proc.signal(syscall.SIGSTOP)
	defer victim.proc.signal(syscall.SIGCONT)
	frozen := time.Now()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("unexpected end of the frozen worker's event stream; got %v; want a clean end", err)
		}
	case <-time.After(2*ttl + 20*time.Second):
		t.Fatalf("the frozen worker's event stream through node 1 still open %v after the freeze (lease %v)", time.Since(frozen).Round(time.Millisecond), ttl)
	}
	t.Logf("event stream through node 1 ended %v after the freeze", time.Since(frozen).Round(time.Millisecond))
	again := openEventStream(ctx, t, url, 500*time.Millisecond)
	defer again.Body.Close()
	if ev := readEvent[event](t, bufio.NewReader(again.Body)); ev.Worker == victim.Name {
		t.Fatalf("unexpected worker after reconnecting; got the frozen %s", ev.Worker)
	}
}
