package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// conn10 is a raw client connection to pinboard, as an HTTP/1.0 client
// (ApacheBench, curl -0, a load balancer's health check) holds one.
type conn10 struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialHTTP10(t *testing.T, pb *Pinboard) *conn10 {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(pb.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &conn10{t: t, c: c, br: bufio.NewReader(c)}
}

// get sends a raw GET for target and reads the answer whole.
func (c *conn10) get(target, extra string) (*http.Response, string) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.c, "GET %s HTTP/1.0\r\n%s\r\n", target, extra); err != nil {
		c.t.Fatalf("cannot send GET %s: %v", target, err)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	res, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("cannot read the answer to GET %s: %v", target, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.t.Fatalf("cannot read the body of the answer to GET %s: %v", target, err)
	}
	return res, string(b)
}

// closed reports whether pinboard closes the connection within 5 s.
func (c *conn10) closed() bool {
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.br.Read(make([]byte, 1))
	return n == 0 && errors.Is(err, io.EOF)
}

// HTTP/1.0 clients through pinboard to the real pinned worker: the
// worker gets HTTP/1.1 requests (its access log shows the version) over
// pinboard's pooled connections (/proc/net/tcp shows none opened), and
// the client gets answers it can read: a sized one with its
// Content-Length, the connection kept when it asked for keep-alive, an
// unsized event stream without chunked framing, ended by the close
// (R-DP-1, R-DP-2, R-DP-3).
func TestHTTP10ClientThroughPinboard_RDP1_RDP2_RDP3(t *testing.T) {
	f := sharedFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := getWithRetry(ctx, f.Pinboard.URL+"/counters/alice/value")
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("unexpected answer; got %s (err %v); want 200", r, err)
	}
	var owner counterValue
	if err := r.JSON(&owner); err != nil {
		t.Fatal(err)
	}
	w := f.Worker(owner.Worker)
	mark := w.proc.out.Mark()
	tag := randomHex(4)
	before, sockErr := workerSockets(w.Port)

	const n = 8
	for i := 0; i < n; i++ {
		c := dialHTTP10(t, f.Pinboard)
		host := "Host: pinboard.test\r\n"
		if i == 0 {
			host = "" // HTTP/1.0 does not require one; the worker gets its own
		}
		res, body := c.get(fmt.Sprintf("/counters/alice/value?h10=%s-%d", tag, i), host)
		var v counterValue
		if res.StatusCode != http.StatusOK || res.Proto != "HTTP/1.1" || json.Unmarshal([]byte(body), &v) != nil || v.ID != "alice" {
			t.Fatalf("unexpected answer %d; got %s %d %q; want HTTP/1.1 200 and alice's value", i, res.Proto, res.StatusCode, body)
		}
		if len(res.TransferEncoding) > 0 || res.ContentLength != int64(len(body)) {
			t.Fatalf("unexpected framing of answer %d; got Transfer-Encoding %v, Content-Length %d; want Content-Length %d",
				i, res.TransferEncoding, res.ContentLength, len(body))
		}
		if !c.closed() {
			t.Fatalf("unexpected open connection after answer %d; want it closed (HTTP/1.0 without keep-alive)", i)
		}
	}

	// Connections to the worker opened meanwhile, whatever their state
	// now: before, each HTTP/1.0 request had its own, closed after its
	// answer (7 new ones for 8 requests; now none).
	if sockErr != nil {
		t.Fatalf("cannot count the worker's connections: %v", sockErr)
	}
	if after, err := workerSockets(w.Port); err != nil {
		t.Fatalf("cannot count the worker's connections: %v", err)
	} else {
		fresh := 0
		for peer := range after {
			if !before[peer] {
				fresh++
			}
		}
		if fresh >= n/2 {
			t.Fatalf("unexpected worker connections; got %d new ones for %d HTTP/1.0 requests; want the pooled one reused", fresh, n)
		}
	}

	// keep-alive: sized answers keep the connection.
	c := dialHTTP10(t, f.Pinboard)
	for i := 0; i < 2; i++ {
		res, body := c.get("/counters/alice/value", "Host: pinboard.test\r\nConnection: keep-alive\r\n")
		if res.StatusCode != http.StatusOK || res.Close || !strings.EqualFold(res.Header.Get("Connection"), "keep-alive") {
			t.Fatalf("unexpected answer %d to a keep-alive HTTP/1.0 client; got %d %q, Connection %q; want 200 and keep-alive",
				i, res.StatusCode, body, res.Header.Get("Connection"))
		}
	}

	// An event stream (chunked from the worker) ends with the connection.
	c = dialHTTP10(t, f.Pinboard)
	res, body := c.get("/tickers/h10/events?count=3&interval=0.01", "Host: pinboard.test\r\n")
	if res.StatusCode != http.StatusOK || len(res.TransferEncoding) > 0 || res.ContentLength != -1 || strings.Count(body, "data: ") != 3 {
		t.Fatalf("unexpected event stream to an HTTP/1.0 client; got %d, Transfer-Encoding %v, Content-Length %d, %q; want 3 events until the close",
			res.StatusCode, res.TransferEncoding, res.ContentLength, body)
	}

	// The worker's access log: every request arrived as HTTP/1.1 (the
	// client address is the X-Forwarded-For pinboard set, port 0).
	line := regexp.MustCompile(`"GET /counters/alice/value\?h10=` + tag + `-\d+ (HTTP/[0-9.]+)"`)
	var got [][]string
	for deadline := time.Now().Add(5 * time.Second); ; {
		got = line.FindAllStringSubmatch(w.proc.out.Since(mark), -1)
		if len(got) >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(got) != n {
		t.Fatalf("unexpected access log of %s; got %d of the %d requests; want all\n%s", w.Name, len(got), n, w.proc.out.Since(mark))
	}
	for _, m := range got {
		if m[1] != "HTTP/1.1" {
			t.Fatalf("unexpected version at the worker; got %q; want HTTP/1.1", m[0])
		}
	}
}

// workerSockets returns the connections to 127.0.0.1:port (the worker),
// keyed by their other end (hex address:port), in any state — TIME_WAIT
// included, on whichever side closed first — from /proc/net/tcp.
func workerSockets(port int) (map[string]bool, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	worker := fmt.Sprintf("0100007F:%04X", port)
	conns := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		switch {
		case len(f) < 3:
		case f[1] == worker && f[2] != "00000000:0000": // the worker's end
			conns[f[2]] = true
		case f[2] == worker: // the other end
			conns[f[1]] = true
		}
	}
	return conns, nil
}
