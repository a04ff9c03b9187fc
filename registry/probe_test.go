package registry

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// rawAnswer is a probe answer for challenge c, framed plainly.
func rawAnswer(c string) string {
	body := `{"value":"v-` + c + `"}`
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A server at the advertise URL whose first answer is framed so that
// bytes follow it on the connection must not leave them for the next
// probe: they read as an answer with another challenge's value, and the
// next probe would void a healthy session (R-REG-1, R-LS-3). fasthttp
// pools the connection after either framing below.
func TestProbeAmbiguousFramingNotPooled_RREG1(t *testing.T) {
	for _, tc := range []struct {
		name string
		// first returns the first answer for challenge c and the bytes
		// that follow it a moment later, after the client read it.
		first func(c string) (head, tail string)
	}{
		{"content-length and transfer-encoding", func(c string) (string, string) {
			// RFC 9112 section 6.3: "ought to be handled as an error". The
			// Content-Length covers the chunked body and a stale answer.
			body := `{"value":"v-` + c + `"}`
			chunked := strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
			stale := rawAnswer(c)
			return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(chunked)+len(stale)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, stale
		}},
		{"content-length short of the body", func(c string) (string, string) {
			return rawAnswer(c), rawAnswer(c)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var first atomic.Bool
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer conn.Close()
						br := bufio.NewReader(conn)
						for {
							req, err := http.ReadRequest(br)
							if err != nil {
								return
							}
							c := req.URL.Query().Get("challenge")
							if !first.CompareAndSwap(false, true) {
								_, _ = conn.Write([]byte(rawAnswer(c)))
								continue
							}
							head, tail := tc.first(c)
							_, _ = conn.Write([]byte(head))
							time.Sleep(100 * time.Millisecond)
							_, _ = conn.Write([]byte(tail))
						}
					}()
				}
			}()
			u := "http://" + ln.Addr().String()
			p := NewProber(time.Second)
			if res, err := p.Probe(u, "s", "c1", "v-c1"); res != ProbeOK {
				t.Fatalf("unexpected first probe; got %v (%v); want %v", res, err, ProbeOK)
			}
			time.Sleep(200 * time.Millisecond)
			for i := 2; i < 5; i++ {
				c := "c" + strconv.Itoa(i)
				if res, err := p.Probe(u, "s", c, "v-"+c); res != ProbeOK {
					t.Fatalf("unexpected probe %d; got %v (%v); want %v", i, res, err, ProbeOK)
				}
			}
		})
	}
}

// The probe reads the answer's "value" member as the reference reads it
// (body.value): by its exact name, the last of duplicates winning. An
// answer whose only value is under "VALUE" carried no value (degraded,
// R-LS-3), not the expected one; one that also names "Value" is answered
// by its "value", not voided for the other member's.
func TestProbeReadsValueByExactName_RLS3(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(r.URL.Query().Get("challenge")))
	}))
	defer srv.Close()
	p := NewProber(time.Second)
	for _, tc := range []struct {
		answer string
		want   ProbeResult
	}{
		{`{"value":"v"}`, ProbeOK},
		{`{"VALUE":"v"}`, ProbeUnreachable},
		{`{"Value":"v"}`, ProbeUnreachable},
		{`{"value":"v","Value":"other"}`, ProbeOK},
		{`{"VALUE":"other","value":"v"}`, ProbeOK},
		{`{"value":"other","value":"v"}`, ProbeOK},
		{`{"value":"v","value":"other"}`, ProbeMismatch},
		// No string value is no value: degraded, not voided (PROTOCOL.md).
		{`{"value":123}`, ProbeUnreachable},
		{`{"value":null}`, ProbeUnreachable},
		{`{"value":["v"]}`, ProbeUnreachable},
		{`{}`, ProbeUnreachable},
	} {
		// The stand-in answers the challenge itself: the answer rides in it.
		if res, err := p.Probe(srv.URL, "s", tc.answer, "v"); res != tc.want {
			t.Errorf("unexpected probe result for %s; got %v (%v); want %v", tc.answer, res, err, tc.want)
		}
	}
}

// Closing the registry closes the prober's idle probe connections: they
// stayed open for their idle timeout after Registry.Close, a node that
// shut down still holding a connection to every worker it probed.
func TestProberCloseIdleClosesConnections_RREG1(t *testing.T) {
	var closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"value":"v"}`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	p := NewProber(time.Second)
	if res, err := p.Probe(srv.URL, "s", "c", "v"); res != ProbeOK {
		t.Fatalf("cannot probe: %v %v", res, err)
	}
	if closed.Load() != 0 {
		t.Fatal("unexpected closed probe connection before CloseIdle; want it pooled")
	}
	p.CloseIdle()
	deadline := time.Now().Add(2 * time.Second)
	for closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("unexpected open probe connection 2 s after CloseIdle; want it closed")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A worker that stops answering on a connection the prober pooled from an
// earlier probe is unreachable after the probe timeout, however long the
// connection idled before: probes run on raw connections (internal/rawio)
// whose read deadline is armed when a read must wait, so a reused one
// must still time out (R-REG-2: a hung worker's heartbeat is degraded,
// not held).
func TestProbeHangOnPooledConnectionTimesOut_RREG2(t *testing.T) {
	fw := newFakeWorker(t)
	t.Cleanup(func() { close(fw.hang) }) // before the server's Close waits for its handlers
	const timeout = 300 * time.Millisecond
	p := NewProber(timeout)
	for _, idle := range []time.Duration{0, 50 * time.Millisecond, 400 * time.Millisecond} {
		fw.mode.Store("ok")
		c, v := fw.pair("pooled" + idle.String())
		if res, err := p.Probe(fw.srv.URL, fw.secret, c, v); res != ProbeOK {
			t.Fatalf("cannot probe: %v %v", res, err)
		}
		time.Sleep(idle)
		fw.mode.Store("hang")
		start := time.Now()
		c, v = fw.pair("hung" + idle.String())
		res, _ := p.Probe(fw.srv.URL, fw.secret, c, v)
		// Bounded, not timed: a probe held past the worker's own 5 s
		// timeout is the failure this guards against.
		if took := time.Since(start); res != ProbeUnreachable || took < timeout || took > 5*time.Second {
			t.Fatalf("unexpected probe of a worker hanging after %v idle; got %v after %v; want unreachable after the %v timeout", idle, res, took, timeout)
		}
	}
}

// A probe whose worker stops waiting before it could start is not made
// (ErrAnswerDue, the worker not asked); one whose worker still waits runs
// as Probe does, answerBy bounding it only when nearer than the timeout
// (R-REG-1, R-LS-2).
func TestProbeByAnswerDue_RREG1_RLS2(t *testing.T) {
	fw := newFakeWorker(t)
	p := NewProber(time.Second)
	c, v := fw.pair("due")
	if res, err := p.ProbeBy(time.Now().Add(-time.Millisecond), fw.srv.URL, fw.secret, c, v); !errors.Is(err, ErrAnswerDue) || res != ProbeUnreachable {
		t.Fatalf("unexpected probe past its answer's time; got %v %v; want unreachable, ErrAnswerDue", res, err)
	}
	if n := fw.probes.Load(); n != 0 {
		t.Fatalf("unexpected probes of the worker; got %d; want 0", n)
	}
	if res, err := p.ProbeBy(time.Now().Add(time.Minute), fw.srv.URL, fw.secret, c, v); res != ProbeOK || err != nil {
		t.Fatalf("unexpected probe with time to spare; got %v %v; want ok", res, err)
	}
	fw.mode.Store("404")
	if res, err := p.ProbeBy(time.Now().Add(time.Minute), fw.srv.URL, fw.secret, c, v); res != ProbeRejected || errors.Is(err, ErrAnswerDue) {
		t.Fatalf("unexpected probe answered 404 in time; got %v %v; want rejected, not ErrAnswerDue", res, err)
	}
}

// A worker advertising an IPv6 address (an IPv6 pod's POD_IP) is probed
// over IPv6, as the data plane dials it: fasthttp's default dial resolved
// IPv4 addresses only and failed every probe of such a worker without a
// connection tried, so its register was deferred (503 "advertise URL
// unreachable") for as long as it ran (R-REG-1). The dial is stopped in
// net.Dialer.Control, after the socket is made and before it connects:
// nothing touches the network.
func TestProbeDialsIPv6_RREG1(t *testing.T) {
	errStop := errors.New("stopped before connecting")
	var network, address string
	p := NewProber(time.Second)
	p.dialer.Control = func(n, a string, _ syscall.RawConn) error {
		network, address = n, a
		return errStop
	}
	res, err := p.Probe("http://[::1]:9/", "s", "c", "v")
	if res != ProbeUnreachable {
		t.Fatalf("unexpected result; got %v; want %v", res, ProbeUnreachable)
	}
	if network == "" && err != nil && (errors.Is(err, syscall.EAFNOSUPPORT) || strings.Contains(err.Error(), "address family not supported")) {
		t.Skip("no IPv6 sockets on this host")
	}
	if network != "tcp6" || address != "[::1]:9" {
		t.Fatalf("unexpected dial; got %q %q (err %v); want %q %q", network, address, err, "tcp6", "[::1]:9")
	}
}

// The challenge route answers through the worker app's middleware, and a
// header it adds to every answer is on the probe's answer too: up to
// 16 KiB of header passes, as on the data plane. With fasthttp's default
// 4 KiB read buffer such an app's every probe failed, so its register was
// deferred for as long as it ran and its heartbeats marked it degraded
// (R-REG-1, R-LS-3).
func TestProbeAnswerWithLargeHeader_RREG1_RLS3(t *testing.T) {
	csp := strings.Repeat("default-src 'self' https://cdn.example; ", 200) // 8 KB
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"value":"v-` + r.URL.Query().Get("challenge") + `"}`))
	}))
	defer srv.Close()
	p := NewProber(time.Second)
	for i := range 2 { // a fresh connection, then a pooled one
		if res, err := p.Probe(srv.URL, "s", "c", "v-c"); res != ProbeOK {
			t.Fatalf("unexpected result of probe %d; got %v (%v); want %v", i, res, err, ProbeOK)
		}
	}
}

// A probe does not follow redirects: R-TR-3 checks the advertise URL's
// host at register, and a redirect would have the probe (carrying the
// worker's secret) reach, and a register be proved by, a host the claims
// never covered. A 3xx is an answer like a 403: rejected, whatever the
// target would have said (R-REG-1).
func TestProbeDoesNotFollowRedirects_RREG1_RTR3(t *testing.T) {
	var reached atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = w.Write([]byte(`{"value":"v"}`))
	}))
	defer target.Close()
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.RequestURI(), status)
		}))
		p := NewProber(2 * time.Second)
		res, err := p.Probe(redirector.URL, "s", "c", "v")
		p.CloseIdle()
		redirector.Close()
		if res != ProbeRejected {
			t.Errorf("unexpected outcome of a probe answered %d; got %v (%v); want %v", status, res, err, ProbeRejected)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("unexpected requests at the redirect target; got %d; want 0", n)
	}
}

// Only a 2xx answer is read for its value: a 3xx (not followed) carrying
// the right value is the non-2xx row, rejected — degraded at a heartbeat
// (R-REG-2 probe table, R-LS-3).
func TestProbeNon2xxWithValueRejected_RREG2(t *testing.T) {
	for _, status := range []int{300, 304, 399} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"value":"v"}`))
		}))
		res, err := NewProber(time.Second).Probe(srv.URL, "s", "c", "v")
		srv.Close()
		if res != ProbeRejected && !(status == 304 && res == ProbeUnreachable) {
			t.Errorf("unexpected probe result for a %d answer; got %v (%v); want rejected", status, res, err)
		}
	}
}
