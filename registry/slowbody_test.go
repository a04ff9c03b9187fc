package registry

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A registry body that trickles in — sent by a slow link, or by a client
// that sends its header and a few bytes and then one byte per stall
// timeout — is read off the registry pool: read on the pool, it held a
// slot for as long as it kept moving (up to 1 MiB at one byte a minute),
// and as many such requests as the pool has workers kept every other
// worker's heartbeat queued until their leases lapsed (R-LS-1, R-REG-7).
func TestSlowBodyReadOffPool_RLS1_RREG7(t *testing.T) {
	h := newHarness(t)
	r := h.registryWith(Options{ProbeTimeout: time.Second, Workers: 1, MinWorkers: 1, Queue: 64})
	h.r = r
	healthy := h.register(nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{
		Handler:           func(ctx *fasthttp.RequestCtx) { r.ServeHTTP(ctx, ctx.Path()) },
		StreamRequestBody: true,
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })

	// Each slow request sends its header and the start of its body, then
	// nothing more until the test ends.
	for _, path := range []string{"/registry/release", "/registry/heartbeat"} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		start := "[" + strings.Repeat(" ", 64<<10)
		_, err = c.Write([]byte("POST " + path + " HTTP/1.1\r\nHost: pinboard\r\nAuthorization: Bearer " + workerToken +
			"\r\nContent-Type: application/json\r\nContent-Length: 200000\r\n\r\n" + start))
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond) // the slow requests reach the registry
	h.wantBeatAnswered(r, healthy, 3*time.Second, "a body that trickles in")
}
