package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A chunked event stream whose worker flushes an event line by line (a
// chunk per line) and whose session ends between two lines of one event
// is stopped mid-event: it must be cut (no last chunk), as a sized one
// is (eventEnd), never ended cleanly with half an event (R-LS-2, R-DP-2).
func TestChunkedEventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	w := newStandin(t, "w")
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "id: 1\n")
		rw.(http.Flusher).Flush() // one chunk: a line of the event, not its end
		<-r.Context().Done()
	})
	rg.add(w, 1, "/t")
	res, err := http.Get(rg.url + "/t/x/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if line, err := readLineWithin(br, 5*time.Second); err != nil || line != "id: 1\n" {
		t.Fatalf("unexpected first line; got %q, %v", line, err)
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(br); err == nil {
		t.Fatalf("unexpected clean end of an event stream stopped mid-event; got %q; want a cut (no last chunk)", rest)
	}
}

// The same for an event stream the worker delimits by its close (no
// Content-Length, no chunking): what went out ends mid-event, so the
// stream must be cut, not ended with a last chunk (R-LS-2, R-DP-2).
func TestCloseDelimitedEventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	w := newStandin(t, "w")
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		c, bw, err := rw.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nid: 1\n")
		_ = bw.Flush()
		<-done
	})
	rg.add(w, 1, "/t")
	res, err := http.Get(rg.url + "/t/x/events")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	if line, err := readLineWithin(br, 5*time.Second); err != nil || line != "id: 1\n" {
		t.Fatalf("unexpected first line; got %q, %v", line, err)
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(br); err == nil {
		t.Fatalf("unexpected clean end of a close-delimited event stream stopped mid-event; got %q; want a cut (no last chunk)", rest)
	}
}

// To an HTTP/1.0 client the same chunked stream stopped mid-event ends
// with a clean close (a FIN), which tells it the body is whole (R-LS-2,
// R-DP-2): it must be cut (a reset), as a sized one is.
func TestHTTP10EventStreamEndedMidEventIsCut_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	w := newStandin(t, "w")
	w.route("/events", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "id: 1\n")
		rw.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	rg.add(w, 1, "/t")
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "GET /t/x/events HTTP/1.0\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	readHead(t, br)
	if line, err := readLineWithin(br, 5*time.Second); err != nil || line != "id: 1\n" {
		t.Fatalf("unexpected first line; got %q, %v", line, err)
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(br); err == nil {
		t.Fatalf("unexpected clean close of an HTTP/1.0 event stream stopped mid-event; got %q; want a reset", rest)
	}
}
