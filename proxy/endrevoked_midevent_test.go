package proxy

import (
	"fmt"
	"net/http"
	"testing"
)

// A chunked event stream whose worker flushes an event line by line (a
// chunk per line) and whose session ends between two lines of one event
// is stopped mid-event: it must be cut (no last chunk), as a sized one
// is (eventEnd), never ended cleanly with half an event (R-LS-2, R-DP-2).
func TestChunkedEventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	// One chunk: a line of the event, not its end.
	if rest, err := endedSessionStream(t, "HTTP/1.1", sentThenFrozen("id: 1\n", ""), "id: 1\n"); err == nil {
		t.Fatalf("unexpected clean end of an event stream stopped mid-event; got %q; want a cut (no last chunk)", rest)
	}
}

// The same for an event stream the worker delimits by its close (no
// Content-Length, no chunking): what went out ends mid-event, so the
// stream must be cut, not ended with a last chunk (R-LS-2, R-DP-2).
func TestCloseDelimitedEventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	closeDelimited := func(rw http.ResponseWriter, r *http.Request) {
		c, bw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nid: 1\n")
		_ = bw.Flush()
		<-done
	}
	if rest, err := endedSessionStream(t, "HTTP/1.1", closeDelimited, "id: 1\n"); err == nil {
		t.Fatalf("unexpected clean end of a close-delimited event stream stopped mid-event; got %q; want a cut (no last chunk)", rest)
	}
}

// To an HTTP/1.0 client the same chunked stream stopped mid-event ends
// with a clean close (a FIN), which tells it the body is whole (R-LS-2,
// R-DP-2): it must be cut (a reset), as a sized one is.
func TestHTTP10EventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	if rest, err := endedSessionStream(t, "HTTP/1.0", sentThenFrozen("id: 1\n", ""), "id: 1\n"); err == nil {
		t.Fatalf("unexpected clean close of an HTTP/1.0 event stream stopped mid-event; got %q; want a reset", rest)
	}
}
