package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/directory"
)

// TestStreamBufferSwap: a connection relaying a streamed body reads it
// through a small buffer (bytes the header buffer had already read carry
// over), then gets a header-size buffer back and is reused: the next
// response's 12 KiB header still parses (R-DP-2, R-DP-3).
func TestStreamBufferSwap(t *testing.T) {
	rg := newRig(t, nil)
	secret := "secret-swap"
	var session atomic.Value
	session.Store("")
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := attest.VerifyAttestation(r.Header.Get("pinboard-attestation"), []byte(secret), []string{session.Load().(string)}, time.Now()); err != nil {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/stream"):
			// Header and first chunk leave in one write: the proxy's header
			// buffer reads past the header.
			for i := 0; i < 10; i++ {
				fmt.Fprintf(w, "chunk-%d;", i)
				w.(http.Flusher).Flush()
			}
		case strings.HasSuffix(r.URL.Path, "/big"):
			w.Header().Set("X-Big", strings.Repeat("b", 12<<10))
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"ok":true}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	rg.warm()
	res, err := rg.store.Register(t.Context(), &directory.Registration{
		ClientID: "client-swap", Sub: "p:worker", Secret: secret, Namespaces: []string{"/ns"},
		AdvertiseURL: srv.URL, Headroom: 10,
	}, rg.now())
	if err != nil {
		t.Fatal(err)
	}
	session.Store(res.SessionID)

	for i := 0; i < 3; i++ {
		resp, body := rg.get("/ns/a/stream", nil)
		want := ""
		for j := 0; j < 10; j++ {
			want += fmt.Sprintf("chunk-%d;", j)
		}
		if resp.StatusCode != 200 || body != want {
			t.Fatalf("unexpected stream %d; got %d %q", i, resp.StatusCode, body)
		}
		resp, body = rg.get("/ns/a/big", nil)
		if resp.StatusCode != 200 || body != `{"ok":true}` || len(resp.Header.Get("X-Big")) != 12<<10 {
			t.Fatalf("unexpected answer with a 12 KiB header after a stream; got %d %q (X-Big %d bytes)", resp.StatusCode, body, len(resp.Header.Get("X-Big")))
		}
	}
	if n := conns.Load(); n >= 6 {
		t.Fatalf("unexpected worker connections; got %d for 6 requests; want some reused", n)
	}
}

// TestStreamReaderCarryAndRestore: at the pool level, bytes read past
// the header carry over into the small stream buffer; a clean end gives
// the header-size buffer back; bytes beyond the body forbid reuse.
func TestStreamReaderCarryAndRestore(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pool := newConnPool(ln.Addr().String(), func(addr string) (net.Conn, error) { return net.Dial("tcp", addr) },
		(&UpstreamOptions{}).withDefaults())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	pc, _, err := pool.get(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.discard(pc)
	srv := <-accepted
	defer srv.Close()
	if _, err := srv.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.br.ReadSlice('\n'); err != nil { // status line
		t.Fatal(err)
	}
	for { // header lines up to the blank one
		line, err := pc.br.ReadSlice('\n')
		if err != nil {
			t.Fatal(err)
		}
		if len(line) == 2 {
			break
		}
	}
	big := pc.br
	pool.streamReader(pc)
	if pc.br == big || pc.br.Size() != streamBufSize {
		t.Fatalf("unexpected stream buffer; got size %d", pc.br.Size())
	}
	got := make([]byte, 10)
	if _, err := io.ReadFull(pc.br, got); err != nil || string(got) != "5\r\nhello\r\n" {
		t.Fatalf("unexpected carried bytes; got %q, %v", got, err)
	}
	if !pool.endStream(pc) || pc.br.Size() != pool.bufSize || pc.src != nil {
		t.Fatalf("unexpected state after a clean end; got size %d", pc.br.Size())
	}
	// Bytes beyond the body: the connection must not be reused.
	pool.streamReader(pc)
	if _, err := srv.Write([]byte("junk")); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.br.Peek(1); err != nil {
		t.Fatal(err)
	}
	if pool.endStream(pc) {
		t.Fatal("unexpected reuse of a connection with bytes beyond the body")
	}
}

// TestCarriedBytesReleasedOnceRead_RDP2: the bytes a header buffer had read
// past the header (up to BufferSize, 16 KiB) are let go once the stream
// buffer read them. Resliced to nothing they still pinned their array,
// for as long as an idle event stream lasted (R-DP-2).
func TestCarriedBytesReleasedOnceRead_RDP2(t *testing.T) {
	r := &carryReader{pending: append(make([]byte, 0, 8<<10), "data: 1\n\n"...)}
	p := make([]byte, 4)
	for {
		n, err := r.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if n < len(p) || len(r.pending) == 0 {
			break
		}
	}
	if r.pending != nil {
		t.Fatalf("unexpected carried bytes after they were read; got an empty slice of their %d-byte array; want nil", 8<<10)
	}
}
