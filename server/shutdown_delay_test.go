package server

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

	"github.com/valyala/fasthttp"
)

// With a shutdown delay, the end of Serve's context turns readiness 503
// at once and nothing else: new connections are accepted and served,
// the registry answers, until the delay is over; then the shutdown runs
// as without one and the port refuses connections (R-SRV-2,
// docs/OPERATIONS.md, PINBOARD_SHUTDOWN_DELAY_MS).
func TestShutdownDelayKeepsServingWhileUnready_RSRV2(t *testing.T) {
	const delay = 1500 * time.Millisecond
	pb, _ := testPinboardWith(t, "", func(o *Options) { o.ShutdownDelay = delay })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pb.Serve(ctx, ln, time.Second) }()
	get := func(path string) (int, string, error) {
		// A connection of its own each time: new connections are what
		// the delay keeps accepting.
		c := &fasthttp.Client{MaxIdleConnDuration: time.Nanosecond}
		status, body, err := c.GetTimeout(nil, "http://"+addr+path, 2*time.Second)
		return status, string(body), err
	}
	if status, body, err := get("/readyz?exclude=quarantine"); err != nil || status != 200 {
		t.Fatalf("unexpected readiness before the signal; got %d %s %v", status, body, err)
	}
	cancel()
	stopped := time.Now()
	// Readiness turns 503 at once; everything else still serves.
	deadline := stopped.Add(time.Second)
	for {
		status, body, err := get("/readyz?exclude=quarantine")
		if err != nil {
			t.Fatalf("unexpected connection failure %v after the signal, within the delay: %v", time.Since(stopped), err)
		}
		if status == 503 && body == `{"ok":false,"shuttingDown":true}` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unexpected readiness 1s into the delay; got %d %s; want 503 shuttingDown", status, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, body, err := get("/livez"); err != nil || status != 200 {
		t.Fatalf("unexpected liveness within the delay; got %d %s %v; want 200", status, body, err)
	}
	if status, body, err := get("/registry/health"); err != nil || status == 503 {
		t.Fatalf("unexpected registry within the delay; got %d %s %v; want it still serving", status, body, err)
	}
	if d := time.Since(stopped); d >= delay {
		t.Skipf("machine too slow: the checks took %v, the whole delay (%v)", d, delay)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v after %v, before the delay (%v) was over", err, time.Since(stopped), delay)
	default:
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("unexpected shutdown error: %v", err)
		}
	case <-time.After(delay + 10*time.Second):
		t.Fatal("unexpected hang in shutdown")
	}
	if d := time.Since(stopped); d < delay {
		t.Fatalf("unexpected Serve return %v after the signal; want the delay (%v) first", d, delay)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("unexpected connection accepted after the shutdown")
	}
}

// During the delay a keep-alive connection opened before the signal, a
// connection accepted during it and an event stream opened during it are
// served; the admin listener's /readyz is 503 from the start. Once the
// delay is over the shutdown runs as without one: the idle keep-alive
// connection closes, the event stream ends cleanly, Serve returns nil
// (R-SRV-2, R-DP-2; docs/OPERATIONS.md, "Graceful shutdown").
func TestShutdownDelayServesConnectionsThenShutsThem_RSRV2(t *testing.T) {
	const delay = 1500 * time.Millisecond
	pb, public, stop := workerNodeStop(t, Options{ShutdownDelay: delay}, time.Second,
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, "/events") {
				_, _ = io.WriteString(w, "ok")
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; ; i++ {
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}))
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = pb.ServeAdmin(aln) }()
	admin := "http://" + aln.Addr().String()
	addr := strings.TrimPrefix(public, "http://")
	dial := func() (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("cannot connect: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	ask := func(c net.Conn, br *bufio.Reader, path string) *http.Response {
		t.Helper()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return res
	}
	readAll := func(res *http.Response) string {
		t.Helper()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("cannot read the body: %v", err)
		}
		return string(b)
	}
	ka, kbr := dial()
	if res := ask(ka, kbr, "/counters/alice/x"); res.StatusCode != 200 || readAll(res) != "ok" || res.Close {
		t.Fatalf("unexpected answer before the signal: %v", res)
	}
	stopped := make(chan error, 1)
	signalled := time.Now()
	go func() { stopped <- stop() }()
	waitReady := func(url string) {
		t.Helper()
		for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
			res, err := http.Get(url)
			if err == nil {
				res.Body.Close()
				if res.StatusCode == 503 {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("unexpected readiness of %s 1s into the delay; got %v, %v; want 503", url, res, err)
			}
		}
	}
	waitReady(admin + "/readyz?exclude=quarantine")
	// Within the delay: the kept connection, a new one, an event stream.
	if res := ask(ka, kbr, "/counters/alice/x"); res.StatusCode != 200 || readAll(res) != "ok" || res.Close {
		t.Fatalf("unexpected answer on a kept connection within the delay: %v", res)
	}
	nc, nbr := dial()
	if res := ask(nc, nbr, "/counters/alice/x"); res.StatusCode != 200 || readAll(res) != "ok" {
		t.Fatalf("unexpected answer on a new connection within the delay: %v", res)
	}
	ec, ebr := dial()
	es := ask(ec, ebr, "/counters/alice/events")
	if es.StatusCode != 200 {
		t.Fatalf("unexpected answer to an event stream within the delay: %v", es)
	}
	events := bufio.NewReader(es.Body)
	if line, err := events.ReadString('\n'); err != nil || line != "data: 0\n" {
		t.Fatalf("unexpected first event within the delay; got %q, %v", line, err)
	}
	if d := time.Since(signalled); d >= delay {
		t.Skipf("machine too slow: the checks took %v, the whole delay (%v)", d, delay)
	}
	// Then the shutdown: the stream ends cleanly, the kept connection
	// closes, Serve returns nil.
	if _, err := io.ReadAll(events); err != nil {
		t.Fatalf("unexpected end of the event stream opened within the delay: %v", err)
	}
	if d := time.Since(signalled); d < delay {
		t.Fatalf("unexpected end of the event stream %v after the signal, within the delay (%v)", d, delay)
	}
	if n, err := kbr.ReadByte(); err != io.EOF {
		t.Fatalf("unexpected kept connection after the shutdown; got %q, %v; want it closed", n, err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("unexpected shutdown error: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected hang in shutdown")
	}
}
