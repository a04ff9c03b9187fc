package bench

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A large body cut short is an error, not a transfer: the large-bodies
// scenario timed whatever arrived, so a proxy that ended a download early,
// or passed an upload on only in part, with a clean end of message,
// counted as a fast transfer (issue 5: the large-bodies figures).
func TestTransferCutShortIsAnError(t *testing.T) {
	const size = 1 << 20
	var short atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/upload"):
			n, _ := io.Copy(io.Discard, r.Body)
			if short.Load() {
				n--
			}
			fmt.Fprintf(w, `{"bytes":%d}`, n)
		case strings.HasSuffix(r.URL.Path, "/download"):
			want, _ := strconv.Atoi(r.URL.Query().Get("size"))
			if short.Load() {
				want /= 2
			}
			w.Header().Set("Content-Length", strconv.Itoa(want))
			_, _ = w.Write(make([]byte, want))
		case strings.HasSuffix(r.URL.Path, "/other"):
			_, _ = io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, `{"ok":true}`)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	down := fmt.Sprintf("/a/b/download?size=%d", size)
	if n, err := Transfer(addr, "/a/b/upload", nil, true, size, 10*time.Second); err != nil || n != size {
		t.Fatalf("unexpected whole upload; got %d, %v; want %d", n, err, size)
	}
	if n, err := Transfer(addr, down, nil, false, size, 10*time.Second); err != nil || n != size {
		t.Fatalf("unexpected whole download; got %d, %v; want %d", n, err, size)
	}
	if _, err := Transfer(addr, "/a/b/other", nil, true, size, 10*time.Second); err == nil || !strings.Contains(err.Error(), "unexpected answer to an upload") {
		t.Fatalf("unexpected upload answered without a count; got %v; want an error", err)
	}
	short.Store(true)
	if n, err := Transfer(addr, "/a/b/upload", nil, true, size, 10*time.Second); err == nil || n != size-1 {
		t.Fatalf("unexpected upload the worker received in part; got %d, %v; want an error and %d", n, err, size-1)
	}
	if n, err := Transfer(addr, down, nil, false, size, 10*time.Second); err == nil || n != size/2 {
		t.Fatalf("unexpected download cut short; got %d, %v; want an error and %d", n, err, size/2)
	}
}
