package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A connection an event stream was relayed on waits for its next request
// as a keep-alive connection does, under the idle timeout: it was handed
// back to the server as a new connection, whose wait for a first byte is
// the header timeout, and at its end fasthttp wrote an unsolicited 408 —
// the answer a client read for the request it sent after a pause shorter
// than the idle timeout; with an idle timeout shorter than the header
// timeout the connection was held past it (R-DP-2).
func TestResumedConnectionIdleTimeout_RDP2(t *testing.T) {
	worker := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/events") {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: 1\n\n")
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	for _, tc := range []struct {
		idle, header, pause time.Duration
		open                bool
	}{
		{idle: 5 * time.Second, header: 300 * time.Millisecond, pause: time.Second, open: true},
		{idle: 300 * time.Millisecond, header: 5 * time.Second, pause: 1500 * time.Millisecond, open: false},
	} {
		_, public := workerNode(t, Options{IdleTimeout: tc.idle, HeaderTimeout: tc.header}, worker)
		c, br := streamedOn(t, public)
		time.Sleep(tc.pause)
		if !tc.open {
			if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
				t.Fatalf("unexpected end of a connection idle %v past an event stream (idle timeout %v); got %q, %v; want closed without a byte", tc.pause, tc.idle, b, err)
			}
			continue
		}
		fmt.Fprint(c, "GET /counters/alice/v HTTP/1.1\r\nHost: a\r\n\r\n")
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("unexpected answer after idling %v past an event stream (idle timeout %v); got %v; want 200", tc.pause, tc.idle, err)
		}
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK || string(b) != "ok" {
			t.Fatalf("unexpected answer after idling %v past an event stream (idle timeout %v); got %d %q; want 200 %q", tc.pause, tc.idle, res.StatusCode, b, "ok")
		}
	}
}

// A connection handed back by an event relay and waiting for its next
// request is closed by a graceful shutdown, as an idle keep-alive
// connection is, not left open until its idle timeout (R-DP-2).
func TestResumedConnectionClosedAtShutdown_RDP2(t *testing.T) {
	_, public, stop := workerNodeStop(t, Options{IdleTimeout: time.Minute}, time.Second,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: 1\n\n")
		}))
	_, br := streamedOn(t, public)
	time.Sleep(100 * time.Millisecond) // the relay hands the connection back
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("unexpected shutdown error; got %v; want nil", err)
	}
	if b, err := io.ReadAll(br); err != nil || len(b) != 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("unexpected end of a resumed connection at shutdown; got %q, %v after %v; want closed at once", b, err, time.Since(start))
	}
}

// streamedOn opens a connection to the node at public (closed at cleanup,
// 10 s deadline), relays one event stream on it, "data: 1", to its end,
// and returns the connection, kept alive, and its reader.
func streamedOn(t *testing.T, public string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	fmt.Fprint(c, "GET /counters/alice/events HTTP/1.1\r\nHost: a\r\n\r\n")
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(res.Body); err != nil || string(b) != "data: 1\n\n" || res.Header.Get("Connection") != "" {
		t.Fatalf("unexpected event stream; got %q, %v, Connection %q; want one event, keep-alive", b, err, res.Header.Get("Connection"))
	}
	return c, br
}

// A resumed connection the server refuses over its concurrency limit
// (fasthttp answers 503 and closes it) leaves the set of served
// connections: no StateClosed comes for it, and the set kept it for the
// node's life.
func TestResumedConnectionRefusedNotKept_RDP2(t *testing.T) {
	pb, _ := testPinboard(t, "")
	pb.srv.Concurrency = 1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (server, client net.Conn) {
		t.Helper()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server, err = ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close(); server.Close() })
		return server, client
	}
	// The one slot, held by a connection waiting for its request.
	s1, c1 := pair()
	served := make(chan error, 1)
	go func() { served <- pb.srv.ServeConn(s1) }()
	// ServeConn counts the connection once it took the slot. fasthttp's
	// count takes one off for a listener Serve would hold, which none
	// does here: -1 before, 0 once s1 is served (waiting for 0 to pass,
	// the loop ended at once on -1 when the goroutine had not run yet,
	// and never when it had).
	for deadline := time.Now().Add(10 * time.Second); pb.srv.GetOpenConnectionsCount() < 0; {
		if time.Now().After(deadline) {
			t.Fatal("unexpected first connection not served 10s on")
		}
		time.Sleep(5 * time.Millisecond)
	}
	s2, _ := pair()
	if err := pb.resume(s2); !errors.Is(err, fasthttp.ErrConcurrencyLimit) {
		t.Fatalf("unexpected resume result over the limit; got %v; want %v", err, fasthttp.ErrConcurrencyLimit)
	}
	pb.connsMu.Lock()
	_, kept := pb.conns[s2]
	pb.connsMu.Unlock()
	if kept {
		t.Fatal("unexpected refused connection still in the set of served connections")
	}
	c1.Close()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected first connection still served 10s after its client closed")
	}
}

// A relay's hijack handler runs on a goroutine of its own (fasthttp's
// hijackConnHandler) before the server's worker reports StateHijacked:
// a short event stream can end, and its connection be resumed (StateNew,
// resume), first. The late StateHijacked must not drop the connection
// ServeConn now serves from the set a shutdown past its budget closes.
func TestResumedBeforeHijackReportedStaysTracked_RDP2(t *testing.T) {
	pb, _ := testPinboard(t, "")
	s, c := net.Pipe()
	defer s.Close()
	defer c.Close()
	tracked := func() bool {
		pb.connsMu.Lock()
		defer pb.connsMu.Unlock()
		_, ok := pb.conns[s]
		return ok
	}
	pb.trackConn(s, fasthttp.StateNew)      // accepted
	pb.trackConn(s, fasthttp.StateNew)      // resumed by the relay's goroutine
	pb.trackConn(s, fasthttp.StateHijacked) // the worker reports the hijack late
	if !tracked() {
		t.Fatal("unexpected resumed connection dropped from the served set by the late hijack report")
	}
	pb.trackConn(s, fasthttp.StateClosed) // ServeConn's end
	if tracked() {
		t.Fatal("unexpected connection still tracked after its close")
	}
	// The usual order: hijack reported, then resumed, then closed.
	pb.trackConn(s, fasthttp.StateNew)
	pb.trackConn(s, fasthttp.StateHijacked)
	pb.trackConn(s, fasthttp.StateNew)
	if !tracked() {
		t.Fatal("unexpected resumed connection untracked")
	}
	pb.trackConn(s, fasthttp.StateClosed)
	if tracked() {
		t.Fatal("unexpected connection still tracked after its close")
	}
}
