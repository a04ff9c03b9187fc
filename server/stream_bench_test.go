package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/proxy"
)

// BenchmarkIdleSSEStreamMemory measures what one idle Server-Sent Event
// stream holds in a node configured as cmd/pinboard configures it: the
// Go heap and goroutine stacks in use per stream while 2,000 streams sit
// open through it, each having relayed one event. The bench harness
// measures the process's RSS at 10,000 streams (BENCHMARKS.md, goal ≤ 200
// MiB); this isolates the Go side of it from the fleet and the generator
// and needs no root or file limit beyond 8,000 descriptors. Reported as
// heap-B/stream (heap spans in use, not all of it resident) and
// stack-B/stream, per stream rather than per op: run it with -benchtime
// 1x. Inside the HTTP server a stream held about 50 KB of heap and 8 KiB
// of stack; relayed off it (proxy/events.go), about 8 KB and 2 KiB.
func BenchmarkIdleSSEStreamMemory(b *testing.B) {
	benchIdleMemory(b, "GET /events/id-%d/stream HTTP/1.1\r\nHost: pinboard\r\nAccept: text/event-stream\r\n\r\n", []byte("data: x\n\n"))
}

// BenchmarkIdleWebSocketMemory is BenchmarkIdleSSEStreamMemory for
// relayed WebSockets: 2,000 open through the node, each having relayed
// one message from the worker, then idle. About 90 KB of heap per
// WebSocket while the relay ran inside the hijack handler with two 32 KiB
// copy buffers; about 3 KB since it runs on its own and borrows them.
func BenchmarkIdleWebSocketMemory(b *testing.B) {
	benchIdleMemory(b, "GET /events/id-%d/ws HTTP/1.1\r\nHost: pinboard\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", wsHello)
}

// benchIdleMemory opens 2,000 idle streams with reqf (a format taking the
// stream's number) straight to the stand-in worker and then through a
// node, each read until first arrived, and reports what the node's
// streams added per stream.
func benchIdleMemory(b *testing.B, reqf string, first []byte) {
	const streams = 2000
	worker, workerAddr := idleWorker(b)
	url, stop := streamNode(b, worker)
	defer stop()
	// The stand-in worker and the clients live in this process too: what
	// streams opened straight to the worker cost is measured first and
	// taken off.
	direct := openStreams(b, workerAddr, reqf, first, streams)
	proxied := openStreams(b, url, reqf, first, streams)
	b.ReportMetric((proxied.heap-direct.heap)/streams, "heap-B/stream")
	b.ReportMetric((proxied.stack-direct.stack)/streams, "stack-B/stream")
}

// memDelta is what opening streams added to the heap and stacks in use.
type memDelta struct{ heap, stack float64 }

// openStreams opens n streams to addr with reqf, reads each until first
// arrived, and returns what they added; they stay open until b ends.
func openStreams(b *testing.B, addr, reqf string, first []byte, n int) memDelta {
	b.Helper()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		fmt.Fprintf(c, reqf, i)
		var got []byte
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for !bytes.Contains(got, first) {
			m, err := c.Read(buf)
			if err != nil {
				b.Fatalf("stream %d to %s: cannot read its first message: %v (got %q)", i, addr, err, got)
			}
			got = append(got, buf[:m]...)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	return memDelta{
		heap:  float64(int64(after.HeapInuse) - int64(before.HeapInuse)),
		stack: float64(int64(after.StackInuse) - int64(before.StackInuse)),
	}
}

// wsHello is a WebSocket text frame "hi" from a server (unmasked).
var wsHello = []byte{0x81, 0x02, 'h', 'i'}

// idleWorker is a stand-in worker whose every answer is an endless
// stream: a WebSocket 101 and one message for an upgrade, otherwise a
// chunked event stream with one event; then silence until the connection
// closes. It checks nothing (memory, not attestation, is measured).
func idleWorker(tb testing.TB) (url, addr string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				upgrade := false
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 {
						break
					}
					upgrade = upgrade || bytes.HasPrefix(bytes.ToLower(line), []byte("upgrade: websocket"))
				}
				if upgrade {
					_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
						"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"+string(wsHello))
				} else {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n")
				}
				_, _ = io.Copy(io.Discard, br)
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/", ln.Addr().String()
}

// streamNode starts a node as cmd/pinboard builds one, past its
// cold-start quarantine, with worker registered for /events.
func streamNode(tb testing.TB, worker string) (string, func()) {
	pp, err := attest.ParsePassport([]byte(`{"providers":[{"type":"staticToken","id":"p","keys":[{"name":"k","token":{"env":"T"},"scopes":["pinboard:worker"],"claims":{"pinboard":{"namespaces":["*"],"allowedBackendHosts":["*"]}}}]}],"namespaces":{"*":{"allow":"anonymous"}}}`),
		func(string) (string, bool) { return "tok", true })
	if err != nil {
		tb.Fatal(err)
	}
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	store := directory.NewMemory(DefaultLeaseTTL, now())
	_, err = store.Place(context.Background(), &directory.PlaceRequest{NS: "/warm", ID: "x", Now: now()})
	var q *directory.QuarantineError
	if errors.As(err, &q) {
		skew.Add(int64(q.Remaining + time.Millisecond))
	}
	if _, err := store.Register(context.Background(), &directory.Registration{
		ClientID: "client-sse", Sub: "p:worker", Secret: "s", Namespaces: []string{"/events"},
		AdvertiseURL: worker, Headroom: 1024,
	}, now()); err != nil {
		tb.Fatal(err)
	}
	pb, err := New(Options{Store: store, Passport: pp, Now: now, Upstream: proxy.UpstreamOptions{MaxConns: 1 << 16}})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pb.Serve(ctx, ln, 0) }()
	return ln.Addr().String(), func() { cancel(); <-done }
}
