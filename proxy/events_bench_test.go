package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinboard-go/pinboard/directory"
)

// BenchmarkEventRelay is one Server-Sent Event's way through the proxy on
// an open stream (R-DP-2): the stand-in worker writes and flushes an event
// when told, the client reads it whole, and ns/op is that round — the
// worker's write, the proxy's read and write, the client's read — in an
// otherwise idle process. The SSE scenario measures the same way under
// load, where the machine's scheduling dominates (BENCHMARKS.md); this
// one tells a change to the relay's own cost apart from that.
func BenchmarkEventRelay(b *testing.B) {
	next := make(chan struct{})
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		f := w.(http.Flusher)
		f.Flush()
		for {
			select {
			case <-next:
				_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
				f.Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	defer worker.Close()

	now := time.Now()
	store := directory.NewMemory(time.Hour, now)
	if _, err := store.Register(context.Background(), &directory.Registration{
		ClientID: "c", Sub: "dev", Secret: "4f1c2b9e8d7a6c5b4f1c2b9e8d7a6c5b", Namespaces: []string{"/bench"},
		AdvertiseURL: worker.URL + "/", Headroom: 100, Instances: map[string][]string{"/bench": {"alice"}},
	}, now); err != nil {
		b.Fatal(err)
	}
	var srv *fasthttp.Server
	p := New(Options{Store: store, Passport: benchPassport(b), Now: func() time.Time { return now },
		Resume: func(c net.Conn) error { return srv.ServeConn(c) }})
	srv = &fasthttp.Server{
		Handler: p.ServeHTTP, StreamRequestBody: true, NoDefaultServerHeader: true,
		NoDefaultDate: true, NoDefaultContentType: true, KeepHijackedConns: true,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() { p.CloseStreams(); _ = srv.Shutdown() }()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /bench/alice/events HTTP/1.1\r\nHost: pinboard.test\r\nAccept: text/event-stream\r\n\r\n")
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != http.StatusOK {
		b.Fatalf("cannot open the event stream: %v %v", res, err)
	}
	events := bufio.NewReader(res.Body)
	b.ReportAllocs()
	for b.Loop() {
		next <- struct{}{}
		for {
			line, err := events.ReadSlice('\n')
			if err != nil {
				b.Fatalf("cannot read an event: %v", err)
			}
			if len(line) == 1 { // the blank line that ends an event
				break
			}
		}
	}
}
