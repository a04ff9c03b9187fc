package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConcurrentMixedRequestsOwnAnswers_RDP1: whole requests of every
// size class (fits the write buffer, larger than it) and streamed ones,
// concurrent, on pooled connections (the last bytes of a whole request go
// out with the wait for its answer, rawio.SendRead): every answer is the
// request's own.
func TestConcurrentMixedRequestsOwnAnswers_RDP1(t *testing.T) {
	rg, w := newRigWorker(t, nil)
	w.route("/echo", func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(rw, "%s %s %d", r.Method, r.URL.Query().Get("n"), len(b))
	})
	bodies := []string{"", "small", strings.Repeat("x", 40<<10), strings.Repeat("y", 200<<10)}
	// Not rg.do: it fails the test from these goroutines. A hung request
	// ends at the client's timeout.
	client := &http.Client{Timeout: time.Minute}
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				body := bodies[(g+i)%len(bodies)]
				method := "POST"
				if body == "" {
					method = "GET"
				}
				n := fmt.Sprintf("%d-%d", g, i)
				req, _ := http.NewRequest(method, rg.url+"/counters/id"+fmt.Sprint(g)+"/echo?n="+n, strings.NewReader(body))
				res, err := client.Do(req)
				if err != nil {
					errs <- fmt.Sprintf("%s: %v", n, err)
					return
				}
				got, _ := io.ReadAll(res.Body)
				res.Body.Close()
				want := fmt.Sprintf("%s %s %d", method, n, len(body))
				if res.StatusCode != 200 || string(got) != want {
					errs <- fmt.Sprintf("%s: got %d %q; want %q", n, res.StatusCode, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
