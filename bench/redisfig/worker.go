package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// fakeWorker registers with a pinboard node, heartbeats, answers the
// challenge probe and answers every instance request with 200. It checks
// nothing: it stands in for pinned so the figures measure pinboard and
// Redis, not Python.
type fakeWorker struct {
	name, url, pinboard string
	secret              string
	challenges          sync.Map // challenge → value
	session             string
}

func startWorkers(ctx context.Context, nodes []node, n int) []*fakeWorker {
	var out []*fakeWorker
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		w := &fakeWorker{
			name: "f" + strconv.Itoa(i), url: "http://" + ln.Addr().String(),
			pinboard: nodes[i%len(nodes)].url, secret: "secret-" + strconv.Itoa(i),
		}
		s := &fasthttp.Server{Handler: w.serve, NoDefaultServerHeader: true}
		go func() { _ = s.Serve(ln) }()
		if err := w.register(); err != nil {
			log.Fatal(err)
		}
		go w.heartbeats(ctx)
		out = append(out, w)
	}
	return out
}

var (
	challengePath = []byte("/_pinned/challenge")
	okBody        = []byte(`{"worker":"fake"}`)
)

func (w *fakeWorker) serve(ctx *fasthttp.RequestCtx) {
	if bytes.Equal(ctx.Path(), challengePath) {
		v, ok := w.challenges.Load(string(ctx.QueryArgs().Peek("challenge")))
		if !ok {
			ctx.SetStatusCode(404)
			return
		}
		ctx.SetContentType("application/json")
		fmt.Fprintf(ctx, `{"value":%q}`, v)
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(okBody)
}

func (w *fakeWorker) challenge() (string, string) {
	c, v := strconv.FormatInt(time.Now().UnixNano(), 36)+w.name, "v"+strconv.FormatInt(time.Now().UnixNano(), 36)
	w.challenges.Store(c, v)
	return c, v
}

func (w *fakeWorker) post(path string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, w.pinboard+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes(), nil
}

func (w *fakeWorker) register() error {
	c, v := w.challenge()
	status, body, err := w.post("/registry/register", map[string]any{
		"clientId": "client-" + w.name, "secret": w.secret, "namespaces": []string{"/counters"},
		"advertiseUrl": w.url, "headroom": 1_000_000, "draining": false, "challenge": c, "challengeValue": v,
	})
	if err != nil || status != 200 {
		return fmt.Errorf("cannot register %s: %d %s %v", w.name, status, body, err)
	}
	var ack struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(body, &ack); err != nil {
		return err
	}
	w.session = ack.SessionID
	return nil
}

func (w *fakeWorker) heartbeats(ctx context.Context) {
	t := time.NewTicker(*beat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, v := w.challenge()
		status, body, err := w.post("/registry/heartbeat", map[string]any{
			"sessionId": w.session, "headroom": 1_000_000, "draining": false, "challenge": c, "challengeValue": v,
		})
		switch {
		case err == nil && status == 409:
			if err := w.register(); err != nil {
				log.Printf("%v", err)
			}
		case err != nil || status != 200:
			log.Printf("heartbeat of %s: %d %s %v", w.name, status, body, err)
		}
	}
}
