package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/proxy"
)

// TestEveryAnswerCarriesOneDate_RDP1_RREG5: RFC 9110 §6.6.1 asks a Date of
// an origin server's 2xx and 4xx answers (pinboard's registry, probes and
// errors) and of a proxy relaying an answer without one. Every answer,
// pinboard's own or a worker's relayed with or without a Date of its own,
// goes out with exactly one, from pinboard's clock (the worker's gives
// way, as in nginx).
func TestEveryAnswerCarriesOneDate_RDP1_RREG5(t *testing.T) {
	const workerDate = "Mon, 01 Jan 2024 00:00:00 GMT"
	addr := rawWorkerNode(t, func(ln net.Listener) {
		acceptEach(ln, func(c net.Conn) {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				date := ""
				if strings.HasSuffix(r.URL.Path, "/dated") {
					date = "Date: " + workerDate + "\r\n"
				}
				if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n"+date+"Content-Length: 2\r\n\r\nok"); err != nil {
					return
				}
			}
		})
	}, proxy.UpstreamOptions{IdleTimeout: time.Minute, ResponseHeaderTimeout: 5 * time.Second})

	for _, tc := range []struct {
		path   string
		status int
	}{
		{"/counters/a/dated", 200},   // the worker's Date replaced
		{"/counters/a/undated", 200}, // one added
		{"/registry/health", 200},    // pinboard's own answers
		{"/livez", 200},
		{"/nope/a/b", 404}, // pinboard's own error
	} {
		t.Run(tc.path, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: pinboard\r\nAuthorization: Bearer tok\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.status {
				t.Fatalf("unexpected status; got %d; want %d", res.StatusCode, tc.status)
			}
			dates := res.Header.Values("Date")
			if len(dates) != 1 {
				t.Fatalf("unexpected Date lines; got %q; want one", dates)
			}
			when, err := http.ParseTime(dates[0])
			if err != nil {
				t.Fatalf("unexpected Date %q: %v", dates[0], err)
			}
			// pinboard's clock, not the worker's 2024: within a minute of
			// the test's own (a bound on correctness, not on speed).
			if d := time.Since(when); d < -time.Minute || d > time.Minute {
				t.Fatalf("unexpected Date; got %s; want pinboard's now (%s)", dates[0], time.Now().UTC().Format(http.TimeFormat))
			}
		})
	}
}
