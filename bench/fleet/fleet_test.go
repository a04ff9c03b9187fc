package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/server"
)

const testToken = "fleet-test-token"

// startPinboard runs a real pinboard node (memory: store) on 127.0.0.1.
func startPinboard(t *testing.T, ttl time.Duration) string {
	return startPinboardAt(t, ttl, "")
}

// startPinboardAt is startPinboard with pinboard mounted under base
// (server.Options.BasePath); the URL it returns has no base path.
func startPinboardAt(t *testing.T, ttl time.Duration, base string) string {
	t.Helper()
	passport := `{"providers":[{"type":"staticToken","id":"pinboard","keys":[{"name":"t","token":{"env":"PINBOARD_TOKEN"},` +
		`"scopes":["pinboard:worker","pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["127.0.0.1"]}}}]}],` +
		`"namespaces":{"*":{"allow":"anonymous"}}}`
	pp, err := attest.ParsePassport([]byte(passport), func(k string) (string, bool) {
		return testToken, k == "PINBOARD_TOKEN"
	})
	if err != nil {
		t.Fatal(err)
	}
	pb, err := server.New(server.Options{Store: directory.NewMemory(ttl, time.Now()), Passport: pp, LeaseTTL: ttl, BasePath: base})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = pb.Serve(ctx, ln, time.Second)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// A fleet pointed at a pinboard under a base path registers there: the
// URL's path prefixes every registry call (R-SRV-4). Before, it was
// dropped, every registration was answered 404 and Register retried
// until its context ended.
func TestFleetUnderBasePath_RSRV4(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pinboard and a fleet on 127.0.0.1")
	}
	pbURL := startPinboardAt(t, time.Second, "/pb")
	f, err := New(Options{PinboardURL: pbURL + "/pb/", Token: testToken, Workers: 1, Listeners: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Register(ctx); err != nil {
		t.Fatalf("unexpected registration error under base path /pb; got %v; want nil", err)
	}
	if w := f.Worker(0); w.Session() == "" {
		t.Fatal("unexpected worker without a session after Register")
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("unexpected timeout waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFleetAgainstPinboard drives two virtual workers through a real
// pinboard: registration with the challenge probe, heartbeats that rotate
// the challenge, attested data-plane traffic (JSON, SSE, WebSocket, large
// bodies both ways), a wind_down control message acked on the next
// heartbeat, and deregistration.
func TestFleetAgainstPinboard(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pinboard and a fleet on 127.0.0.1")
	}
	const ttl = time.Second
	pbURL := startPinboard(t, ttl)
	f, err := New(Options{PinboardURL: pbURL, Token: testToken, Workers: 2, Listeners: 2, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Register(ctx); err != nil {
		t.Fatal(err)
	}
	f.Run(ctx)
	for _, w := range f.Workers() {
		if w.Session() == "" {
			t.Fatalf("unexpected worker %d without a session", w.Index)
		}
	}

	// The first placement starts the cold-start quarantine (R-CS-1).
	pbAddr := strings.TrimPrefix(pbURL, "http://")
	var body string
	eventually(t, 5*ttl, "the quarantine to end", func() bool {
		var code int
		code, body = get(t, pbURL+"/bench/alice/json")
		return code == 200
	})
	var got struct {
		NS, ID string
		Worker int
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.NS != "/bench" || got.ID != "alice" {
		t.Fatalf("unexpected JSON through pinboard; got %s", body)
	}
	owner := f.Worker(got.Worker)

	// Heartbeats flow and rotate the challenge every time.
	c1, _ := owner.Challenge()
	eventually(t, 5*time.Second, "heartbeats", func() bool {
		s := f.Stats().Snapshot(false)
		c2, _ := owner.Challenge()
		return s.ByStatus["200"] >= 4 && c2 != c1
	})
	if s := f.Stats().Snapshot(false); s.Degraded != 0 || s.ByStatus["409"] != 0 || s.ByStatus["transport"] != 0 {
		t.Fatalf("unexpected heartbeat outcomes; got %+v", s)
	}

	// The same route without pinboard's attestation is refused.
	if code, _ := get(t, owner.AdvertiseURL+"bench/alice/json"); code != 403 {
		t.Fatalf("unexpected direct answer without attestation; got %d; want 403", code)
	}

	// A wind_down is delivered, applied and acked, then no longer sent.
	req, _ := http.NewRequest("POST", pbURL+"/registry/wind-down", strings.NewReader(`{"namespace":"/bench","id":"alice","deadline":30}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("unexpected wind-down status; got %d", resp.StatusCode)
	}
	eventually(t, 5*time.Second, "the message and its ack", func() bool {
		s := f.Stats().Snapshot(false)
		return s.Messages >= 1 && s.AcksSent >= 1
	})
	settled := f.Stats().Snapshot(false).Messages
	before := f.Stats().Snapshot(false).ByStatus["200"]
	eventually(t, 5*time.Second, "more heartbeats", func() bool { return f.Stats().Snapshot(false).ByStatus["200"] >= before+5 })
	if s := f.Stats().Snapshot(false); s.Messages != settled {
		t.Fatalf("unexpected redelivery after the ack; got %d messages; want %d", s.Messages, settled)
	}

	// SSE through pinboard: every event arrives, stamped by the worker.
	st, err := bench.OpenSSE(pbAddr, "/bench/alice/sse?n=3&every=20", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st.SetDeadline(time.Now().Add(5 * time.Second))
	for i := 0; i < 3; i++ {
		stamp, seq, err := st.Next()
		if err != nil || seq != i || time.Since(time.Unix(0, stamp)) > 5*time.Second {
			t.Fatalf("unexpected event %d; got seq %d stamp %d err %v", i, seq, stamp, err)
		}
	}
	if _, _, err := st.Next(); err != io.EOF {
		t.Fatalf("unexpected end of stream; got %v; want EOF", err)
	}
	st.Close()

	// WebSocket echo through pinboard.
	ws := &bench.WSTarget{Addr: pbAddr, Size: 100, Path: func(int) (string, []string) { return "/bench/alice/ws", nil }}
	d, err := ws.NewDoer(0)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 5; i++ {
		if err := d.Do(i); err != nil {
			t.Fatalf("unexpected echo failure: %v", err)
		}
	}
	d.Close()

	// Large bodies both ways.
	const size = 8 << 20
	if n, err := bench.Transfer(pbAddr, "/bench/alice/upload", nil, true, size, 20*time.Second); err != nil || n != size {
		t.Fatalf("unexpected upload; got %d, %v", n, err)
	}
	if n, err := bench.Transfer(pbAddr, fmt.Sprintf("/bench/alice/download?size=%d", size), nil, false, 0, 20*time.Second); err != nil || n != size {
		t.Fatalf("unexpected download; got %d, %v", n, err)
	}

	// Churn: a worker leaves (its ids re-place) and another joins. It is
	// off the listing at once, though it answers until its grace ends: a
	// baseline's route taken then must not name it.
	if err := f.Leave(ctx, owner, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, w := range f.Workers() {
		if w == owner {
			t.Fatalf("unexpected listing of worker %d while it leaves", owner.Index)
		}
	}
	joined, err := f.Join(ctx)
	if err != nil || joined.Session() == "" {
		t.Fatalf("unexpected join; got %v", err)
	}
	code, body := get(t, pbURL+"/bench/alice/json")
	if code != 200 || strings.Contains(body, fmt.Sprintf(`"worker":%d}`, owner.Index)) {
		t.Fatalf("unexpected owner after its worker left; got %d %s", code, body)
	}

	// Close deregisters everyone.
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest("GET", pbURL+"/registry/workers", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"workers":[]`) {
		t.Fatalf("unexpected workers after Close; got %s", b)
	}
}
