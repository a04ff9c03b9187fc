package proxy

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// FuzzStripRequestHop_RDP1 parses fuzzed header lines as the server does and
// strips them as the proxy does before forwarding (Proxy.parse's checks,
// then stripRequestHop): the header written to the worker then carries no
// hop-by-hop field, no field a Connection line named (but those that
// frame or route the message), and no pinboard-* field (RFC 9110 §7.6.1,
// R-TR-5).
func FuzzStripRequestHop_RDP1(f *testing.F) {
	for _, s := range []string{
		"Connection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\nKeep-Alive: timeout=5\r\n",
		"Pinboard-Attestation: forged\r\npinboard-epoch: 1\r\nPINBOARD-X: y\r\nX-Keep: yes\r\n",
		"Connection: te,,x-a , X-B\r\nConnection: upgrade\r\nTE: trailers\r\nX-A: 1\r\nx-b: 2\r\nUpgrade: h2c\r\n",
		"Proxy-Connection: x\r\nProxy-Authorization: Basic x\r\nTrailer: X\r\nExpect: 100-continue\r\n",
		"Connection: Content-Length, Host\r\nContent-Length: 0\r\n", "Connection: pinboard-a\r\nPinboard-A: 1\r\n",
	} {
		f.Add([]byte(s))
	}
	hop := []string{"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "upgrade", "expect"}
	f.Fuzz(func(t *testing.T, lines []byte) {
		var h fasthttp.RequestHeader
		in := append(append([]byte("GET /c/a HTTP/1.1\r\nHost: w\r\n"), lines...), "\r\n"...)
		if h.Read(bufio.NewReader(bytes.NewReader(in))) != nil {
			return
		}
		found, _ := hopScan(h.All())
		if found&hopBadName != 0 || found&(hopNamed|hopReserved) != 0 && checkStripBound(&h, found) != nil {
			return // refused: 400
		}
		named := connectionNamed(h.All())
		stripRequestHop(&h, &request{}, found&^hopBadName, false)
		h.ResetConnectionClose() // the proxy's own flag, cleared in forward
		for _, line := range bytes.Split(h.Header(), []byte("\r\n"))[1:] {
			name, _, ok := bytes.Cut(line, []byte(":"))
			if !ok {
				continue
			}
			lower := strings.ToLower(string(name))
			if strings.HasPrefix(lower, "pinboard-") || lower == "transfer-encoding" {
				t.Fatalf("unexpected %q forwarded from %q", line, lines)
			}
			for _, n := range hop {
				if lower == n {
					t.Fatalf("unexpected hop-by-hop %q forwarded from %q", line, lines)
				}
			}
			for _, n := range named {
				if strings.EqualFold(n, lower) && lower != "cookie" {
					t.Fatalf("unexpected Connection-named %q forwarded from %q", line, lines)
				}
			}
		}
	})
}
