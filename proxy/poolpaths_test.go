package proxy

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Failed dials give their pool slot back, whatever failed: a TLS handshake
// against a certificate nobody trusts, a peer that speaks no TLS, a
// refused port. Fifty of each on a one-connection pool never find it
// exhausted, and nothing stays open (R-DP-3).
func TestFailedDialsFreePoolSlots_RDP3(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	garbage, _ := net.Listen("tcp", "127.0.0.1:0")
	defer garbage.Close()
	go func() {
		for {
			c, err := garbage.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 400 Bad\r\n\r\n")
			c.Close()
		}
	}()
	refused, _ := net.Listen("tcp", "127.0.0.1:0")
	refusedAddr := refused.Addr().String()
	refused.Close()
	us := newUpstreams(UpstreamOptions{MaxConns: 1, ConnWait: 50 * time.Millisecond, DialTimeout: 200 * time.Millisecond})
	for _, url := range []string{srv.URL + "/", "https://" + garbage.Addr().String() + "/", "http://" + refusedAddr + "/"} {
		u, err := us.get(url)
		if err != nil {
			t.Fatal(err)
		}
		for range 50 {
			pc, _, err := u.pool.get(time.Now())
			if err == nil {
				u.pool.discard(pc)
				t.Fatalf("unexpected dial success to %s", url)
			}
			if err == errPoolExhausted {
				t.Fatalf("%s: slot leaked by a failed dial", url)
			}
		}
		if u.pool.open() != 0 {
			t.Fatalf("%s: unexpected open %d", url, u.pool.open())
		}
	}
}

// Uploads with Expect: 100-continue and chunked ones (upper-case sizes,
// chunk extensions, a trailer) alternate on one client connection and
// one worker connection: each reaches the worker whole, re-framed, without
// the Expect line, and none leaves the next request out of step (R-DP-1,
// R-DP-2).
func TestExpectAndChunkedUploadsShareOneConnection_RDP1_RDP2(t *testing.T) {
	var m recorder
	rg, w := newRigWorker(t, func(o *Options) {
		o.Upstream.MaxConns = 1
		o.Upstream.ConnWait = 300 * time.Millisecond
		o.Metrics = &m
	})
	w.route("/hash", func(rw http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			rw.WriteHeader(500)
			return
		}
		fmt.Fprintf(rw, "%x %d %q %v", sha256.Sum256(b), len(b), r.Header.Get("Expect"), r.TransferEncoding)
	})
	c, err := net.Dial("tcp", strings.TrimPrefix(rg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := strings.Repeat("0123456789abcdef", 10000)
	want := fmt.Sprintf("%x %d", sha256.Sum256([]byte(body)), len(body))
	for i := range 6 {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		kind := "chunked"
		if i%2 == 0 {
			kind = "Expect"
			fmt.Fprintf(c, "POST /counters/alice/hash HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
			line, err := br.ReadString('\n')
			if !strings.HasPrefix(line, "HTTP/1.1 100") {
				t.Fatalf("request %d: unexpected first line %q (%v)", i, line, err)
			}
			br.ReadString('\n')
			io.WriteString(c, body)
		} else {
			io.WriteString(c, "POST /counters/alice/hash HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
			for j := 0; j < len(body); j += 7777 {
				e := min(j+7777, len(body))
				fmt.Fprintf(c, "%X;ext=1\r\n%s\r\n", e-j, body[j:e])
			}
			io.WriteString(c, "0\r\nX-T: 1\r\n\r\n")
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			// Seen once under make test (unexpected EOF: the connection
			// closed unanswered): the worker's answer was read before
			// the upload's last write returned, and stop interrupted a
			// client read no longer waited for (upload.settled, stop;
			// upload_settle_test.go holds that window every run).
			t.Fatalf("request %d (%s): cannot read the answer: %v; buffered %q", i, kind, err, peekAll(br))
		}
		got, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.HasPrefix(string(got), want+` ""`) {
			t.Fatalf("request %d: unexpected answer %d %q; want prefix %q", i, res.StatusCode, got, want)
		}
	}
	// One worker connection: an answer read before the upload's last
	// write returned closed it (upload.settled).
	if n := m.connectsSeen(); n != 1 {
		t.Errorf("unexpected worker connections opened; got %d; want 1", n)
	}
}

// peekAll returns what br holds buffered, for a failure message.
func peekAll(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return b
}
