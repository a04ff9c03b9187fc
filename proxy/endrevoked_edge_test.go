package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// frozenEvents is a worker's event stream that sends one event and then
// nothing, as from a frozen worker.
func frozenEvents(rw http.ResponseWriter, r *http.Request) {
	sentThenFrozen("data: hello\n\n", "")(rw, r)
}

// sentThenFrozen is a worker's event stream that sends sent (with a
// Content-Length when size is set) and then nothing.
func sentThenFrozen(sent, size string) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		if size != "" {
			rw.Header().Set("Content-Length", size)
		}
		rw.WriteHeader(200)
		fmt.Fprint(rw, sent)
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// endedSessionStream relays the worker's /events (events) to a client
// speaking proto ("HTTP/1.1" or "HTTP/1.0"), reads its first line (want
// first), ends the worker's session, and returns what the client read
// after that line and the error its end came with (nil: a clean end).
func endedSessionStream(t *testing.T, proto string, events http.HandlerFunc, first string) (string, error) {
	t.Helper()
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	w := newStandin(t, "w")
	w.route("/events", events)
	rg.add(w, 1, "/t")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "GET /t/x/events %s\r\nHost: x\r\n\r\n", proto)
	var br *bufio.Reader
	if proto == "HTTP/1.0" {
		br = bufio.NewReader(c)
		readHead(t, br)
	} else {
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		br = bufio.NewReader(res.Body)
	}
	if line, err := readLineWithin(br, 5*time.Second); err != nil || line != first {
		t.Fatalf("unexpected first line; got %q, %v; want %q", line, err, first)
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	return string(rest), err
}

// An event stream relayed to an HTTP/1.0 client, delimited by the close
// (relayUntilClose), ends cleanly — a FIN after whole events, not a reset
// — when its session ends: it is whole, and the client reconnects
// (R-LS-2, R-DP-2).
func TestHTTP10EventStreamOfEndedSessionEndsCleanly_RLS2_RDP2(t *testing.T) {
	rest, err := endedSessionStream(t, "HTTP/1.0", frozenEvents, "data: hello\n")
	if err != nil || rest != "\n" {
		t.Fatalf("unexpected end of the HTTP/1.0 event stream of an ended session; got %q, %v; want %q and a clean close", rest, err, "\n")
	}
}

// An event stream answering an upload still going up (the worker answers
// before reading the body) ends when its session ends, and what the
// client sends of the body afterwards is never read as a request: the
// connection closes (R-LS-2, R-DP-2, R-DP-1).
func TestUploadEventStreamOfEndedSessionEnds_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	w := newStandin(t, "w")
	done := make(chan struct{})
	t.Cleanup(func() { close(done) }) // before the stand-in closes
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "data: hello\n\n")
		rw.(http.Flusher).Flush()
		// The body unread, Go's server does not see the close.
		<-done
	})
	smuggled := make(chan string, 4)
	w.route("/smuggled", func(rw http.ResponseWriter, r *http.Request) { smuggled <- r.URL.Path })
	rg.add(w, 1, "/t")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	const size = 1 << 20
	fmt.Fprintf(c, "POST /t/x/events HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
	_, _ = c.Write([]byte(strings.Repeat("a", 20000)))
	br := bufio.NewReader(c)
	head := readHead(t, br)
	if !strings.Contains(head[0], "200") {
		t.Fatalf("unexpected answer %q", head)
	}
	for i := 0; ; i++ { // a chunk-size line first
		line, err := readLineWithin(br, 5*time.Second)
		if err == nil && strings.Contains(line, "data: hello") {
			break
		}
		if err != nil || i == 2 {
			t.Fatalf("unexpected first event; got %q, %v", line, err)
		}
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(br)
		ended <- err
	}()
	// The rest of the body holds what would be a request if read as one.
	req := "GET /t/x/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	go func() {
		for i := 0; i < 50; i++ {
			if _, err := c.Write([]byte(req)); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the ended session's event stream answering an upload still open 10 s after it ended")
	}
	select {
	case p := <-smuggled:
		t.Fatalf("unexpected request %s read from the upload's body", p)
	case <-time.After(500 * time.Millisecond):
	}
}

// Bodies that end (the worker ends its event stream) while endRevoked
// runs, and bodies reused from the pool meanwhile, never leave an ended
// session's owner on a body of another (run with -race).
func TestEndRevokedWhileStreamsEnd_RLS2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	short := func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "data: one\n\n")
	}
	w, v := newStandin(t, "w"), newStandin(t, "v")
	w.route("/events", short)
	v.route("/events", short)
	rg.add(w, 1, "/t")
	rg.add(v, 1, "/u")
	stop := make(chan struct{})
	var sweeps sync.WaitGroup
	sweeps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			rg.p.streams.endRevoked(time.Now())
			rg.p.hijacks.endRevoked(time.Now())
		}
	})
	var clients sync.WaitGroup
	var failed sync.Map
	for i := range 8 {
		clients.Go(func() {
			for j := range 40 {
				path := fmt.Sprintf("/u/y%d/events", i)
				if j%2 == 0 {
					path = fmt.Sprintf("/t/x%d/events", i)
				}
				res, err := http.Get(rg.url + path)
				if err != nil {
					failed.Store(path, err)
					return
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || string(b) != "data: one\n\n" {
					if strings.HasPrefix(path, "/u/") {
						failed.Store(path, fmt.Errorf("got %q, %v", b, err))
					}
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	clients.Wait()
	close(stop)
	sweeps.Wait()
	failed.Range(func(k, v any) bool {
		t.Errorf("unexpected failure of the live session's stream %v: %v", k, v)
		return true
	})
}

// A sized event stream (the worker's Content-Length; relayed chunked to
// an HTTP/1.1 client, TestSizedEventStreamFlushedPerEvent_RDP2) whose
// session ended ends cleanly after its last whole event, as the chunked
// one does (docs/PROTOCOL.md: "an event stream cleanly between two
// events"): it was cut, the client reading a truncated body (R-LS-2,
// R-DP-2).
func TestSizedEventStreamOfEndedSessionEndsCleanly_RLS2_RDP2(t *testing.T) {
	rest, err := endedSessionStream(t, "HTTP/1.1", sentThenFrozen("data: hello\n\n", "1000"), "data: hello\n")
	if err != nil || rest != "\n" {
		t.Fatalf("unexpected end of the sized event stream of an ended session; got %q, %v; want %q and a clean end", rest, err, "\n")
	}
}

// To an HTTP/1.0 client the sized event stream carries its Content-Length
// and ends by the close: one ended short of it is cut (a reset), never a
// clean close, as any truncated close-delimited body (R-DP-2).
func TestHTTP10SizedEventStreamOfEndedSessionIsCut_RLS2_RDP2(t *testing.T) {
	if rest, err := endedSessionStream(t, "HTTP/1.0", sentThenFrozen("data: hello\n\n", "1000"), "data: hello\n"); err == nil {
		t.Fatalf("unexpected clean close of a sized HTTP/1.0 event stream short of its Content-Length; got %q", rest)
	}
}
