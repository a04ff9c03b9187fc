package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// counterValue is the Counter's GET /value and POST /increment answer.
type counterValue struct {
	ID     string `json:"id"`
	Count  int    `json:"count"`
	Worker string `json:"worker"`
}

// GET /counters/alice/value through pinboard reaches the Counter instance;
// method, path, query and body arrive intact.
func TestCounterThroughPinboard_RDP1(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := f.Pinboard.URL + "/counters/alice"

	r, err := getWithRetry(ctx, base+"/value")
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
	}
	var v0 counterValue
	if err := r.JSON(&v0); err != nil {
		t.Fatal(err)
	}
	if v0.ID != "alice" || (v0.Worker != "w1" && v0.Worker != "w2") {
		t.Fatalf("unexpected counter; got %+v; want id alice on w1 or w2", v0)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("unexpected Content-Type; got %q; want application/json", ct)
	}

	// POST reaches the same instance and changes its state.
	r, err = do(ctx, http.MethodPost, base+"/increment", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
	}
	var v1 counterValue
	if err := r.JSON(&v1); err != nil {
		t.Fatal(err)
	}
	if v1.Count != v0.Count+1 || v1.Worker != v0.Worker {
		t.Errorf("unexpected increment; got %+v; want count %d on %s", v1, v0.Count+1, v0.Worker)
	}
	r, err = do(ctx, http.MethodGet, base+"/value", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
	}
	var v2 counterValue
	if err := r.JSON(&v2); err != nil {
		t.Fatal(err)
	}
	if v2 != v1 {
		t.Errorf("unexpected value after increment; got %+v; want %+v", v2, v1)
	}

	// The query string arrives intact.
	r, err = do(ctx, http.MethodGet, base+"/blob?size=1000", nil, nil)
	if err != nil || r.Status != http.StatusOK || len(r.Body) != 1000 || r.Header.Get("X-Blob-Size") != "1000" {
		t.Errorf("unexpected blob; got %s, %d bytes (err %v); want 200 and 1000 bytes", r, len(r.Body), err)
	}

	// A small request body arrives intact.
	r, err = do(ctx, http.MethodPost, base+"/echo", http.Header{"Content-Type": {"text/plain"}}, strings.NewReader("hello, pinboard"))
	if err != nil || r.Status != http.StatusOK || string(r.Body) != "hello, pinboard" {
		t.Errorf("unexpected echo; got %s (err %v); want 200 \"hello, pinboard\"", r, err)
	}
}

// A namespace no worker serves answers 404 unknown namespace as JSON.
func TestUnknownNamespace_RPL5_RDP4(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	r, err := do(ctx, http.MethodGet, f.Pinboard.URL+"/nosuchns/x/value", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body errorBody
	if r.Status != http.StatusNotFound || r.JSON(&body) != nil || !strings.Contains(body.Error, "unknown namespace") {
		t.Errorf("unexpected answer; got %s; want 404 {\"error\":\"unknown namespace\"}", r)
	}
}

// One id always reaches the same worker; many ids from one client spread over
// both workers once placements eat the preferred worker's headroom.
func TestPlacementStickyAndSpread_RPL1_RPL2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pb := f.Pinboard

	first, r, err := whoami(ctx, pb, "sticky-1")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 20; i++ {
		got, r, err := whoami(ctx, pb, "sticky-1")
		if err != nil {
			t.Fatal(err)
		}
		if got != first {
			t.Fatalf("unexpected owner on request %d; got %s; want %s (R-PL-2): %s", i+1, got, first, r)
		}
	}
	_ = r

	owners := map[string]string{}
	perWorker := map[string]int{}
	for i := range 40 {
		id := "spread-" + strconv.Itoa(i)
		w, _, err := whoami(ctx, pb, id)
		if err != nil {
			t.Fatal(err)
		}
		owners[id] = w
		perWorker[w]++
	}
	if perWorker["w1"] == 0 || perWorker["w2"] == 0 {
		t.Errorf("unexpected spread of 40 new ids with equal headroom %d; got %v; want both workers used (R-PL-1, R-PL-3, R-PL-4)", sharedHeadroom, perWorker)
	}
	for id, want := range owners {
		got, r, err := whoami(ctx, pb, id)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("unexpected owner of %s on a second visit; got %s; want %s (R-PL-2): %s", id, got, want, r)
		}
	}
	t.Logf("40 ids: %v", perWorker)
}

// A worker's instance routes refuse requests that did not come through
// pinboard: no attestation, or a forged one.
func TestDirectWorkerCallRefused_RTR5(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	forged := "eyJhbGciOiJIUzI1NiIsInR5cCI6InBpbmJvYXJkK2p3dCJ9.eyJhdWQiOiJ4IiwiaWF0IjowLCJleHAiOjl9.forged"
	for _, w := range f.Workers {
		checkDirectRefused(ctx, t, w, "/counters/alice/value", nil)
		checkDirectRefused(ctx, t, w, "/counters/alice/value", http.Header{"Pinboard-Attestation": {forged}})
		checkDirectUpgradeRefused(ctx, t, w, "/tickers/t1/ws")
	}
}

// checkDirectRefused checks that w's instance route at path, called
// directly with header, answers 403 {"detail":"invalid attestation"}
// (R-TR-5).
func checkDirectRefused(ctx context.Context, t *testing.T, w *Worker, path string, header http.Header) {
	t.Helper()
	r, err := do(ctx, http.MethodGet, w.URL+path, header, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Detail string `json:"detail"`
	}
	if r.Status != http.StatusForbidden || r.JSON(&body) != nil || body.Detail != "invalid attestation" {
		t.Errorf("%s: unexpected direct answer; got %s; want 403 {\"detail\":\"invalid attestation\"}", w.Name, r)
	}
}

// checkDirectUpgradeRefused checks that a WebSocket upgrade sent to w's
// route at path directly is refused before accept: a bare 403, with no
// body to tell it from a route's own refusal (docs/PROTOCOL.md, the
// session gap; R-TR-5).
func checkDirectUpgradeRefused(ctx context.Context, t *testing.T, w *Worker, path string) {
	t.Helper()
	c, err := wsDial(ctx, "ws"+strings.TrimPrefix(w.URL, "http")+path, nil)
	var he *wsHandshakeError
	if !errors.As(err, &he) || he.Status != http.StatusForbidden || strings.Contains(he.Body, "attestation") {
		if c != nil {
			c.conn.Close()
		}
		t.Errorf("%s: unexpected direct upgrade answer; got %v; want a bare 403", w.Name, err)
	}
}

// headersSeen calls /counters/{id}/headers through pinboard and returns what
// the worker received, lower-cased names to values.
func headersSeen(ctx context.Context, pb *Pinboard, id string, header http.Header) (map[string][]string, reply, error) {
	r, err := doWithRetry(ctx, http.MethodGet, pb.URL+"/counters/"+id+"/headers", header)
	if err != nil {
		return nil, r, err
	}
	if r.Status != http.StatusOK {
		return nil, r, fmt.Errorf("unexpected answer; got %s; want 200", r)
	}
	var body struct {
		Headers [][2]string `json:"headers"`
	}
	if err := r.JSON(&body); err != nil {
		return nil, r, err
	}
	seen := map[string][]string{}
	for _, kv := range body.Headers {
		seen[strings.ToLower(kv[0])] = append(seen[strings.ToLower(kv[0])], kv[1])
	}
	return seen, r, nil
}

// Client-supplied attestation headers never reach the worker: it sees
// pinboard's own attestation (and accepts it), not the client's.
func TestClientAttestationStripped_RTR5(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	const forged = "forged.client.attestation"
	const forgedSecret = "forged-proxy-secret"
	seen, r, err := headersSeen(ctx, f.Pinboard, "hdr", http.Header{
		"Pinboard-Attestation":  {forged},
		"Pinboard-Proxy-Secret": {forgedSecret},
	})
	if r.Status == http.StatusForbidden {
		t.Fatalf("unexpected answer; got %s; want 200: the worker refused the attestation it saw, so the client's forged pinboard-attestation reached it (first copy wins) instead of pinboard's own", r)
	}
	if err != nil {
		t.Fatal(err)
	}
	att := seen["pinboard-attestation"]
	if len(att) != 1 || att[0] == forged || strings.Count(att[0], ".") != 2 {
		t.Errorf("unexpected pinboard-attestation at the worker; got %q; want exactly pinboard's own compact JWS: %s", att, r)
	}
	for _, v := range seen["pinboard-proxy-secret"] {
		if v == forgedSecret {
			t.Errorf("unexpected pinboard-proxy-secret at the worker; got the client's %q; want it stripped: %s", v, r)
		}
	}
}

// Forwarded requests keep end-to-end headers, lose hop-by-hop ones (RFC 9110
// §7.6.1) and gain forwarding headers.
func TestForwardingHeaders_RDP1(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	seen, r, err := headersSeen(ctx, f.Pinboard, "hdr", http.Header{
		"X-E2e-Probe": {"kept"},
		"Connection":  {"X-E2e-Hop"},
		"X-E2e-Hop":   {"dropped"},
		"Cookie":      {`a="x \"y\""; b=2`, "c=3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := seen["x-e2e-probe"]; len(got) != 1 || got[0] != "kept" {
		t.Errorf("unexpected x-e2e-probe at the worker; got %q; want [kept]: %s", got, r)
	}
	// The Cookie lines as the client sent them (fasthttp would merge them
	// and drop the quoted one).
	if got := seen["cookie"]; strings.Join(got, "\n") != `a="x \"y\""; b=2`+"\n"+"c=3" {
		t.Errorf("unexpected cookie lines at the worker; got %q; want both lines verbatim: %s", got, r)
	}
	if got, ok := seen["x-e2e-hop"]; ok {
		t.Errorf("unexpected x-e2e-hop at the worker; got %q; want it dropped (named by Connection): %s", got, r)
	}
	xff, fwd := seen["x-forwarded-for"], seen["forwarded"]
	if !(len(xff) > 0 && strings.Contains(xff[len(xff)-1], "127.0.0.1")) && len(fwd) == 0 {
		t.Errorf("unexpected forwarding headers; got x-forwarded-for %q, forwarded %q; want the client address 127.0.0.1: %s", xff, fwd, r)
	}
}

// Server-Sent Events are relayed as they are produced, not buffered: each
// event reaches the client within 250ms of its emission (one outlier
// allowed for a loaded machine).
func TestSSEStreamsEvents_RDP2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const count, interval = 5, 0.3
	const bound = 250 * time.Millisecond
	url := fmt.Sprintf("%s/tickers/t1/events?count=%d&interval=%v", f.Pinboard.URL, count, interval)
	res := openEventStream(ctx, t, url, 500*time.Millisecond)
	defer res.Body.Close()

	type event struct {
		N int     `json:"n"`
		T float64 `json:"t"`
	}
	events, arrived := readEvents[event](t, res.Body)
	ended := time.Now()

	if len(events) != count {
		t.Fatalf("unexpected event count; got %d; want %d", len(events), count)
	}
	// One event after the first may be late: on a loaded machine any of
	// the three processes can stall for a scheduling slice. A proxy that
	// holds events (until the next one, or a buffer fills) delays them all;
	// one that holds only the response's first write (header and first
	// event until the next) delays the first, which must be on time.
	var late []string
	for i, ev := range events {
		emitted := time.Unix(0, int64(ev.T*float64(time.Second)))
		delay := arrived[i].Sub(emitted)
		if ev.N != i {
			t.Errorf("unexpected event order; got n=%d at position %d", ev.N, i)
		}
		if delay > bound {
			late = append(late, fmt.Sprintf("event %d after %v", i, delay.Round(time.Millisecond)))
			if i == 0 {
				late = append(late, "(the first event may not be late)")
			}
		}
		t.Logf("event %d: delay %v", i, delay.Round(time.Microsecond))
	}
	if len(late) > 1 {
		t.Errorf("unexpected delays from emission to arrival: %s; want < %v (each event flushed as it comes)", strings.Join(late, ", "), bound)
	}
	lastEmitted := time.Unix(0, int64(events[count-1].T*float64(time.Second)))
	if !arrived[0].Before(lastEmitted) {
		t.Errorf("unexpected buffering; first event arrived at %v, after the last was emitted at %v; want it before",
			arrived[0].Format(time.StampMicro), lastEmitted.Format(time.StampMicro))
	}
	step := time.Duration(interval * float64(time.Second))
	if span := ended.Sub(arrived[0]); span < (count-2)*step {
		t.Errorf("unexpected stream timing; the stream ended %v after the first event; want about %v", span.Round(time.Millisecond), (count-1)*step)
	}
}

// WebSocket upgrades pass through pinboard: text and binary frames of every
// length encoding echo back, and the close handshake completes.
func TestWebSocketEcho_RDP2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	url := "ws" + strings.TrimPrefix(f.Pinboard.URL, "http") + "/tickers/t1/ws"
	c := dialWebSocket(ctx, t, url, 500*time.Millisecond)

	big := make([]byte, 70000) // 64-bit length
	for i := range big {
		big[i] = 'a' + byte(i%26)
	}
	mid := make([]byte, 300) // 16-bit length
	for i := range mid {
		mid[i] = byte(i)
	}
	echoEach(t, c, []wsMessage{
		{wsOpText, []byte("hello")},
		{wsOpBinary, []byte{0, 1, 2, 0xff}},
		{wsOpBinary, mid},
		{wsOpText, big},
		{wsOpText, []byte("bye")},
	})
	if code := c.Close(1000, 5*time.Second); code != 1000 {
		t.Errorf("unexpected close handshake; got peer code %d; want 1000 (0: no close frame came back)", code)
	}
}

// ---------------------------------------------------------------------------
// Large bodies (R-DP-2)

const bigBody = 64 << 20

// countingReader counts bytes read so a stalled transfer can say how far it got.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// generatedBody streams size deterministic pseudo-random bytes (never held
// whole) and hashes them as they are read.
func generatedBody(seed byte, size int64) (*countingReader, func() string) {
	var s [32]byte
	s[0] = seed
	h := sha256.New()
	body := &countingReader{r: io.TeeReader(io.LimitReader(rand.NewChaCha8(s), size), h)}
	return body, func() string { return hex.EncodeToString(h.Sum(nil)) }
}

// stallAfter is how long a large transfer may make no progress in either
// direction before the test gives up on it.
const stallAfter = 5 * time.Second

// watchStall cancels ctx (with a cause naming the counts) once none of the
// counters has moved for stallAfter. Stop it by cancelling ctx.
func watchStall(ctx context.Context, cancel context.CancelCauseFunc, sent *countingReader, received *atomic.Pointer[countingReader]) {
	last, still := int64(-1), time.Time{}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			total := sent.n.Load()
			var got int64
			if r := received.Load(); r != nil {
				got = r.n.Load()
			}
			total += got
			if total != last {
				last, still = total, now
				continue
			}
			if now.Sub(still) >= stallAfter {
				cancel(fmt.Errorf("transfer stalled for %v: sent %d of %d bytes, received %d (response headers: %v)",
					stallAfter, sent.n.Load(), int64(bigBody), got, received.Load() != nil))
				return
			}
		}
	}
}

// bigRequest sends a bigBody-byte generated body to url and returns the
// response (status checked by the caller) with its body counted, the request
// body counter and its digest function. A transfer that stops moving fails
// the test within stallAfter, saying how far each direction got.
func bigRequest(ctx context.Context, t *testing.T, method, url string, seed byte) (*http.Response, *countingReader, func() string) {
	t.Helper()
	ctx, cancel := context.WithCancelCause(ctx)
	t.Cleanup(func() { cancel(nil) })
	body, digest := generatedBody(seed, bigBody)
	var received atomic.Pointer[countingReader]
	go watchStall(ctx, cancel, body, &received)
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = bigBody
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	counted := &countingReader{r: res.Body}
	received.Store(counted)
	res.Body = struct {
		io.Reader
		io.Closer
	}{counted, res.Body}
	return res, body, digest
}

// A 64 MiB upload echoed back arrives byte-identical: both directions stream
// at once through the proxy (full duplex). A proxy that writes the whole
// request before reading the response stalls here once the socket buffers
// between client, proxy and worker fill (the worker stops reading while its
// echo cannot be sent).
func TestLargeBodyEcho_RDP2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if _, err := getWithRetry(ctx, f.Pinboard.URL+"/counters/big/value"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	checkBigEcho(ctx, t, f.Pinboard.URL+"/counters/big/echo", 1)
	t.Logf("64 MiB echo in %v", time.Since(start).Round(time.Millisecond))
}

// checkBigEcho POSTs a bigBody body (bigRequest's, from seed) to url, an
// echo route, and checks that it comes back whole: the same length and
// SHA-256, both directions streaming at once (R-DP-2).
func checkBigEcho(ctx context.Context, t *testing.T, url string, seed byte) {
	t.Helper()
	res, sent, sentDigest := bigRequest(ctx, t, http.MethodPost, url, seed)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		t.Fatalf("unexpected answer; got %d %s; want 200", res.StatusCode, b)
	}
	h := sha256.New()
	n, err := io.Copy(h, res.Body)
	if err != nil {
		t.Fatalf("cannot read the echo: %v; sent %d of %d bytes, received %d", err, sent.n.Load(), bigBody, n)
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != bigBody || got != sentDigest() {
		t.Errorf("unexpected echo; got %d bytes sha256 %s; want %d bytes sha256 %s", n, got, bigBody, sentDigest())
	}
}

// A 64 MiB upload reaches the worker intact (the worker only reads, then
// answers with the digest).
func TestLargeUpload_RDP2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if _, err := getWithRetry(ctx, f.Pinboard.URL+"/counters/upload/value"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	res, _, digest := bigRequest(ctx, t, http.MethodPost, f.Pinboard.URL+"/counters/upload/sha256", 2)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("unexpected answer; got %d %s (err %v); want 200", res.StatusCode, b, err)
	}
	var body struct {
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("cannot decode %s: %v", b, err)
	}
	if body.Size != bigBody || body.SHA256 != digest() {
		t.Errorf("unexpected upload at the worker; got %d bytes sha256 %s; want %d bytes sha256 %s", body.Size, body.SHA256, bigBody, digest())
	}
	t.Logf("64 MiB upload in %v", time.Since(start).Round(time.Millisecond))
}

// A 64 MiB download streams through intact.
func TestLargeDownload_RDP2(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	start := time.Now()
	url := f.Pinboard.URL + "/counters/download/blob?size=" + strconv.Itoa(bigBody)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		t.Fatalf("unexpected answer; got %d %s; want 200", res.StatusCode, b)
	}
	// Byte i of the blob is i % 251 (worker_app.py).
	buf := make([]byte, 1<<16)
	var n int64
	for {
		k, err := res.Body.Read(buf)
		for i := range k {
			if buf[i] != byte((n+int64(i))%251) {
				t.Fatalf("unexpected byte at offset %d; got %d; want %d", n+int64(i), buf[i], (n+int64(i))%251)
			}
		}
		n += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("cannot read the download after %d of %d bytes: %v", n, bigBody, err)
		}
	}
	if n != bigBody {
		t.Errorf("unexpected download length; got %d; want %d", n, bigBody)
	}
	t.Logf("64 MiB download in %v", time.Since(start).Round(time.Millisecond))
}
