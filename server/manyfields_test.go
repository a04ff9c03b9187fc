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

// A request of more than maxKeptFields header fields is answered, then its
// connection closed: fasthttp keeps the parsed fields on the connection's
// context while it lives, and thousands of tiny ones ("a:") within the
// 16 KiB header limit made an idle keep-alive connection hold some
// 300 KiB instead of ~32 KiB (docs/OPERATIONS.md, "Known limits"). A
// request with fewer keeps it open (R-SRV-1).
func TestManyHeaderFieldsCloseTheConnection_RSRV1(t *testing.T) {
	_, public, _, _ := node(t, Options{})
	addr := strings.TrimPrefix(public, "http://")
	for _, tc := range []struct {
		fields int
		closes bool
	}{{maxKeptFields - 2, false}, {maxKeptFields + 1, true}, {3500, true}} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		// Host is one field; the rest are "a:" lines.
		fmt.Fprintf(c, "GET /livez HTTP/1.1\r\nHost: a\r\n%s\r\n", strings.Repeat("a:\r\n", tc.fields-1))
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%d fields: %v", tc.fields, err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		if res.StatusCode != 200 || res.Close != tc.closes {
			t.Errorf("unexpected answer to %d fields; got %d, close %v; want 200, close %v", tc.fields, res.StatusCode, res.Close, tc.closes)
		}
		if tc.closes {
			if n, err := br.Read(make([]byte, 1)); n != 0 || err == nil {
				t.Errorf("unexpected open connection after %d fields; got %d bytes, %v; want it closed", tc.fields, n, err)
			}
		}
		c.Close()
	}
}
