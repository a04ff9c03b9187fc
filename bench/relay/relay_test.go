package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestHeadFraming(t *testing.T) {
	for _, tc := range []struct {
		head string
		want error
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", nil},
		{"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", nil},
		{"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", errBodied},
		{"POST / HTTP/1.1\r\nCONTENT-LENGTH:  12 \r\n\r\n", errBodied},
		{"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", errBodied},
		{"GET / HTTP/1.1\r\nX-Content-Length: 5\r\n\r\n", nil},
	} {
		if got := requestHead([]byte(tc.head)); !errors.Is(got, tc.want) {
			t.Errorf("requestHead(%q) = %v, want %v", tc.head, got, tc.want)
		}
	}
	for _, tc := range []struct {
		answer string
		n      int
		err    error
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 40, nil},
		{"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nh", -1, nil},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", -1, nil},
		{"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", 46, nil},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0, errFraming},
		{"HTTP/1.1 200 OK\r\n\r\n", 0, errFraming},
		{"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n", 0, errFraming},
		{"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", 0, errTooLarge},
		{"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", bufSize), 0, errTooLarge},
	} {
		n, err := answerLen([]byte(tc.answer))
		if n != tc.n && tc.err == nil || !errors.Is(err, tc.err) {
			t.Errorf("answerLen(%.60q) = %d, %v; want %d, %v", tc.answer, n, err, tc.n, tc.err)
		}
	}
}

// backend answers each request with its target as the body, and names
// itself in an X-Backend field; a target containing "split" gets its
// answer in two writes 2 ms apart, so that the relay must read an answer
// in parts.
func backend(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
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
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					target := strings.Fields(line)[1]
					for {
						l, err := br.ReadString('\n')
						if err != nil {
							return
						}
						if l == "\r\n" {
							break
						}
					}
					answer := fmt.Sprintf("HTTP/1.1 200 OK\r\nX-Backend: %s\r\nContent-Length: %d\r\n\r\n%s", name, len(target), target)
					if strings.Contains(target, "split") {
						c.Write([]byte(answer[:len(answer)-3]))
						time.Sleep(2 * time.Millisecond)
						answer = answer[len(answer)-3:]
					}
					if _, err := c.Write([]byte(answer)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// startRelay serves o until the test ends and returns its address.
func startRelay(t *testing.T, o Options) (string, context.CancelFunc, chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	o.Listen = "127.0.0.1:0"
	o.Ready = func(a string) { addr <- a }
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("relay did not stop within 5 s of its context ending")
		}
	})
	select {
	case a := <-addr:
		return a, cancel, done
	case err := <-done:
		t.Fatalf("relay: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("relay not ready within 5 s")
	}
	return "", nil, nil
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// readAnswer reads one Content-Length answer and returns its body.
func readAnswer(br *bufio.Reader) (string, error) {
	body, _, err := readAnswerFrom(br)
	return body, err
}

// readAnswerFrom reads one answer and returns its body and the backend
// that sent it.
func readAnswerFrom(br *bufio.Reader) (body, from string, err error) {
	n := -1
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		if l == "\r\n" {
			break
		}
		if v, ok := strings.CutPrefix(l, "Content-Length: "); ok {
			fmt.Sscanf(v, "%d", &n)
		}
		if v, ok := strings.CutPrefix(l, "X-Backend: "); ok {
			from = strings.TrimSpace(v)
		}
	}
	if n < 0 {
		return "", from, errors.New("an answer without Content-Length")
	}
	b := make([]byte, n)
	_, err = io.ReadFull(br, b)
	return string(b), from, err
}

var modes = []Mode{Goroutine, Epoll}

// runModes runs f for each shape; the Epoll shape needs Linux.
func runModes(t *testing.T, f func(t *testing.T, mode Mode)) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			if mode == Epoll && runtime.GOOS != "linux" {
				t.Skip("the epoll shape needs Linux")
			}
			f(t, mode)
		})
	}
}

func TestRelayCarriesRequestsAndAnswers(t *testing.T) {
	runModes(t, func(t *testing.T, mode Mode) {
		{
			up1, up2 := backend(t, "one"), backend(t, "two")
			addr, _, _ := startRelay(t, Options{Mode: mode, Upstreams: []string{up1, up2}, Loops: 2})
			var (
				wg   sync.WaitGroup
				mu   sync.Mutex
				seen = map[string]int{}
			)
			for k := 0; k < 8; k++ {
				c, br := dial(t, addr)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						target := fmt.Sprintf("/c%d/r%d", k, i)
						if i%50 == 7 {
							target += "/split"
						}
						fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
						got, from, err := readAnswerFrom(br)
						if err != nil || got != target {
							t.Errorf("conn %d request %d: got %q, %v; want %q", k, i, got, err, target)
							return
						}
						if i == 0 {
							mu.Lock()
							seen[from]++
							mu.Unlock()
						}
					}
					// Three requests in one write: answered in order.
					c.Write([]byte("GET /p1 HTTP/1.1\r\n\r\nGET /p2/split HTTP/1.1\r\n\r\nGET /p3 HTTP/1.1\r\n\r\n"))
					for _, want := range []string{"/p1", "/p2/split", "/p3"} {
						if got, err := readAnswer(br); err != nil || got != want {
							t.Errorf("conn %d pipelined: got %q, %v; want %q", k, got, err, want)
							return
						}
					}
				}()
			}
			wg.Wait()
			// Client connections take the backends in turn.
			if seen["one"] == 0 || seen["two"] == 0 {
				t.Errorf("unexpected spread of 8 connections over two backends; got %v; want both used", seen)
			}
		}
	})
}

// More requests in one write than the relay's buffer holds: the relay
// must come back for the rest once it has room, though no new data
// arrives to signal it.
func TestRelayPipelinedBeyondItsBuffer(t *testing.T) {
	runModes(t, func(t *testing.T, mode Mode) {
		addr, _, _ := startRelay(t, Options{Mode: mode, Upstreams: []string{backend(t, "one")}, Loops: 1})
		c, br := dial(t, addr)
		const n = 2000
		var batch strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&batch, "GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		}
		if batch.Len() <= 2*bufSize {
			t.Fatalf("the batch is %d bytes; want more than twice the buffer", batch.Len())
		}
		go c.Write([]byte(batch.String()))
		for i := 0; i < n; i++ {
			want := fmt.Sprintf("/r%d", i)
			if got, err := readAnswer(br); err != nil || got != want {
				t.Fatalf("answer %d of %d: got %q, %v; want %q", i, n, got, err, want)
			}
		}
	})
}

func TestRelayClosesOnARequestBody(t *testing.T) {
	runModes(t, func(t *testing.T, mode Mode) {
		{
			addr, _, _ := startRelay(t, Options{Mode: mode, Upstreams: []string{backend(t, "one")}, Loops: 1})
			c, br := dial(t, addr)
			fmt.Fprintf(c, "GET /ok HTTP/1.1\r\n\r\n")
			if got, err := readAnswer(br); err != nil || got != "/ok" {
				t.Fatalf("got %q, %v", got, err)
			}
			fmt.Fprintf(c, "POST /body HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
			requireClosed(t, c, br, "a request with a body")
		}
	})
}

// requireClosed fails unless the relay closed c within 2 s (EOF, or a
// reset if unread bytes were left).
func requireClosed(t *testing.T, c net.Conn, br *bufio.Reader, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := br.ReadByte()
	if err == io.EOF || errors.Is(err, syscall.ECONNRESET) {
		return
	}
	t.Fatalf("%s: read %q, %v; want the connection closed (EOF or reset)", what, b, err)
}

func TestRelayStopsWithItsContext(t *testing.T) {
	runModes(t, func(t *testing.T, mode Mode) {
		{
			addr, cancel, done := startRelay(t, Options{Mode: mode, Upstreams: []string{backend(t, "one")}, Loops: 2})
			c, br := dial(t, addr)
			fmt.Fprintf(c, "GET /a HTTP/1.1\r\n\r\n")
			if _, err := readAnswer(br); err != nil {
				t.Fatal(err)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Serve = %v after its context ended; want nil", err)
				}
				done <- nil // for the cleanup
			case <-time.After(5 * time.Second):
				t.Fatal("Serve still running 5 s after its context ended")
			}
			requireClosed(t, c, br, "a client connection after the relay stopped")
		}
	})
}

func TestServeRefusesBadOptions(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Mode: Goroutine, Listen: "127.0.0.1:0"}, "no upstream"},
		{Options{Mode: "threads", Listen: "127.0.0.1:0", Upstreams: []string{"127.0.0.1:1"}}, `unknown mode "threads"`},
		{Options{Mode: Epoll, Listen: "127.0.0.1:0", Upstreams: []string{"localhost:80"}}, `upstream "localhost:80"`},
		{Options{Mode: Epoll, Listen: "nowhere", Upstreams: []string{"127.0.0.1:1"}}, `listen address "nowhere"`},
	} {
		err := Serve(ctx, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Serve(%+v) = %v; want an error saying %q", tc.o, err, tc.want)
		}
	}
}
