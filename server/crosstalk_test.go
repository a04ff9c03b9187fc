package server

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/proxy"
)

// Many clients at once, each pipelining a few requests for ids of one
// worker whose answers misbehave in the ways of the response matrix
// (respdesync_test.go) — bytes after the framed body, a 204 or a HEAD
// answer with one, interim answers, trailers, a body cut short, a body
// ended by the close, an event stream — each carrying a smuggled answer
// behind it: every answer a client reads is its own request's, never
// another client's and never the smuggled one (R-DP-1, R-DP-3). The
// matrix runs one exchange at a time; here the worker connections are
// few (MaxConns 4) and reused at once, under load. Only bytes the worker
// sends after a pause (no proxy can tell them from the next answer) are
// left out.
func TestConcurrentMisbehavingAnswersStayWithTheirRequests_RDP1_RDP3(t *testing.T) {
	addr := rawWorkerNode(t, crossWorker, proxy.UpstreamOptions{IdleTimeout: time.Minute, MaxConns: 4})
	kinds := []string{"ok", "extra", "chunk", "nc", "head", "big", "interim", "trailer", "untilclose", "short", "sse"}
	var answers atomic.Int64
	var mu sync.Mutex
	var wrong []string
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				for _, w := range crossExchange(addr, kinds, g, i, &answers) {
					mu.Lock()
					wrong = append(wrong, w)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("unexpected answers read by the wrong request (%d of %d): %v", len(wrong), answers.Load(), wrong[:min(len(wrong), 10)])
	}
	if answers.Load() < 100 {
		t.Fatalf("unexpected few answers in 2 s; got %d; want 100 at least", answers.Load())
	}
}

// crossExchange pipelines one to three requests of random kinds on a
// connection of its own, each with a token of its own, and reads their
// answers; it returns those that were not their request's.
func crossExchange(addr string, kinds []string, g, i int, answers *atomic.Int64) (wrong []string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	type sent struct{ kind, tok string }
	var reqs []sent
	var b strings.Builder
	for j := range 1 + rand.IntN(3) {
		k := kinds[rand.IntN(len(kinds))]
		tok := fmt.Sprintf("T%d-%d-%d", g, i, j)
		method := "GET"
		if k == "head" {
			method = "HEAD"
		}
		fmt.Fprintf(&b, "%s /counters/id%d/%s?tok=%s HTTP/1.1\r\nHost: pb\r\n\r\n", method, rand.IntN(5), k, tok)
		reqs = append(reqs, sent{k, tok})
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil
	}
	br := bufio.NewReader(c)
	for _, r := range reqs {
		var req *http.Request
		if r.kind == "head" {
			req, _ = http.NewRequest("HEAD", "/", nil)
		}
		res, err := http.ReadResponse(br, req)
		if err != nil {
			return wrong // the worker cut an answer: the connection ends
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		answers.Add(1)
		got := string(body)
		var ok bool
		switch {
		case strings.Contains(got, "SMUGGLED"):
		case res.StatusCode >= 500:
			ok = err == nil // refused: pinboard's own answer
		case r.kind == "short":
			ok = err != nil && strings.HasPrefix(r.tok, got) // cut short, never whole
		case err != nil:
			return wrong
		case r.kind == "nc" || r.kind == "head":
			ok = got == ""
		case r.kind == "big":
			ok = strings.HasPrefix(got, r.tok+".")
		default:
			ok = got == r.tok
		}
		if !ok {
			wrong = append(wrong, fmt.Sprintf("%s %s: %d %.40q", r.kind, r.tok, res.StatusCode, got))
		}
		if err != nil || res.Close {
			return wrong
		}
	}
	return wrong
}

const crossSmuggled = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nSMUGGLED"

// crossWorker answers each request by the kind its path ends with, the
// request's token (its query's tok) as the body, and a smuggled answer
// right behind where the kind allows one.
func crossWorker(ln net.Listener) {
	acceptEach(ln, func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			tok := req.URL.Query().Get("tok")
			sized := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(tok), tok)
			var out string
			switch req.URL.Path[strings.LastIndexByte(req.URL.Path, '/')+1:] {
			case "ok":
				out = sized
			case "extra":
				out = sized + crossSmuggled
			case "chunk":
				out = fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(tok), tok) + crossSmuggled
			case "nc":
				out = "HTTP/1.1 204 No Content\r\n\r\n" + crossSmuggled
			case "head":
				out = sized // a HEAD answer with a body
			case "big":
				body := tok + strings.Repeat(".", 100000-len(tok))
				out = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body) + crossSmuggled
			case "interim":
				out = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + sized
			case "trailer":
				out = fmt.Sprintf("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\nContent-Length: 8\r\n\r\n", len(tok), tok)
			case "untilclose":
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n"+tok)
				return
			case "short":
				_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(tok)+10, tok)
				return
			case "sse":
				out = fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(tok), tok) + crossSmuggled
			}
			if _, err := io.WriteString(c, out); err != nil {
				return
			}
		}
	})
}
