package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// An event stream whose session the store ended — here deregistered; a
// frozen or cut-off worker's is dropped by the sweep a lease after its
// lease ran out — ends cleanly within a tick of the proxy's Run loop, so
// that its client reconnects to the id's owner now: nothing else ends an
// idle event stream from a frozen worker, whose kernel still holds the
// connection. Event streams of live sessions, and other streams of the
// ended session (a download), run on (R-LS-2, R-DP-2).
func TestEventStreamOfEndedSessionEnds_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	frozen := func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "data: hello\n\n")
		rw.(http.Flusher).Flush()
		<-r.Context().Done() // no more events, as from a frozen worker
	}
	more := make(chan struct{})
	download := func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/octet-stream")
		rw.WriteHeader(200)
		fmt.Fprint(rw, "part one\n")
		rw.(http.Flusher).Flush()
		select {
		case <-more:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(rw, "part two\n")
	}
	w, v := newStandin(t, "w"), newStandin(t, "v")
	w.route("/events", frozen)
	w.route("/download", download)
	v.route("/events", frozen)
	rg.add(w, 1, "/t")
	rg.add(v, 1, "/u")
	open := func(path, first string) (*http.Response, *bufio.Reader) {
		t.Helper()
		res, err := http.Get(rg.url + path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		br := bufio.NewReader(res.Body)
		if line, err := readLineWithin(br, 5*time.Second); err != nil || line != first {
			t.Fatalf("unexpected first line of %s; got %q, %v; want %q", path, line, err, first)
		}
		return res, br
	}
	_, wEvents := open("/t/x/events", "data: hello\n")
	_, vEvents := open("/u/y/events", "data: hello\n")
	_, wDownload := open("/t/z/download", "part one\n")

	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	// The blank line ending the event, then the end of the body.
	ended := make(chan error, 1)
	go func() {
		rest, err := io.ReadAll(wEvents)
		if err == nil && string(rest) != "\n" {
			err = fmt.Errorf("unexpected bytes %q", rest)
		}
		ended <- err
	}()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("unexpected end of the ended session's event stream; got %v; want a clean end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ended session's event stream still open 10 s after it ended")
	}
	// A tick later, the live session's stream and the download run on.
	time.Sleep(1500 * time.Millisecond)
	if _, err := vEvents.ReadString('\n'); err != nil {
		t.Fatalf("unexpected end of a live session's event stream: %v", err)
	}
	go func() {
		line, err := vEvents.ReadString('\n')
		ended <- fmt.Errorf("live session's stream read %q, %v", line, err)
	}()
	close(more)
	if line, err := readLineWithin(wDownload, 5*time.Second); err != nil || line != "part two\n" {
		t.Fatalf("unexpected download of the ended session; got %q, %v; want it whole", line, err)
	}
	select {
	case err := <-ended:
		t.Fatalf("unexpected end: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// A WebSocket whose session the store ended is told goodbye as at
// shutdown — Close 1001 "going away" toward the client and the worker —
// within a tick of the proxy's Run loop; one to a live session runs on
// (R-LS-2, R-DP-2).
func TestWebSocketOfEndedSessionGoesAway_RLS2_RDP2(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go rg.p.Run(ctx)
	// Each worker's side of its WebSocket: what it reads, whole.
	worker := func(got chan<- []byte) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			conn, brw, ok := accept101(rw)
			if !ok {
				return
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			b, _ := io.ReadAll(brw)
			got <- b
		}
	}
	wGot, vGot := make(chan []byte, 1), make(chan []byte, 1)
	w, v := newStandin(t, "w"), newStandin(t, "v")
	w.route("/ws", worker(wGot))
	v.route("/ws", worker(vGot))
	rg.add(w, 1, "/t")
	rg.add(v, 1, "/u")
	open := func(path string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, br := rg.dialUpgrade(path, "")
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		res, err := http.ReadResponse(br, nil)
		if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("unexpected answer to the upgrade of %s; got %v, %v; want 101", path, res, err)
		}
		return c, br
	}
	_, wbr := open("/t/x/ws")
	vc, _ := open("/u/y/ws")
	waitUntil(t, "two relays", func() bool { return rg.p.OpenWebSockets() == 2 })

	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	if op, p := readFrame(t, wbr); op != 0x8 || !bytes.Equal(p, goingAway) {
		t.Fatalf("unexpected frame to the client of the ended session; got %x %q; want Close 1001", op, p)
	}
	select {
	case b := <-wGot:
		// The relay masks toward the worker: unmask the Close frame.
		if len(b) != 6+len(goingAway) || b[0] != 0x88 || b[1] != 0x80|byte(len(goingAway)) {
			t.Fatalf("unexpected bytes at the ended session's worker; got %x; want one masked Close 1001", b)
		}
		for i := range goingAway {
			b[6+i] ^= b[2+i%4]
		}
		if !bytes.Equal(b[6:], goingAway) {
			t.Fatalf("unexpected Close payload at the ended session's worker; got %q; want %q", b[6:], goingAway)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the ended session's worker was never told goodbye")
	}
	// A tick later, the live session's relay still carries frames.
	time.Sleep(1500 * time.Millisecond)
	_, _ = vc.Write(frame(0x1, []byte("still here"), true))
	_ = vc.(*net.TCPConn).CloseWrite()
	select {
	case b := <-vGot:
		if !bytes.Equal(b, frame(0x1, []byte("still here"), true)) {
			t.Fatalf("unexpected bytes at the live session's worker; got %x; want the client's frame", b)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the live session's worker never got the client's frame")
	}
}

// A request waiting for its answer from a worker whose session the store
// ended — deregistered here; a frozen worker's is swept a lease after its
// lease ran out — is answered 502 "owner session ended" at the next
// client check, not after the header timeout (5 min by default, an hour
// here): the answer would come, if at all, from a worker no longer the
// id's owner, while the id serves from another. A wait on a live
// session goes on, and gets its answer (R-LS-2, R-DP-4).
func TestAnswerAwaitedFromEndedSessionIs502_RLS2_RDP4(t *testing.T) {
	defer func(d time.Duration) { clientCheckEvery = d }(clientCheckEvery)
	clientCheckEvery = 100 * time.Millisecond
	rg := newRig(t, func(o *Options) { o.Upstream.ResponseHeaderTimeout = time.Hour })
	rg.warm()
	arrived := make(chan string, 2)
	wRelease, vRelease := make(chan struct{}), make(chan struct{})
	defer close(wRelease)
	slow := func(name string, release <-chan struct{}) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			arrived <- name
			select {
			case <-release:
				fmt.Fprint(rw, "late answer from "+name)
			case <-r.Context().Done():
			}
		}
	}
	w, v := newStandin(t, "w"), newStandin(t, "v")
	w.route("/slow", slow("w", wRelease))
	v.route("/slow", slow("v", vRelease))
	rg.add(w, 1, "/t")
	rg.add(v, 1, "/u")
	type answer struct {
		status int
		body   string
		err    error
	}
	ask := func(path string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			c := &http.Client{Timeout: 30 * time.Second}
			res, err := c.Get(rg.url + path)
			if err != nil {
				ch <- answer{err: err}
				return
			}
			defer res.Body.Close()
			b, err := io.ReadAll(res.Body)
			ch <- answer{res.StatusCode, string(b), err}
		}()
		return ch
	}
	wAns, vAns := ask("/t/x/slow"), ask("/u/y/slow")
	for range 2 {
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("unexpected requests not at the workers 10s after they were sent")
		}
	}
	if err := rg.store.Deregister(t.Context(), w.session.Load().(string), rg.now()); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-wAns:
		if a.err != nil || a.status != http.StatusBadGateway || a.body != `{"error":"owner session ended"}` {
			t.Fatalf("unexpected answer from the ended session; got %d %q, %v; want 502 %q", a.status, a.body, a.err, `{"error":"owner session ended"}`)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("unexpected request to an ended session still waiting 20s after it ended (header timeout 1h)")
	}
	// v's session lives: its request still waits, through many checks.
	select {
	case a := <-vAns:
		t.Fatalf("unexpected answer from a live session before it answered; got %d %q, %v", a.status, a.body, a.err)
	case <-time.After(5 * clientCheckEvery):
	}
	close(vRelease)
	select {
	case a := <-vAns:
		if a.err != nil || a.status != http.StatusOK || a.body != "late answer from v" {
			t.Fatalf("unexpected answer from the live session; got %d %q, %v; want 200 %q", a.status, a.body, a.err, "late answer from v")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("unexpected live session's answer not relayed 20s after it was sent")
	}
}
