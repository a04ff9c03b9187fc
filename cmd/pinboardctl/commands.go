package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

type command func(ctx context.Context, c *client, o *options, args []string, w io.Writer) error

var commands = map[string]command{
	"workers":   cmdWorkers,
	"health":    cmdHealth,
	"drain":     cmdDrain,
	"undrain":   cmdUndrain,
	"wind-down": cmdWindDown,
	"where":     cmdWhere,
}

// worker is one entry of GET /registry/workers.
type worker struct {
	ClientID      string   `json:"clientId"`
	SessionID     string   `json:"sessionId"`
	AdvertiseURL  string   `json:"advertiseUrl"`
	Namespaces    []string `json:"namespaces"`
	Headroom      float64  `json:"headroom"`
	Draining      bool     `json:"draining"`
	OperatorDrain bool     `json:"operatorDrain"`
	DrainDeadline *float64 `json:"drainDeadline"`
	Degraded      bool     `json:"degraded"`
	ExpiresInMs   int64    `json:"expiresInMs"`
	Placements    *int     `json:"placements"` // absent: the token covers only some of the worker's namespaces
	Hostname      string   `json:"hostname"`
	Env           string   `json:"env"`
}

func (wk *worker) state() string {
	switch {
	case wk.ExpiresInMs <= 0:
		return "expired"
	case wk.OperatorDrain:
		return "draining (operator)"
	case wk.Draining:
		return "draining"
	case wk.Degraded:
		return "degraded"
	}
	return "healthy"
}

func wantArgs(args []string, n int, names string) error {
	if len(args) != n {
		// "where counters/alice", the path as clients call it: two
		// arguments were wanted.
		if n == 2 && len(args) == 1 {
			if ns, id, ok := strings.Cut(strings.TrimPrefix(args[0], "/"), "/"); ok && ns != "" && id != "" && !strings.Contains(id, "/") {
				return badUsage("expected %s, got 1 argument: give the namespace and the id apart (%s %s)", names, ns, id)
			}
		}
		return badUsage("expected %s, got %d argument(s)", names, len(args))
	}
	return nil
}

func printJSON(w io.Writer, raw json.RawMessage) error {
	_, err := fmt.Fprintln(w, strings.TrimSpace(string(raw)))
	return err
}

func cmdWorkers(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 0, "no arguments"); err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/registry/workers", nil, nil, &raw); err != nil {
		return err
	}
	var body struct {
		Workers *[]worker `json:"workers"`
	}
	if json.Unmarshal(raw, &body) != nil || body.Workers == nil {
		return unexpectedAnswer(c, "GET /registry/workers", raw, false)
	}
	if o.json {
		return printJSON(w, raw)
	}
	workers := *body.Workers
	if len(workers) == 0 {
		_, err := fmt.Fprintln(w, "no live workers visible to this token")
		return err
	}
	var tw table
	tw.row("CLIENT ID", "STATE", "ADVERTISE URL", "NAMESPACES", "HEADROOM", "PLACEMENTS", "LEASE", "DRAIN DEADLINE")
	for i := range workers {
		wk := &workers[i]
		deadline := "-"
		if wk.DrainDeadline != nil {
			deadline = seconds(*wk.DrainDeadline)
		}
		placements := "-"
		if wk.Placements != nil {
			placements = strconv.Itoa(*wk.Placements)
		}
		tw.row(cell(wk.ClientID), wk.state(), cell(wk.AdvertiseURL), cell(strings.Join(wk.Namespaces, ",")),
			strconv.FormatFloat(wk.Headroom, 'f', -1, 64), placements,
			(time.Duration(wk.ExpiresInMs) * time.Millisecond).String(), deadline)
	}
	return tw.write(w)
}

func cmdHealth(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 0, "no arguments"); err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/registry/health", nil, nil, &raw); err != nil {
		return err
	}
	var h struct {
		OK           *bool  `json:"ok"`
		Store        string `json:"store"`
		QuarantineMs int64  `json:"quarantineMs"`
		LeaseTTLMs   int64  `json:"leaseTtlMs"`
		Workers      int    `json:"workers"`
	}
	if json.Unmarshal(raw, &h) != nil || h.OK == nil || h.Store == "" {
		return unexpectedAnswer(c, "GET /registry/health", raw, false)
	}
	if o.json {
		return printJSON(w, raw)
	}
	status := "ok"
	if !*h.OK {
		status = "not ok"
	}
	_, err := fmt.Fprintf(w, "%s: store=%s workers=%d leaseTtl=%s quarantine=%s\n", status, h.Store, h.Workers,
		time.Duration(h.LeaseTTLMs)*time.Millisecond, time.Duration(h.QuarantineMs)*time.Millisecond)
	if err == nil && h.QuarantineMs > 0 {
		_, err = fmt.Fprintln(w, "cold start: new placements answer 503 until the quarantine ends")
	}
	return err
}

func cmdDrain(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 1, "CLIENT_ID"); err != nil {
		return err
	}
	if o.revoke {
		return badUsage("drain takes --deadline, not --revoke (use undrain)")
	}
	body := map[string]any{"clientId": args[0]}
	if o.deadline != "" {
		s, err := parseDeadline(o.deadline)
		if err != nil {
			return err
		}
		body["deadline"] = s
	}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodPost, "/registry/drain", nil, body, &raw); err != nil {
		return withClientHint(err, args[0])
	}
	var out struct {
		ClientID      string   `json:"clientId"`
		Draining      bool     `json:"draining"`
		DrainDeadline *float64 `json:"drainDeadline"`
	}
	if json.Unmarshal(raw, &out) != nil || out.ClientID != args[0] || !out.Draining {
		return unexpectedAnswer(c, "POST /registry/drain", raw, true)
	}
	// A timed drain answers its drainDeadline and an untimed one none
	// (PROTOCOL.md §6): an answer without it to --deadline is a drain
	// whose ids are never force-released, and one with it to a drain
	// without --deadline releases them when none was meant.
	if (out.DrainDeadline != nil) != (o.deadline != "") {
		want := "an untimed drain, without drainDeadline"
		if o.deadline != "" {
			want = "a drainDeadline for --deadline " + o.deadline
		}
		return fmt.Errorf("POST /registry/drain: unexpected answer %q: want %s; the worker is draining, check its deadline with 'pinboardctl workers' (is %s pinboard itself, with its base path?)",
			clip(strings.TrimSpace(string(raw)), 200), want, c.urlName)
	}
	if o.json {
		return printJSON(w, raw)
	}
	msg := fmt.Sprintf("draining %s: no new placements", args[0])
	if out.DrainDeadline != nil {
		msg += "; its ids are released in " + seconds(*out.DrainDeadline)
	}
	_, err := fmt.Fprintln(w, msg)
	return err
}

func cmdUndrain(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 1, "CLIENT_ID"); err != nil {
		return err
	}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodPost, "/registry/undrain", nil, map[string]any{"clientId": args[0]}, &raw); err != nil {
		return withClientHint(err, args[0])
	}
	var out struct {
		ClientID string `json:"clientId"`
		Draining *bool  `json:"draining"`
	}
	if json.Unmarshal(raw, &out) != nil || out.ClientID != args[0] || out.Draining == nil || *out.Draining {
		return unexpectedAnswer(c, "POST /registry/undrain", raw, true)
	}
	if o.json {
		return printJSON(w, raw)
	}
	// The worker learns of it from its next heartbeat ack: until then it
	// still declines new ids itself (503 "host draining; retry").
	_, err := fmt.Fprintf(w, "undrained %s: pinboard places new ids on it again; the worker takes them from its next heartbeat\n", args[0])
	return err
}

// unexpectedAnswer is a 2xx that is not pinboard's answer: a front end's
// login page or catch-all. Reporting success then would tell the operator
// a drain happened when nothing did, or hand a script a page for the
// worker list (with --json too: it prints only what pinboard answered).
func unexpectedAnswer(c *client, req string, raw []byte, change bool) error {
	b := clip(strings.TrimSpace(string(raw)), 200)
	what := "it is not pinboard's"
	if change {
		what = "nothing was changed as far as pinboardctl can tell"
	}
	return fmt.Errorf("%s: unexpected answer %q: %s (is %s pinboard itself, with its base path?)", req, b, what, c.urlName)
}

// withClientHint explains pinboard's 404 on drain and undrain; another 404
// is not about the worker (apiError names the URL's source then).
func withClientHint(err error, clientID string) error {
	if ae, ok := err.(*apiError); ok && ae.Status == http.StatusNotFound && ae.Message == msgUnknownClient {
		return fmt.Errorf("%w: no live worker has clientId %q (list them with 'pinboardctl workers'; a restarted worker has a new one)", err, clientID)
	}
	return err
}

func cmdWindDown(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 2, "NAMESPACE ID"); err != nil {
		return err
	}
	if (o.deadline == "") == !o.revoke {
		return badUsage("wind-down needs exactly one of --deadline D or --revoke")
	}
	body := map[string]any{"namespace": namespace(args[0]), "id": args[1], "deadline": nil}
	what := "wind-down revoked"
	if !o.revoke {
		s, err := parseDeadline(o.deadline)
		if err != nil {
			return err
		}
		body["deadline"] = s
		what = "wind-down within " + seconds(s)
	}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodPost, "/registry/wind-down", nil, body, &raw); err != nil {
		return withPlacementHint(ctx, c, err, args[0], args[1])
	}
	var out struct {
		MsgID     string `json:"msgId"`
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(raw, &out) != nil || out.MsgID == "" {
		return unexpectedAnswer(c, "POST /registry/wind-down", raw, true)
	}
	if o.json {
		return printJSON(w, raw)
	}
	_, err := fmt.Fprintf(w, "%s/%s: %s (msgId %s, session %s; delivered with its next heartbeat)\n",
		namespace(args[0]), args[1], what, out.MsgID, out.SessionID)
	return err
}

// The operator API's 400s for a namespace or id it refuses
// (registry/errors.go): they name the request's shape, which the operator
// never wrote.
const (
	msgPlacementShape = "expected ?namespace=&id="
	msgWindDownShape  = "expected { namespace, id, deadline }"
)

// withPlacementHint explains pinboard's 404 and 400 on where and
// wind-down. A 404 "no placement" for a namespace no worker serves is most
// often a typo ("counter" for "counters"): the workers' namespaces are
// listed then, rather than sending the operator after an id that could
// never have been placed.
func withPlacementHint(ctx context.Context, c *client, err error, ns, id string) error {
	ae, ok := err.(*apiError)
	if !ok {
		return err
	}
	switch {
	case ae.Status == http.StatusBadRequest && (ae.Message == msgPlacementShape || ae.Message == msgWindDownShape):
		return fmt.Errorf("%w (pinboard refused the namespace %q or the id %q: an id is 1 to 256 characters of A-Z a-z 0-9 . _ ~ -, not . or ..; a namespace is one a worker registers, like counters or /counters)", err, ns, id)
	case ae.Status == http.StatusNotFound && ae.Message == msgNoPlacement:
		if served, ok := servedNamespaces(ctx, c); ok && !slices.Contains(served, namespace(ns)) {
			if len(served) == 0 {
				return fmt.Errorf("%w: nothing owns %s/%s, and no live worker visible to this token serves %s (there are none: 'pinboardctl workers')", err, cell(namespace(ns)), cell(id), cell(namespace(ns)))
			}
			return fmt.Errorf("%w: nothing owns %s/%s, and no live worker visible to this token serves %s (served: %s)", err, cell(namespace(ns)), cell(id), cell(namespace(ns)), cell(strings.Join(served, ", ")))
		}
		return fmt.Errorf("%w: nothing owns %s/%s (its next request through pinboard places it)", err, cell(namespace(ns)), cell(id))
	}
	return err
}

// servedNamespaces lists, sorted, the namespaces of the live workers the
// token sees; ok is false when pinboard did not answer with its list.
func servedNamespaces(ctx context.Context, c *client) ([]string, bool) {
	var body struct {
		Workers *[]worker `json:"workers"`
	}
	if c.do(ctx, http.MethodGet, "/registry/workers", nil, nil, &body) != nil || body.Workers == nil {
		return nil, false
	}
	var served []string
	for _, wk := range *body.Workers {
		for _, n := range wk.Namespaces {
			if !slices.Contains(served, n) {
				served = append(served, n)
			}
		}
	}
	slices.Sort(served)
	return served, true
}

func cmdWhere(ctx context.Context, c *client, o *options, args []string, w io.Writer) error {
	if err := wantArgs(args, 2, "NAMESPACE ID"); err != nil {
		return err
	}
	q := url.Values{"namespace": {namespace(args[0])}, "id": {args[1]}}
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/registry/placement", q, nil, &raw); err != nil {
		return withPlacementHint(ctx, c, err, args[0], args[1])
	}
	var p struct {
		Namespace    string `json:"namespace"`
		ID           string `json:"id"`
		SessionID    string `json:"sessionId"`
		ClientID     string `json:"clientId"`
		AdvertiseURL string `json:"advertiseUrl"`
		Epoch        string `json:"epoch"`
		Live         *bool  `json:"live"`
	}
	if json.Unmarshal(raw, &p) != nil || p.ClientID == "" || p.SessionID == "" || p.Live == nil {
		return unexpectedAnswer(c, "GET /registry/placement", raw, false)
	}
	if o.json {
		return printJSON(w, raw)
	}
	live := "live"
	if !*p.Live {
		live = "owner's lease lapsed: re-places on the next request"
	}
	_, err := fmt.Fprintf(w, "%s/%s -> %s at %s (session %s, epoch %s, %s)\n",
		cell(p.Namespace), cell(p.ID), cell(p.ClientID), cell(p.AdvertiseURL), cell(p.SessionID), cell(p.Epoch), live)
	return err
}

// cell renders a string a worker or client chose (a clientId, a
// namespace, an id) for the terminal: as it is when every rune prints,
// else Go-quoted. The registry refuses only NUL in a clientId and white
// space in a namespace, so a worker token could register a tab (shifting
// the table's columns), a newline (forging a row) or a terminal escape
// sequence (writing to the operator's screen).
func cell(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// namespace accepts "counters" or "/counters".
func namespace(s string) string {
	if strings.HasPrefix(s, "/") {
		return s
	}
	return "/" + s
}

// parseDeadline reads a Go duration (5m, 90s, 1h30m) or a number of
// seconds, and returns seconds.
func parseDeadline(s string) (float64, error) {
	n, ok := readSeconds(s)
	switch {
	case !ok:
		return 0, badUsage("--deadline must be a duration like 30s or 5m, or seconds, got %q", s)
	case n < 0:
		return 0, badUsage("--deadline must not be negative, got %q", s)
	}
	return n, nil
}

// readSeconds reads a number of seconds ("300", "0.5") or a Go duration
// ("5m", "90s"), as --deadline and --timeout take them.
func readSeconds(s string) (float64, bool) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f, !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	d, err := time.ParseDuration(s)
	return d.Seconds(), err == nil
}

// seconds renders a seconds count as a duration ("4m59.5s").
func seconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(100 * time.Millisecond).String()
}
