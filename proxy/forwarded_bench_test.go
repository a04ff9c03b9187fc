package proxy

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// BenchmarkRewriteRequestBrowser: the header edits of every forwarded
// request (rewriteRequest) on a browser's request from an untrusted
// client that sent no forwarding headers, the common case: hop-by-hop
// stripping, the three X-Forwarded headers set, field order kept.
func BenchmarkRewriteRequestBrowser(b *testing.B) {
	const raw = "GET /counters/alice/x HTTP/1.1\r\nHost: pinboard.test\r\nConnection: keep-alive\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36\r\nAccept: text/html,application/xhtml+xml\r\n" +
		"Accept-Encoding: gzip, deflate, br\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Site: none\r\n" +
		"Upgrade-Insecure-Requests: 1\r\nCache-Control: max-age=0\r\nTraceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n" +
		"Accept-Language: en\r\n\r\n"
	p := &Proxy{trusted: &TrustedProxies{}}
	var req fasthttp.Request
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 5000}, nil)
	sr := strings.NewReader(raw)
	br := bufio.NewReader(sr)
	rq := &request{}
	b.ReportAllocs()
	for b.Loop() {
		sr.Reset(raw)
		br.Reset(sr)
		if err := ctx.Request.Header.Read(br); err != nil {
			b.Fatal(err)
		}
		rq.hop = hopFound(ctx.Request.Header.All())
		p.rewriteRequest(&ctx, rq, false)
		if len(ctx.Request.Header.Peek("X-Forwarded-For")) == 0 {
			b.Fatal("no X-Forwarded-For")
		}
		ctx.Request.Header.Reset()
	}
}
