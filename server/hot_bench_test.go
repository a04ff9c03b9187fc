package server

import (
	"bufio"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkNodeHotPath measures a node configured as cmd/pinboard builds
// one (raw listener, header, body and idle timeouts, write deadlines,
// metrics off) proxying hot ids: keep-alive clients, the node and a
// stand-in worker all in this process, so ns/op is the CPU of all three
// per request and allocs/op counts all three too (the clients and the
// worker allocate nothing per request either). proxy.BenchmarkHotPath
// isolates the proxy; this adds what the server around it does per
// request — fasthttp's connection loop, its deadlines, Handle.
func BenchmarkNodeHotPath(b *testing.B) {
	url := jsonWorker(b)
	node, stop := streamNode(b, url)
	defer stop()
	raw := []byte("GET /events/alice/json HTTP/1.1\r\nHost: pinboard.test\r\nUser-Agent: pinbench\r\n\r\n")
	b.ReportAllocs()
	b.SetParallelism(4)
	cpu0 := processCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", node)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var resp fasthttp.Response
		for pb.Next() {
			if _, err := c.Write(raw); err != nil {
				b.Error(err)
				return
			}
			if err := resp.Read(br); err != nil || resp.StatusCode() != fasthttp.StatusOK {
				b.Errorf("unexpected response: %v %d", err, resp.StatusCode())
				return
			}
		}
	})
	// CPU time is steadier than ns/op on a shared machine: another
	// tenant's load stretches the wall clock more than it does the CPU
	// each request costs.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// jsonWorker is a stand-in worker answering every request with a small
// JSON body over keep-alive connections. It checks nothing: the node's
// per-request cost, not attestation, is measured.
func jsonWorker(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	body := []byte(`{"ok":true,"value":42}`)
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("application/json")
			ctx.SetBody(body)
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String() + "/"
}
