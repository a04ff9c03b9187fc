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
