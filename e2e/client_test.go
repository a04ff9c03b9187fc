package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// httpClient talks only to 127.0.0.1: no proxy from the environment, no
// transparent gzip (tests see bytes as the proxy sent them).
var httpClient = &http.Client{
	Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// reply is a fully read response.
type reply struct {
	Method  string
	URL     string
	Status  int
	Header  http.Header
	Body    []byte
	Elapsed time.Duration
}

// String reads like `GET /x → 503 {"error":"…"} (Retry-After: 1) in 3ms`.
func (r reply) String() string {
	body := string(r.Body)
	if len(body) > 512 {
		body = body[:512] + "…"
	}
	s := fmt.Sprintf("%s %s → %d %s", r.Method, r.URL, r.Status, strings.TrimSpace(body))
	if ra := r.Header.Get("Retry-After"); ra != "" {
		s += " (Retry-After: " + ra + ")"
	}
	return s + " in " + r.Elapsed.Round(time.Millisecond).String()
}

// JSON decodes the body into v.
func (r reply) JSON(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("cannot decode JSON of %s: %w", r, err)
	}
	return nil
}

// do sends one request and reads the whole response.
func do(ctx context.Context, method, url string, header http.Header, body io.Reader) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return reply{}, fmt.Errorf("cannot build request %s %s: %w", method, url, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	start := time.Now()
	res, err := httpClient.Do(req)
	if err != nil {
		return reply{Method: method, URL: url}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	r := reply{Method: method, URL: url, Status: res.StatusCode, Header: res.Header, Body: b, Elapsed: time.Since(start)}
	if err != nil {
		return r, fmt.Errorf("cannot read body of %s: %w", r, err)
	}
	return r, nil
}

// retryAfter parses a Retry-After header (delta-seconds, possibly
// fractional, or an HTTP date); ok is false when it is absent or invalid.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil && secs >= 0 {
		return time.Duration(secs * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t), true
	}
	return 0, false
}

// doWithRetry sends a body-less request, retrying while the answer is 503
// (cold-start quarantine R-CS-1, or nothing can serve R-DP-4), sleeping for
// Retry-After (250ms when absent, at least 50ms) until ctx ends. It returns
// the first non-503 reply; on timeout it returns the last 503 and an error.
func doWithRetry(ctx context.Context, method, url string, header http.Header) (reply, error) {
	for {
		r, err := do(ctx, method, url, header, nil)
		if err != nil || r.Status != http.StatusServiceUnavailable {
			return r, err
		}
		wait, ok := retryAfter(r.Header)
		if !ok {
			wait = 250 * time.Millisecond
		}
		wait = max(wait, 50*time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			wait = time.Until(dl)
		}
		if !sleepCtx(ctx, wait) || ctx.Err() != nil {
			return r, fmt.Errorf("still 503 when the deadline passed: %s", r)
		}
	}
}

// getWithRetry is doWithRetry for GET without extra headers.
func getWithRetry(ctx context.Context, url string) (reply, error) {
	return doWithRetry(ctx, http.MethodGet, url, nil)
}

// errorBody is the data plane's and registry's error shape (R-DP-4).
type errorBody struct {
	Error string `json:"error"`
}

// ---------------------------------------------------------------------------
// Registry API (R-REG-4, R-REG-5)

// WorkerRecord is one entry of GET /registry/workers. Pointer fields tell
// "absent" from zero.
type WorkerRecord struct {
	ClientID     string   `json:"clientId"`
	SessionID    string   `json:"sessionId"`
	AdvertiseURL string   `json:"advertiseUrl"`
	Namespaces   []string `json:"namespaces"`
	Headroom     *float64 `json:"headroom"`
	Draining     *bool    `json:"draining"`
	Degraded     *bool    `json:"degraded"`
	ExpiresInMs  *float64 `json:"expiresInMs"`
}

// Workers calls GET /registry/workers with the operator token. On a non-200
// the records are nil and the reply tells why.
func (pb *Pinboard) Workers(ctx context.Context) ([]WorkerRecord, reply, error) {
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/workers", pb.operator(), nil)
	if err != nil || r.Status != http.StatusOK {
		return nil, r, err
	}
	var body struct {
		Workers []WorkerRecord `json:"workers"`
	}
	if err := r.JSON(&body); err != nil {
		return nil, r, err
	}
	return body.Workers, r, nil
}

// Health is GET /registry/health.
type Health struct {
	OK           bool     `json:"ok"`
	QuarantineMs *float64 `json:"quarantineMs"`
}

func (pb *Pinboard) Health(ctx context.Context) (Health, reply, error) {
	var h Health
	r, err := do(ctx, http.MethodGet, pb.URL+"/registry/health", pb.operator(), nil)
	if err != nil || r.Status != http.StatusOK {
		return h, r, err
	}
	return h, r, r.JSON(&h)
}

// ---------------------------------------------------------------------------
// Counter helpers

// answerOf asks node once which worker serves /counters/{id}: the
// worker's name when it answers 200, "" and the reply otherwise.
func answerOf(ctx context.Context, node *Pinboard, id string) (string, reply, error) {
	r, err := do(ctx, http.MethodGet, node.URL+"/counters/"+id+"/whoami", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		return "", r, err
	}
	var body struct {
		Worker string `json:"worker"`
	}
	return body.Worker, r, r.JSON(&body)
}

// whoami asks which worker serves /counters/{id}, retrying on 503.
func whoami(ctx context.Context, pb *Pinboard, id string) (string, reply, error) {
	r, err := getWithRetry(ctx, pb.URL+"/counters/"+id+"/whoami")
	if err != nil {
		return "", r, err
	}
	if r.Status != http.StatusOK {
		return "", r, fmt.Errorf("unexpected status; got %s; want 200", r)
	}
	var body struct {
		Worker string `json:"worker"`
		ID     string `json:"id"`
	}
	if err := r.JSON(&body); err != nil {
		return "", r, err
	}
	if body.ID != id {
		return "", r, fmt.Errorf("unexpected id; got %q; want %q (%s)", body.ID, id, r)
	}
	return body.Worker, r, nil
}
