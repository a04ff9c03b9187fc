package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that opened a connection and sent nothing within the header
// timeout — a pre-opened connection of a client's or a load balancer's
// pool — is closed without a byte, as nginx and Go's net/http do:
// fasthttp wrote an unsolicited 408, which a client sending its first
// request on that connection just then reads as the answer to it. A
// client that began a request header and stalled still gets the
// documented 408 (R-DP-4, docs/PROTOCOL.md §5).
func TestHeaderTimeoutSilentOnUnusedConnection_RDP4(t *testing.T) {
	_, public := workerNode(t, Options{HeaderTimeout: 300 * time.Millisecond},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	for _, tc := range []struct {
		name, sent, want string
	}{
		{name: "nothing sent", sent: "", want: ""},
		{name: "header begun", sent: "GET /counters/alice/v HTTP/1.1\r\nHost: a\r\n", want: "408"},
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(public, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if tc.sent != "" {
			fmt.Fprint(c, tc.sent)
		}
		br := bufio.NewReader(c)
		if tc.want == "" {
			b, err := io.ReadAll(br)
			c.Close()
			if err != nil || len(b) != 0 {
				t.Fatalf("unexpected end of a connection with %s past the header timeout; got %q, %v; want closed without a byte", tc.name, b, err)
			}
			continue
		}
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			c.Close()
			t.Fatalf("unexpected answer to a connection with %s past the header timeout; got %v; want %s", tc.name, err, tc.want)
		}
		b, _ := io.ReadAll(res.Body)
		c.Close()
		if fmt.Sprint(res.StatusCode) != tc.want || string(b) != `{"error":"request timeout"}` || !res.Close {
			t.Fatalf("unexpected answer to a connection with %s past the header timeout; got %d %q close=%v; want %s {\"error\":\"request timeout\"} and a close", tc.name, res.StatusCode, b, res.Close, tc.want)
		}
	}
}
