package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// Tests of what a hostile or broken client or worker sends on the wire:
// raw bytes in, the bytes the other side sees checked.

// capLn records every byte the stand-in worker reads.
type capLn struct {
	net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
}

type capConn struct {
	net.Conn
	ln *capLn
}

func (c *capConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.ln.mu.Lock()
	c.ln.buf.Write(p[:n])
	c.ln.mu.Unlock()
	return n, err
}

func (l *capLn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &capConn{Conn: c, ln: l}, nil
}

func (l *capLn) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

// newCapRig is a rig with one stand-in worker for /counters, alice placed
// on it, and the bytes it receives recorded.
func newCapRig(t *testing.T, opts func(*Options)) (*rig, *capLn) {
	t.Helper()
	rg := newRig(t, opts)
	rg.warm()
	s := &standin{name: "w", secret: "secret-w", routes: map[string]http.HandlerFunc{}}
	s.session.Store("")
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	cl := &capLn{Listener: s.srv.Listener}
	s.srv.Listener = cl
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	rg.add(s, 1, "/counters")
	if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: "alice", Now: rg.now()}); err != nil {
		t.Fatal(err)
	}
	real := time.Now()
	rg.clock.Store(&real)
	return rg, cl
}

// raw sends req on a fresh connection and returns what comes back within d.
func (rg *rig) raw(req string, d time.Duration) string {
	rg.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		rg.t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, req)
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, _ := io.ReadAll(bufio.NewReader(c))
	return string(b)
}

// headerValues returns every value of name in the request the worker got.
func headerValues(t *testing.T, wire, name string) []string {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(wire)))
	if err != nil {
		t.Fatalf("the worker got no request: %v\n%q", err, wire)
	}
	return req.Header.Values(name)
}

// A worker's answer whose Connection header names Content-Length keeps its
// length: the body is read whole, and the next clients on the pooled
// connection get their own answers — not the rest of this one, shifted by
// one (R-DP-1, R-DP-3).
func TestConnectionCannotUnframeResponse_RDP1_RDP3(t *testing.T) {
	rg := newRig(t, nil)
	rg.warm()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	inner := "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nINJECTED"
	var n int
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, r.Body)
					mu.Lock()
					n++
					first := n == 1
					mu.Unlock()
					if first {
						_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: %d\r\n\r\n%s", len(inner), inner)
						continue
					}
					body := "for " + r.URL.Path
					_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
				}
			}(c)
		}
	}()
	s := &standin{name: "raw", secret: "secret-raw", srv: &httptest.Server{URL: "http://" + ln.Addr().String()}}
	s.session.Store("")
	rg.add(s, 1, "/counters")
	for _, id := range []string{"alice", "bob", "carol"} {
		if _, err := rg.store.Place(t.Context(), &directory.PlaceRequest{NS: "/counters", ID: id, Now: rg.now()}); err != nil {
			t.Fatal(err)
		}
	}
	real := time.Now()
	rg.clock.Store(&real)
	for _, id := range []string{"alice", "bob", "carol"} {
		want := "for /counters/" + id + "/x"
		if id == "alice" {
			want = inner
		}
		if _, body := rg.get("/counters/"+id+"/x", nil); body != want {
			t.Fatalf("unexpected body for %s; got %q; want %q", id, body, want)
		}
	}
}

// Headers named by any Connection header are hop-by-hop, not only those
// the first one names (R-DP-1, RFC 9110 §7.6.1).
func TestEveryConnectionHeaderStripped_RDP1(t *testing.T) {
	rg, cl := newCapRig(t, nil)
	rg.raw("GET /counters/alice/x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: s\r\n\r\n", 500*time.Millisecond)
	if got := headerValues(t, cl.String(), "X-Secret"); len(got) != 0 {
		t.Fatalf("X-Secret, named by the second Connection header, reached the worker: %q", got)
	}
}

// An untrusted client cannot add its own X-Forwarded-* lines beside
// pinboard's (uvicorn joins every For line and takes the last Proto), nor
// pass Forwarded or X-Real-IP; a trusted proxy's lines are kept, the For
// lines joined in order (R-PL-4).
func TestForwardedHeadersOneCopy_RPL4(t *testing.T) {
	forged := "GET /counters/alice/x HTTP/1.1\r\nHost: a\r\n" +
		"X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 6.6.6.6\r\n" +
		"X-Forwarded-Proto: http\r\nX-Forwarded-Proto: https\r\n" +
		"X-Forwarded-Host: a\r\nX-Forwarded-Host: evil\r\n" +
		"Forwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n\r\n"
	t.Run("untrusted", func(t *testing.T) {
		rg, cl := newCapRig(t, nil)
		rg.raw(forged, 500*time.Millisecond)
		wire := cl.String()
		for name, want := range map[string][]string{
			"X-Forwarded-For": {"127.0.0.1"}, "X-Forwarded-Proto": {"http"}, "X-Forwarded-Host": {"a"},
			"Forwarded": nil, "X-Real-IP": nil,
		} {
			if got := headerValues(t, wire, name); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("unexpected %s at the worker; got %q; want %q", name, got, want)
			}
		}
	})
	t.Run("trusted", func(t *testing.T) {
		rg, cl := newCapRig(t, func(o *Options) {
			tp, err := ParseTrustedProxies("127.0.0.1")
			if err != nil {
				t.Fatal(err)
			}
			o.TrustedProxies = tp
		})
		rg.raw(forged, 500*time.Millisecond)
		wire := cl.String()
		for name, want := range map[string][]string{
			"X-Forwarded-For": {"1.1.1.1, 6.6.6.6, 127.0.0.1"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"evil"},
			"Forwarded": {"for=6.6.6.6"}, "X-Real-IP": {"6.6.6.6"},
		} {
			if got := headerValues(t, wire, name); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("unexpected %s at the worker; got %q; want %q", name, got, want)
			}
		}
	})
}
