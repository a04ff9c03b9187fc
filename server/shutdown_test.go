package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/testlog"
)

// A shutdown that starts before fasthttp registered the listener (a
// SIGTERM right after start, or a context already done) must still close
// it and return at once: fasthttp's Shutdown does nothing for a server
// without listeners yet, and Serve then served on.
func TestShutdownBeforeServeStarted(t *testing.T) {
	for i := 0; i < 5; i++ {
		pb, _ := testPinboard(t, "")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		// A grace far longer than the wait below: a Serve that served on,
		// or one that waited out the grace with nothing to wait for, both
		// fail it, and a loaded machine cannot (no bound on a duration).
		served := make(chan error, 1)
		go func() { served <- pb.Serve(ctx, ln, time.Hour) }()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("unexpected Serve error: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("unexpected Serve still running 20s after a shutdown that came before it (grace 1h)")
		}
		if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatalf("unexpected listener still accepting after Serve returned")
		}
	}
}

// A node shuts down once (Shutdown's doc): Shutdown after Serve's own
// shutdown, or racing it, waits for it and returns net.ErrClosed, and
// Serve still returns nil. Before, the second run stopped everything
// again and failed with ants' "this pool has been closed" (R-SRV-4: a
// program deferring Shutdown as cleanup met it on every clean exit).
func TestShutdownTwice_RSRV4(t *testing.T) {
	for i := 0; i < 5; i++ {
		pb, _ := testPinboard(t, "")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- pb.Serve(ctx, ln, time.Hour) }()
		shut := make(chan error, 1)
		if i%2 == 0 {
			// Racing: Serve's context ends as Shutdown is called.
			go func() { shut <- pb.Shutdown(time.Hour, nil) }()
			cancel()
		} else {
			cancel()
			if err := <-served; err != nil {
				t.Fatalf("unexpected Serve error; got %v; want nil", err)
			}
			served <- nil
			shut <- pb.Shutdown(time.Hour, nil)
		}
		for _, c := range []chan error{served, shut} {
			select {
			case err := <-c:
				if err != nil && !errors.Is(err, net.ErrClosed) {
					t.Fatalf("unexpected error of a second shutdown; got %v; want nil or net.ErrClosed", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("unexpected Serve or Shutdown still running 20s after both began")
			}
		}
		if err := pb.Shutdown(time.Hour, nil); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("unexpected result of Shutdown on a node shut down; got %v; want an error wrapping net.ErrClosed", err)
		}
	}
}

// An HTTP/1.0 client's download of an unsized body is relayed off the
// server on the hijacked connection, which fasthttp no longer counts: the
// shutdown's grace must still wait for it like for any request in flight
// ("Operating it": SIGTERM lets in-flight requests finish within the
// grace), not cut it as soon as the server has no connection left; and
// nothing of it outlives Serve (R-DP-2).
func TestShutdownWaitsForHTTP10Download_RDP2(t *testing.T) {
	release, stopped := make(chan struct{}), make(chan struct{})
	defer close(stopped)
	// A grace of an hour: the download must end by itself within it however
	// loaded the machine is (with 1s, a slow one cut it before "last"), and
	// stop fails after 10s a shutdown that waits for anything else.
	pb, public, stop := workerNodeStop(t, Options{}, time.Hour, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first,")
		w.(http.Flusher).Flush()
		select {
		case <-release:
			_, _ = io.WriteString(w, "last")
		case <-stopped:
		}
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "GET /counters/alice/download HTTP/1.0\r\nHost: pb\r\n\r\n")
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("cannot read the response header: %v", err)
		}
		if line == "\r\n" {
			break
		}
	}
	first := make([]byte, len("first,"))
	if _, err := io.ReadFull(br, first); err != nil {
		t.Fatalf("cannot read the body's start: %v", err)
	}
	stopErr := make(chan error, 1)
	go func() { stopErr <- stop() }()
	// The download goes on during the grace and ends by itself.
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-stopErr:
		t.Fatalf("unexpected shutdown done with a download in flight; got %v", err)
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "last" {
		t.Fatalf("unexpected rest of the download; got %q, %v; want %q then the close", rest, err, "last")
	}
	if err := <-stopErr; err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
	if d, o := pb.Proxy().RelayedDownloads(), pb.Proxy().OpenStreams(); d != 0 || o != 0 {
		t.Fatalf("unexpected relays left after shutdown; got %d downloads, %d streams; want 0, 0", d, o)
	}
}

// A registry request still running when the grace and the closing of
// streams are over — here an operator's drain body still arriving, read
// on the registry pool — is cut with the process like a data-plane
// request, and the shutdown stays clean and within its budget (grace +
// CloseWait). The pool's close waited 5 s more for it, then failed the
// shutdown: "cannot stop the registry pool: operation timed out", exit 1.
func TestShutdownCutsRegistryRequestPastGrace(t *testing.T) {
	var logs testlog.Buffer
	_, public, _, stop := node(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))}) // grace 1 s
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Past the 8 KiB fasthttp reads before the handler: the rest is read
	// by the registry's handler, on the pool.
	head := "POST /registry/drain HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nContent-Type: application/json\r\nContent-Length: 500000\r\n\r\n"
	if _, err := io.WriteString(c, head+`{"clientId":"`+strings.Repeat("x", 20000)); err != nil {
		t.Fatal(err)
	}
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		// A body that keeps moving, slowly: the stall timeout never cuts it.
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if _, err := io.WriteString(c, "xxxx"); err != nil {
					return
				}
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	err = stop()
	took := time.Since(start)
	if err != nil {
		t.Errorf("unexpected shutdown error with a registry request past the grace: %v", err)
	}
	if budget := time.Second + CloseWait + time.Second; took > budget {
		t.Errorf("unexpected shutdown of %v with a registry request past the grace; want at most grace + CloseWait + 5 s slack = %v", took, budget)
	}
	// The log says the grace ran out with a request in flight (R-SRV-1:
	// an operator reading a deploy's logs learns that requests were cut,
	// not only that the node stopped).
	if s := logs.String(); !strings.Contains(s, `msg="shutdown: grace ran out; cutting requests still in flight"`) || !strings.Contains(s, "inFlight=1") {
		t.Errorf("unexpected shutdown log without the grace running out and one request in flight:\n%s", s)
	}
}

// sweepingStore is a memory store whose Sweep, once its context ends,
// takes a while longer to return, as a store round trip already on the
// wire does; ended is set when it has.
type sweepingStore struct {
	*directory.Memory
	entered chan struct{}
	once    sync.Once
	ended   atomic.Bool
}

func (s *sweepingStore) Sweep(ctx context.Context, now time.Time) error {
	s.once.Do(func() { close(s.entered) })
	<-ctx.Done()
	time.Sleep(100 * time.Millisecond)
	s.ended.Store(true)
	return ctx.Err()
}

// Serve's background loops (the directory sweep, the pool sweep) end
// before it returns: a caller that closes the store once Serve returned
// (cmd/pinboard defers store.Close) met a sweep still running on it
// (R-SRV-4: the library API; "background work can be stopped").
func TestServeWaitsForItsBackgroundLoops_RSRV4(t *testing.T) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"op","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(k string) (string, bool) { return "tok", k == "T" })
	if err != nil {
		t.Fatal(err)
	}
	store := &sweepingStore{Memory: directory.NewMemory(time.Second, time.Now()), entered: make(chan struct{})}
	pb, err := New(Options{Store: store, Passport: pp, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveUntilStopped(t, pb, ln, time.Second)
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected no directory sweep 10s after Serve started")
	}
	if err := stop(); err != nil {
		t.Fatalf("unexpected Serve error: %v", err)
	}
	if !store.ended.Load() {
		t.Fatal("unexpected directory sweep still running after Serve returned; want every background loop ended")
	}
}

// An upload answered during a shutdown's grace without its body read (a
// worker's early 403) gets the answer and a clean end, not a reset, as
// outside a shutdown; and the shutdown waits for that lingering close as
// for a request in flight, since the process ending would reset it just
// the same. Connections closed at once from the shutdown's start on: the
// client's next write met a reset, and a client that writes its whole
// body before it reads the answer (Python's) reported that instead
// (R-DP-2, rawio.Linger).
func TestShutdownEarlyAnswerToUploadNotReset_RDP2(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	// A grace of an hour: nothing here may end by it.
	pb, public, stop := workerNodeStop(t, Options{}, time.Hour, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
		<-release
		refuseEarly(w, r)
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stopErr := make(chan error, 1)
	go func() {
		<-arrived
		go func() { stopErr <- stop() }()
		for !pb.stopping.Load() {
			time.Sleep(time.Millisecond)
		}
		close(release)
	}()
	uploadAnsweredEarly(t, c, bufio.NewReader(c), " during a shutdown's grace")
	// The client goes on sending a while: its connection still lingers,
	// and the shutdown waits for it.
	for range 15 {
		if _, err := c.Write([]byte("more")); err != nil {
			t.Fatalf("unexpected write error on a connection answered during the grace; got %v; want it lingering", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-stopErr:
		t.Fatalf("unexpected shutdown done while an answered client was still sending (lingering close); got %v", err)
	default:
	}
	c.Close()
	if err := <-stopErr; err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
}

// A request still in flight when the shutdown's budget (grace +
// CloseWait) is over is cut: its connection closes, and no request is
// served on it once Serve returned. fasthttp's Shutdown, canceled, leaves
// such a connection to its goroutine, which served the late answer and
// then further requests on it, keep-alive, with the node stopped — the
// registry pool closed, the store closed by a caller that goes on
// (R-SRV-4: an embedding program; docs/OPERATIONS.md, "Graceful
// shutdown" step 4). The goroutine serving it ends with the worker's
// answer, which it can no longer write.
func TestShutdownClosesConnectionsPastBudget_RSRV4(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	const grace = 300 * time.Millisecond
	_, public, stop := workerNodeStop(t, Options{}, grace, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/slow") {
			arrived <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "answer")
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /counters/alice/slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected request not at the worker 10s after it was sent")
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
	if took, budget := time.Since(start), grace+CloseWait+5*time.Second; took > budget {
		t.Errorf("unexpected shutdown of %v; want at most grace + CloseWait + 5 s slack = %v", took, budget)
	}
	// The worker answers now, after Serve returned: the client must not
	// get it, nor anything after it.
	once.Do(func() { close(release) })
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if ne := net.Error(nil); len(b) > 0 || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("unexpected connection still served after Serve returned; got %q, %v; want it closed", b, err)
	}
	// Nothing of the server goes on once the worker answered.
	deadline := time.Now().Add(5 * time.Second)
	for serving() {
		if time.Now().After(deadline) {
			t.Fatal("unexpected handler still running 5s after the worker answered a cut request")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serving reports whether a goroutine runs the node's handler.
func serving() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Contains(string(buf), "server.(*Pinboard).Handle(")
}

// Shutdown called on a node that Serve runs (net/http's pattern: Serve in
// a goroutine, Shutdown on a signal) is the shutdown Serve's context
// would start: Serve returns nil once it began, and the admin listener
// keeps answering — /readyz 503 — until Shutdown is done. Serve returned
// "cannot serve: %!w(<nil>)" at once, and closed the admin listener
// with it, mid-drain (R-SRV-4: the library API).
func TestShutdownWhileServing_RSRV4(t *testing.T) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:operator"],"claims":{"pinboard":{"namespaces":["*"]}}}]}]}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		t.Fatal(err)
	}
	store := &blockingWorkersStore{Memory: directory.NewMemory(DefaultLeaseTTL, time.Now()), entered: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(store.release) }) }
	t.Cleanup(release)
	pb, err := New(Options{Store: store, Passport: pp})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = pb.ServeAdmin(aln) }()
	served := make(chan error, 1)
	go func() { served <- pb.Serve(context.Background(), ln, time.Hour) }()

	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/registry/workers", nil)
		req.Header.Set("Authorization", "Bearer tok")
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
		res, err := c.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		res.Body.Close()
		answered <- res.StatusCode
	}()
	select {
	case <-store.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected registry request not running 10s after it was sent")
	}
	shut := make(chan error, 1)
	go func() { shut <- pb.Shutdown(time.Hour, nil) }()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("unexpected Serve result once Shutdown began; got %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected Serve still running 10s after Shutdown began")
	}
	// The request still runs: the admin listener answers, not ready.
	status, body := get(t, "http://"+aln.Addr().String()+"/readyz")
	if status != http.StatusServiceUnavailable || body != `{"ok":false,"shuttingDown":true}` {
		t.Fatalf("unexpected admin readiness during the shutdown; got %d %s; want 503 shuttingDown", status, body)
	}
	release()
	if got := <-answered; got != http.StatusOK {
		t.Fatalf("unexpected answer to the request in flight; got %d; want 200", got)
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("unexpected Shutdown error: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected Shutdown still running 10s after the last request ended")
	}
}

// A Pinboard serves once: Serve after its shutdown refuses at once, its
// listener closed. It served a node that was for ever unready, whose
// registry answered 503 "not the serving fleet" and whose next
// shutdown failed ("cannot stop the registry pool: this pool has been
// closed") — a program that restarts pinboard in process must build
// another with New (R-SRV-4).
func TestServeAfterShutdownRefused_RSRV4(t *testing.T) {
	pb, _, _, stop := node(t, Options{})
	if err := stop(); err != nil {
		t.Fatalf("unexpected shutdown error: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() { served <- pb.Serve(context.Background(), ln, time.Second) }()
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("unexpected Serve result after a shutdown; got %v; want an error wrapping net.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("unexpected Serve serving a node shut down")
	}
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("unexpected listener still accepting after Serve refused")
	}
}

// A connection opened before the shutdown whose first request arrives
// just after it started is served, not closed under the request: the
// client (a browser's preconnect, a balancer's warm connection) cannot
// know the node is stopping. fasthttp, like net/http, takes such a
// connection for idle only 5 s after it opened, which is why a shutdown
// with a never-used connection open takes up to 5 s (docs/OPERATIONS.md,
// "Graceful shutdown"); the shutdown then ends without waiting for the
// grace ("Operating it": graceful shutdown).
func TestShutdownServesFirstRequestOnFreshConnection(t *testing.T) {
	_, public, stop := workerNodeStop(t, Options{}, time.Hour, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	stopErr := make(chan error, 1)
	go func() { stopErr <- stop() }()
	// The shutdown has started (the listener refuses) before the request.
	addr := strings.TrimPrefix(public, "http://")
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		d.Close()
		if time.Now().After(deadline) {
			t.Fatalf("unexpected listener still accepting 10s into the shutdown")
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprint(c, "GET /counters/alice/x HTTP/1.1\r\nHost: pb\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("unexpected fresh connection's first request lost to the shutdown: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		t.Fatalf("unexpected answer; got %d %q; want 200 %q", resp.StatusCode, body, "ok")
	}
	// Served during the shutdown, it carries Connection: close; the
	// shutdown then ends by itself, long before its hour of grace.
	if !resp.Close {
		t.Fatalf("unexpected keep-alive answer during a shutdown; want Connection: close")
	}
	select {
	case err := <-stopErr:
		if err != nil {
			t.Fatalf("unexpected shutdown error: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("unexpected shutdown still running 20s after its last connection was served (grace 1h)")
	}
}
