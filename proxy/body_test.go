package proxy

import (
	"bufio"
	"strings"
	"testing"
)

// A chunk-size line is the size, optional white space and an extension,
// and CRLF (RFC 9112 §7.1, §7.1.1); anything else is a malformed body,
// as net/http and fasthttp read it (R-DP-2).
func TestChunkHeader_RDP2(t *testing.T) {
	cases := map[string]int64{
		"5\r\n": 5, "5;ext=1\r\n": 5, "5 \r\n": 5, "5\t; a=\"b\"\r\n": 5, "fFfFfFfFfFfFfFf\r\n": 0xfffffffffffffff, "0\r\n": 0,
		"5\rX\n": -1, "5 junk\r\n": -1, "5\n": -1, "5\r\r\n": -1, "5;a\rb\r\n": -1, "\r\n": -1, "\n": -1, " 5\r\n": -1,
		"0x5\r\n": -1, "5\r": -1, "0000000000000005\r\n": -1, "-5\r\n": -1,
	}
	for line, want := range cases {
		b := &upstreamBody{pc: &pconn{br: bufio.NewReader(strings.NewReader(line))}}
		got, err := b.chunkHeader()
		if want < 0 && err == nil || want >= 0 && (err != nil || got != want) {
			t.Errorf("unexpected chunkHeader(%q); got %d, %v; want %d", line, got, err, want)
		}
	}
}
