package registry

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// rawAnswer is a probe answer for challenge c, framed plainly.
func rawAnswer(c string) string {
	body := `{"value":"v-` + c + `"}`
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// A server at the advertise URL that frames its first answer with both
// Content-Length and Transfer-Encoding (RFC 9112 section 6.3: "ought to
// be handled as an error") and whose Content-Length covers a second,
// stale answer must not leave that answer on a pooled connection for the
// next probe to read: the next probe would see another challenge's value
// and void a healthy session (R-REG-1, R-LS-3).
func TestProbeAmbiguousFramingNotPooled_RREG1(t *testing.T) {
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
					if first.CompareAndSwap(false, true) {
						body := `{"value":"v-` + c + `"}`
						chunked := strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\n\r\n"
						stale := rawAnswer(c)
						head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
							strconv.Itoa(len(chunked)+len(stale)) + "\r\nTransfer-Encoding: chunked\r\n\r\n"
						conn.Write([]byte(head + chunked))
						// The rest arrives after the client has read the chunked body.
						time.Sleep(100 * time.Millisecond)
						conn.Write([]byte(stale))
						continue
					}
					conn.Write([]byte(rawAnswer(c)))
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
}
