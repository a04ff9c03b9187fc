package fleet

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// ChurnResult counts what one churn run did.
type ChurnResult struct {
	Left   int `json:"left"`
	Joined int `json:"joined"`
	Errors int `json:"errors"`
}

// Churn makes one random worker leave and a new one join every `every`
// until the returned stop is called; the number of workers stays the same.
func (f *Fleet) Churn(ctx context.Context, every, grace time.Duration) (stop func() ChurnResult) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu  sync.Mutex
		res ChurnResult
		wg  sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ws := f.Workers()
			var live []*Worker
			for _, w := range ws {
				if w.Session() != "" {
					live = append(live, w)
				}
			}
			if len(live) > 1 {
				err := f.Leave(ctx, live[rand.IntN(len(live))], grace)
				mu.Lock()
				res.Left++
				if err != nil {
					res.Errors++
				}
				mu.Unlock()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := f.Join(ctx)
				mu.Lock()
				res.Joined++
				if err != nil {
					res.Errors++
				}
				mu.Unlock()
			}()
		}
	}()
	return func() ChurnResult {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return res
	}
}

// WorkerInfo is a worker as the control API lists it. It includes the
// secret: baselines mint attestations with it to reach workers directly.
type WorkerInfo struct {
	Index        int    `json:"index"`
	ClientID     string `json:"clientId"`
	AdvertiseURL string `json:"advertiseUrl"`
	SessionID    string `json:"sessionId"`
	Secret       string `json:"secret"`
}

// ControlHandler is the fleet's control API when it runs as its own
// process (pinbench fleet). Loopback only: it hands out worker secrets.
//
//	GET  /workers          [WorkerInfo…]
//	GET  /ports            [port…]
//	GET  /stats[?reset=1]  Snapshot
//	POST /pause, /resume   heartbeats off and on
//	POST /churn?every=MS&grace=MS, POST /churn/stop → ChurnResult
//	POST /streams/close    ends every SSE and WebSocket stream → count
func (f *Fleet) ControlHandler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	var (
		mu        sync.Mutex
		stopChurn func() ChurnResult
	)
	mux.HandleFunc("GET /workers", func(w http.ResponseWriter, r *http.Request) {
		var out []WorkerInfo
		for _, wk := range f.Workers() {
			out = append(out, WorkerInfo{wk.Index, wk.ClientID, wk.AdvertiseURL, wk.Session(), wk.Secret})
		}
		writeJSON(w, out)
	})
	mux.HandleFunc("GET /ports", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, f.Ports()) })
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, f.stats.Snapshot(r.URL.Query().Get("reset") == "1"))
	})
	mux.HandleFunc("POST /pause", func(w http.ResponseWriter, r *http.Request) { f.Pause(); writeJSON(w, true) })
	mux.HandleFunc("POST /resume", func(w http.ResponseWriter, r *http.Request) { f.Resume(); writeJSON(w, true) })
	mux.HandleFunc("POST /streams/close", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, f.CloseStreams()) })
	mux.HandleFunc("POST /churn", func(w http.ResponseWriter, r *http.Request) {
		every := msParam(r, "every", 500*time.Millisecond)
		grace := msParam(r, "grace", 2*time.Second)
		mu.Lock()
		defer mu.Unlock()
		if stopChurn == nil {
			stopChurn = f.Churn(ctx, every, grace)
		}
		writeJSON(w, true)
	})
	mux.HandleFunc("POST /churn/stop", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		var res ChurnResult
		if stopChurn != nil {
			res = stopChurn()
			stopChurn = nil
		}
		writeJSON(w, res)
	})
	return mux
}

func msParam(r *http.Request, name string, def time.Duration) time.Duration {
	if n, err := strconv.Atoi(r.URL.Query().Get(name)); err == nil && n > 0 {
		return time.Duration(n) * time.Millisecond
	}
	return def
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
