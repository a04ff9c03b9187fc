package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

// fake is an operator API stand-in that records the last request.
type fake struct {
	method, path, query, auth string
	body                      map[string]any
}

func (f *fake) server(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.method, f.path, f.query, f.auth = r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization")
		f.body = nil
		if b, _ := io.ReadAll(r.Body); len(b) > 0 {
			_ = json.Unmarshal(b, &f.body)
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case f.auth != "Bearer good":
			w.WriteHeader(401)
			io.WriteString(w, `{"error":"unauthorized"}`)
		case r.URL.Path == "/pb/registry/workers":
			io.WriteString(w, `{"workers":[{"clientId":"c1","sessionId":"s1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/counters","/tickers"],"headroom":96,"draining":true,"operatorDrain":true,"drainDeadline":299.5,"degraded":false,"expiresInMs":15000,"placements":3},`+
				`{"clientId":"c2","sessionId":"s2","advertiseUrl":"http://10.0.0.2:8000","namespaces":["/counters"],"headroom":5,"draining":false,"operatorDrain":false,"degraded":false,"expiresInMs":9000}]}`)
		case r.URL.Path == "/pb/registry/drain" && f.body["clientId"] == "nope":
			w.WriteHeader(404)
			io.WriteString(w, `{"error":"unknown clientId"}`)
		case r.URL.Path == "/pb/registry/drain" && f.body["deadline"] == nil:
			io.WriteString(w, `{"clientId":"c1","draining":true}`)
		case r.URL.Path == "/pb/registry/drain":
			io.WriteString(w, `{"clientId":"c1","draining":true,"drainDeadline":300}`)
		case r.URL.Path == "/pb/registry/undrain":
			io.WriteString(w, `{"clientId":"c1","draining":false}`)
		case r.URL.Path == "/pb/registry/wind-down":
			io.WriteString(w, `{"msgId":"0123456789abcdef","sessionId":"s1"}`)
		default:
			w.WriteHeader(503)
			w.Header().Set("Retry-After", "1")
			io.WriteString(w, `{"error":"not the serving fleet"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runCtl(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String(), errb.String()
}

func TestWorkersTable(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb/", "PINBOARD_TOKEN": "good"}
	code, out, errs := runCtl(t, env, "workers")
	if code != 0 {
		t.Fatalf("unexpected exit %d; stderr %s", code, errs)
	}
	for _, want := range []string{"CLIENT ID", "c1", "draining (operator)", "/counters,/tickers", "15s", "4m59.5s"} {
		if !strings.Contains(out, want) {
			t.Errorf("unexpected table without %q:\n%s", want, out)
		}
	}
	// PLACEMENTS: a count, or "-" where pinboard left it out (the token
	// covers only some of the worker's namespaces, R-TR-3).
	for _, row := range map[string][]string{
		"c1": {"c1", "draining (operator)", "http://10.0.0.1:8000", "/counters,/tickers", "96", "3", "15s", "4m59.5s"},
		"c2": {"c2", "healthy", "http://10.0.0.2:8000", "/counters", "5", "-", "9s", "-"},
	} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == row[0] {
				found = true
				if strings.Join(f, " ") != strings.Join(row, " ") {
					t.Errorf("unexpected row for %s; got %q; want %q", row[0], strings.Join(f, " "), strings.Join(row, " "))
				}
			}
		}
		if !found {
			t.Errorf("unexpected table without a row for %s:\n%s", row[0], out)
		}
	}
	code, out, _ = runCtl(t, env, "workers", "--json")
	if code != 0 || !json.Valid([]byte(out)) || !strings.Contains(out, `"clientId":"c1"`) {
		t.Fatalf("unexpected --json output (exit %d): %s", code, out)
	}
}

func TestFlagsAfterArguments(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	code, out, errs := runCtl(t, env, "drain", "c1", "--deadline", "5m")
	if code != 0 {
		t.Fatalf("unexpected exit %d; stderr %s", code, errs)
	}
	if f.method != "POST" || f.path != "/pb/registry/drain" || f.body["clientId"] != "c1" || f.body["deadline"] != 300.0 {
		t.Fatalf("unexpected request %s %s %v", f.method, f.path, f.body)
	}
	if !strings.Contains(out, "released in 5m0s") {
		t.Errorf("unexpected output %q", out)
	}
	code, _, _ = runCtl(t, env, "wind-down", "counters", "alice", "--revoke")
	if code != 0 || f.body["namespace"] != "/counters" || f.body["id"] != "alice" || f.body["deadline"] != nil {
		t.Fatalf("unexpected wind-down request (exit %d): %v", code, f.body)
	}
	if _, ok := f.body["deadline"]; !ok {
		t.Fatalf("unexpected wind-down body without deadline: %v", f.body)
	}
	code, _, _ = runCtl(t, env, "--json", "wind-down", "/counters", "alice", "--deadline", "30")
	if code != 0 || f.body["deadline"] != 30.0 {
		t.Fatalf("unexpected wind-down request (exit %d): %v", code, f.body)
	}
}

func TestExitCodes(t *testing.T) {
	f := &fake{}
	url := f.server(t).URL + "/pb"
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		err  string
	}{
		{"no command", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, nil, exitUsage, "Usage"},
		{"unknown command", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, []string{"frobnicate"}, exitUsage, "unknown command"},
		{"no url", map[string]string{"PINBOARD_TOKEN": "good"}, []string{"workers"}, exitUsage, "PINBOARD_URL is not set"},
		{"no token", map[string]string{"PINBOARD_URL": url}, []string{"workers"}, exitUsage, "PINBOARD_TOKEN is not set"},
		{"wind-down without deadline", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, []string{"wind-down", "ns", "id"}, exitUsage, "exactly one of"},
		{"bad deadline", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, []string{"drain", "c1", "--deadline", "soon"}, exitUsage, "--deadline"},
		{"401", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "bad"}, []string{"workers"}, exitAuth, "401 unauthorized"},
		{"unknown client", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, []string{"drain", "nope"}, exitAPI, `no live worker has clientId "nope"`},
		{"503", map[string]string{"PINBOARD_URL": url, "PINBOARD_TOKEN": "good"}, []string{"health"}, exitAPI, "503 not the serving fleet"},
		{"unreachable", map[string]string{"PINBOARD_URL": "http://127.0.0.1:1", "PINBOARD_TOKEN": "good"}, []string{"health"}, exitUnreachable, "cannot reach pinboard"},
		// A scheme is case-insensitive (RFC 3986 §3.1), as Go's and the
		// worker's clients take it.
		{"upper-case scheme", map[string]string{"PINBOARD_URL": strings.Replace(url, "http://", "HTTP://", 1), "PINBOARD_TOKEN": "good"}, []string{"health"}, exitAPI, "503 not the serving fleet"},
		{"other scheme", map[string]string{"PINBOARD_URL": "ftp://127.0.0.1:1", "PINBOARD_TOKEN": "good"}, []string{"health"}, exitUsage, "must start with http:// or https://"},
		// User info in the URL is never sent (the token is) and is not
		// echoed in the error either.
		{"user info", map[string]string{"PINBOARD_URL": "http://op:s3cret@127.0.0.1:1", "PINBOARD_TOKEN": "good"}, []string{"health"}, exitUsage, "PINBOARD_URL must not carry a user or password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := runCtl(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(errs, tc.err) {
				t.Fatalf("unexpected result; got exit %d, stderr %q; want exit %d with %q", code, errs, tc.code, tc.err)
			}
			if strings.Contains(errs, "s3cret") {
				t.Fatalf("unexpected password in the error: %q", errs)
			}
		})
	}
}

func TestParseDeadline(t *testing.T) {
	for in, want := range map[string]float64{"5m": 300, "90s": 90, "1h30m": 5400, "300": 300, "0.5": 0.5, "0": 0} {
		got, err := parseDeadline(in)
		if err != nil || got != want {
			t.Errorf("unexpected parseDeadline(%q); got %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "-5m", "soon", ""} {
		if _, err := parseDeadline(in); err == nil {
			t.Errorf("unexpected parseDeadline(%q) without error", in)
		}
	}
}

// A token read from a file or a Kubernetes Secret often ends in a newline.
// It cannot go into a header as is: it used to fail as "cannot reach
// pinboard" (exit 3), sending the operator after the network. The URL is
// trimmed the same way.
func TestTokenWithTrailingNewline(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb\n", "PINBOARD_TOKEN": "good\n"}
	code, out, errs := runCtl(t, env, "workers")
	if code != exitOK || !strings.Contains(out, "c1") {
		t.Fatalf("unexpected result; got exit %d, stdout %q, stderr %q; want exit 0 with the table", code, out, errs)
	}
	env["PINBOARD_TOKEN"] = "go\x00od"
	if code, _, errs := runCtl(t, env, "workers"); code != exitUsage || !strings.Contains(errs, "PINBOARD_TOKEN") {
		t.Fatalf("unexpected result for a token with a control character; got exit %d, stderr %q; want exit %d naming PINBOARD_TOKEN", code, errs, exitUsage)
	}
}

// Bad input is a usage error (exit 2) naming what is wrong, never an
// unreachable pinboard (3) or an API error (1).
func TestBadInputIsUsage(t *testing.T) {
	f := &fake{}
	url := f.server(t).URL + "/pb"
	for _, tc := range []struct {
		url  string
		args []string
		err  string
	}{
		{url, []string{"--timeout", "0", "workers"}, "--timeout"},
		{url, []string{"--timeout", "-1s", "workers"}, "--timeout"},
		{url, []string{"--timeout", "-3", "workers"}, "--timeout"},
		{url, []string{"--timeout", "abc", "workers"}, "like 30s or 2m, or seconds"},
		{url, []string{"--timeout", "NaN", "workers"}, "like 30s or 2m, or seconds"},
		{url, []string{"--timeout", "1e300", "workers"}, "like 30s or 2m, or seconds"},
		{url, []string{"drain", "c1", "--deadline", "NaN"}, "--deadline"},
		{url, []string{"drain", "c1", "--deadline", "Inf"}, "--deadline"},
		{url, []string{"wind-down", "ns", "id", "--deadline", "+Inf"}, "--deadline"},
		{"http://[::1", []string{"health"}, "PINBOARD_URL"},
		{"http://host /pb", []string{"health"}, "PINBOARD_URL"},
		{"http://", []string{"health"}, "PINBOARD_URL"},
		{url + "?x=1", []string{"health"}, "PINBOARD_URL"},
	} {
		code, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": tc.url, "PINBOARD_TOKEN": "good"}, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.err) {
			t.Errorf("unexpected result for %q %v; got exit %d, stderr %q; want exit %d naming %s", tc.url, tc.args, code, errs, exitUsage, tc.err)
		}
	}
}

// After "--" every argument is positional: a namespace or id that starts
// with "-" (an id like "-1") must get through. Only the first one did.
func TestDoubleDashEndsFlags(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	code, _, errs := runCtl(t, env, "wind-down", "--deadline", "5s", "--", "-ns", "-1")
	if code != exitOK || f.body["namespace"] != "/-ns" || f.body["id"] != "-1" {
		t.Fatalf("unexpected wind-down after --; got exit %d, stderr %q, body %v; want exit 0 for /-ns and -1", code, errs, f.body)
	}
	pos, err := parseInterspersed(newTestFlags(), []string{"--json", "--", "a", "--json", "--"})
	if err != nil || strings.Join(pos, " ") != "a --json --" {
		t.Fatalf("unexpected positional arguments; got %q, %v; want %q", pos, err, "a --json --")
	}
}

func newTestFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("json", false, "")
	return fs
}

// A drain, undrain or wind-down that did not reach pinboard's operator
// API must not print a success: a front end that redirects to a login
// page, or answers 200 with a page of its own, used to get
// "draining c1: no new placements" and exit 0.
func TestMutationsNeedPinboardsAnswer_RREG6_RCM1(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/redirect/") {
			http.Redirect(w, r, "/login", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html>sign in</html>")
	}))
	t.Cleanup(srv.Close)
	for _, base := range []string{srv.URL + "/redirect", srv.URL + "/page"} {
		env := map[string]string{"PINBOARD_URL": base, "PINBOARD_TOKEN": "good"}
		for _, args := range [][]string{
			{"drain", "c1"},
			{"drain", "c1", "--deadline", "5m"},
			{"undrain", "c1"},
			{"wind-down", "counters", "alice", "--deadline", "30s"},
			{"wind-down", "counters", "alice", "--revoke"},
		} {
			code, out, errs := runCtl(t, env, args...)
			if code != exitAPI || out != "" {
				t.Errorf("unexpected result for %v at %s; got exit %d, stdout %q, stderr %q; want exit %d and no output", args, base, code, out, errs, exitAPI)
			}
		}
	}
}

// The reads must not pass off a front end's answer as pinboard's either:
// with --json, workers, health and where printed a login page (or any
// JSON catch-all) unchanged and exited 0, so a script piping them into
// jq saw success; without it, a JSON catch-all read as "no live
// workers" or an empty health line. docs/OPERATIONS.md promises exit 1
// for "a 2xx that is not pinboard's answer" (R-REG-4, R-REG-5).
func TestReadsNeedPinboardsAnswer_RREG4_RREG5(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/redirect/"):
			http.Redirect(w, r, "/login", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/json/"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"status":"ok"}`)
		default:
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, "<html>sign in</html>")
		}
	}))
	t.Cleanup(srv.Close)
	for _, base := range []string{srv.URL + "/redirect", srv.URL + "/page", srv.URL + "/json"} {
		env := map[string]string{"PINBOARD_URL": base, "PINBOARD_TOKEN": "good"}
		for _, args := range [][]string{
			{"workers"}, {"workers", "--json"},
			{"health"}, {"health", "--json"},
			{"where", "counters", "alice"}, {"where", "counters", "alice", "--json"},
		} {
			want := "unexpected answer"
			if strings.HasSuffix(base, "/redirect") {
				want = "pinboard does not redirect" // reported, not followed to the page
			}
			code, out, errs := runCtl(t, env, args...)
			if code != exitAPI || out != "" || !strings.Contains(errs, want) {
				t.Errorf("unexpected result for %v at %s; got exit %d, stdout %q, stderr %q; want exit %d, no output and %q", args, base, code, out, errs, exitAPI, want)
			}
		}
	}
}

// A wind-down deadline given in seconds ("--deadline 300", which the
// documentation allows) was echoed as "within 300", with no unit; it
// reads as the duration sent, as drain's does (R-CM-1).
func TestWindDownEchoesDuration_RCM1(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	for in, want := range map[string]string{"300": "within 5m0s", "30s": "within 30s", "1h30m": "within 1h30m0s", "0.5": "within 500ms"} {
		code, out, errs := runCtl(t, env, "wind-down", "counters", "alice", "--deadline", in)
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("unexpected result for --deadline %s; got exit %d, stdout %q, stderr %q; want %q", in, code, out, errs, want)
		}
	}
}

// An undrain takes effect at pinboard at once, but the pinned worker hears
// it only in its next heartbeat ack (within its heartbeat_interval, 3 s by
// default) and declines new ids itself until then (503 "host draining;
// retry"). The CLI said "it takes new placements again", and the request an
// operator sent right after it was refused (R-REG-6).
func TestUndrainSaysWhenTheWorkerTakesIds_RREG6(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	code, out, errs := runCtl(t, env, "undrain", "c1")
	if code != exitOK || f.path != "/pb/registry/undrain" || f.body["clientId"] != "c1" {
		t.Fatalf("unexpected result; got exit %d, request %s %v, stderr %q; want exit 0 after POST /pb/registry/undrain", code, f.path, f.body, errs)
	}
	if !strings.Contains(out, "undrained c1") || !strings.Contains(out, "next heartbeat") || strings.Contains(out, "takes new placements again") {
		t.Errorf("unexpected output %q; want it to say the worker takes new ids from its next heartbeat", out)
	}
}

// --deadline and --revoke belong to drain and wind-down. Elsewhere they
// were dropped without a word: "undrain c1 --deadline 5m" undrained at
// once, "where ns id --revoke" looked an id up. A flag that does nothing
// is a usage error, as "drain --revoke" already was (R-REG-6).
func TestFlagsForOtherCommandsRefused_RREG6(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{
		{"undrain", "c1", "--deadline", "5m"},
		{"undrain", "c1", "--revoke"},
		{"workers", "--deadline", "5m"},
		{"health", "--revoke"},
		{"where", "counters", "alice", "--revoke"},
		{"where", "counters", "alice", "--deadline", "30s"},
	} {
		f.method = ""
		code, out, errs := runCtl(t, env, args...)
		if code != exitUsage || out != "" || f.method != "" || !strings.Contains(errs, args[0]+" takes no --") {
			t.Errorf("unexpected result for %v; got exit %d, stdout %q, stderr %q, request %q; want exit %d, no request, %q", args, code, out, errs, f.method, exitUsage, args[0]+" takes no --")
		}
	}
}

// A PINBOARD_URL without pinboard's base path reaches the data plane,
// which answers 404 "unknown namespace" for /registry/… . drain and
// undrain read every 404 as pinboard's "unknown clientId" and told the
// operator the worker was gone ("no live worker has clientId"), where
// and wind-down that "nothing owns" the id: the operator went after the
// fleet, not the URL. Only pinboard's own 404s get those hints; another
// 404 points at PINBOARD_URL (R-REG-6).
func TestNotFoundFromElsewhereNamesTheURL_RREG6(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(404)
		io.WriteString(w, `{"error":"unknown namespace"}`)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{
		{"drain", "c1"},
		{"undrain", "c1"},
		{"where", "counters", "alice"},
		{"wind-down", "counters", "alice", "--deadline", "30s"},
		{"workers"},
	} {
		code, _, errs := runCtl(t, env, args...)
		if code != exitAPI || strings.Contains(errs, "no live worker") || strings.Contains(errs, "nothing owns") || !strings.Contains(errs, "base path") {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d pointing at PINBOARD_URL's base path, not at the worker or the id", args, code, errs, exitAPI)
		}
	}
	// pinboard's own 404s keep their hints.
	f := &fake{}
	env["PINBOARD_URL"] = f.server(t).URL + "/pb"
	if code, _, errs := runCtl(t, env, "drain", "nope"); code != exitAPI || !strings.Contains(errs, `no live worker has clientId "nope"`) || strings.Contains(errs, "base path") {
		t.Errorf("unexpected result for pinboard's unknown clientId; got exit %d, stderr %q; want exit %d with the clientId hint only", code, errs, exitAPI)
	}
}

// A redirect in front of pinboard is reported, not followed: pinboard
// never sends one, and followed, a drain's POST came back a GET (a 404 or
// 405 blamed on the base path) and the bearer token was dropped on
// another host (a 401 blamed on the token). The command fails with the
// redirect's target, and nothing reaches the target (R-REG-6).
func TestRedirectReportedNotFollowed_RREG6(t *testing.T) {
	var reached atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(200)
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(target.Close)
	for _, status := range []int{301, 302, 307, 308} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+r.URL.Path, status)
		}))
		t.Cleanup(srv.Close)
		env := map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}
		for _, args := range [][]string{{"drain", "c1"}, {"workers"}} {
			code, out, errs := runCtl(t, env, args...)
			if code != exitAPI || out != "" || !strings.Contains(errs, fmt.Sprintf(": %d ", status)) ||
				!strings.Contains(errs, "pinboard does not redirect") || !strings.Contains(errs, target.URL) || strings.Count(errs, "\n") != 1 || strings.Contains(errs, "href") {
				t.Errorf("unexpected result for %v answered %d; got exit %d, stdout %q, stderr %q; want exit %d naming the redirect's target", args, status, code, out, errs, exitAPI)
			}
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("unexpected requests at the redirect's target; got %d; want 0", n)
	}
}

// Worker-chosen strings reach the table as registered: the registry
// refuses only NUL in a clientId, and a namespace only white space, so a
// worker token could register a clientId with a tab, a newline or a
// terminal escape. Printed raw, a tab shifted the row's columns, a
// newline forged a second row, and an escape sequence wrote to the
// operator's terminal (R-REG-4). Such a cell is printed quoted.
func TestWorkersTableQuotesControlCharacters_RREG4(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/registry/placement" {
			io.WriteString(w, `{"namespace":"/b","id":"x","sessionId":"s1","clientId":"c1\nc2","advertiseUrl":"http://10.0.0.1:8000","epoch":"0","live":true}`)
			return
		}
		io.WriteString(w, `{"workers":[`+
			`{"clientId":"c1\tfake\nc2 healthy","sessionId":"s1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/a\u001b[2J"],"headroom":1,"expiresInMs":15000,"placements":0},`+
			`{"clientId":"c3","sessionId":"s3","advertiseUrl":"http://10.0.0.3:8000","namespaces":["/b"],"headroom":1,"expiresInMs":15000,"placements":0}]}`)
	}))
	t.Cleanup(srv.Close)
	code, out, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "workers")
	if code != exitOK {
		t.Fatalf("unexpected exit; got %d; want 0 (stderr %q)", code, errs)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("unexpected line count; got %d; want 3 (a header and two workers):\n%s", len(lines), out)
	}
	if strings.ContainsRune(out, 0x1b) || strings.ContainsRune(out, '\t') {
		t.Errorf("unexpected control character in the table; got %q; want none", out)
	}
	for _, want := range []string{`"c1\tfake\nc2 healthy"`, `"/a\x1b[2J"`} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("unexpected first row; got %q; want it to contain %s", lines[1], want)
		}
	}
	// Every row's columns start where the header's do.
	col := strings.Index(lines[0], "STATE")
	for _, l := range lines[1:] {
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("unexpected row alignment; got %q; want STATE at byte %d as in %q", l, col, lines[0])
		}
	}
	code, out, errs = runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "where", "b", "x")
	if code != exitOK || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"c1\nc2"`) {
		t.Errorf("unexpected where output; got exit %d, %q (stderr %q); want one line with the clientId quoted", code, out, errs)
	}
}

// A namespace in Chinese or Japanese is allowed (the registry refuses only
// white space and '/' in one), and its characters take two columns on a
// terminal. The table padded by runes, so every column after such a
// namespace started one column further right per character than the
// header's (R-REG-4).
func TestWorkersTableAlignsWideCharacters_RREG4(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"workers":[`+
			`{"clientId":"c1","sessionId":"s1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/计数器"],"headroom":7,"expiresInMs":15000,"placements":0},`+
			`{"clientId":"c2","sessionId":"s2","advertiseUrl":"http://10.0.0.2:8000","namespaces":["/counters"],"headroom":8,"expiresInMs":15000,"placements":0}]}`)
	}))
	t.Cleanup(srv.Close)
	code, out, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "workers")
	if code != exitOK {
		t.Fatalf("unexpected exit; got %d; want 0 (stderr %q)", code, errs)
	}
	// column is where s starts on a terminal: CJK ideographs take two.
	column := func(line, s string) int {
		i := strings.Index(line, s)
		if i < 0 {
			return -1
		}
		n := 0
		for _, r := range line[:i] {
			n++
			if r >= 0x4e00 && r <= 0x9fff {
				n++
			}
		}
		return n
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("unexpected table; got %q; want a header and two rows", out)
	}
	want := column(lines[0], "HEADROOM")
	for i, v := range []string{" 7 ", " 8 "} {
		if got := column(lines[i+1], v) + 1; got != want {
			t.Errorf("unexpected HEADROOM column in row %d; got %d; want %d:\n%s", i+1, got, want, out)
		}
	}
}

// An error page from a proxy in front of pinboard (nginx's 502) is HTML
// over several lines. Its body went to stderr as it came, CR LF included,
// so the one-line error ("pinboardctl workers: …") became several lines,
// and a long one was cut inside a UTF-8 sequence. The body is quoted when
// it does not print, and cut between characters.
func TestErrorBodyOnOneLine(t *testing.T) {
	page := "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\x1b[31m" + strings.Repeat("é", 150) + "</body>\r\n</html>\r\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, page)
	}))
	t.Cleanup(srv.Close)
	code, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "workers")
	if code != exitAPI {
		t.Fatalf("unexpected exit; got %d; want %d (stderr %q)", code, exitAPI, errs)
	}
	if strings.Count(errs, "\n") != 1 || strings.ContainsAny(errs, "\r\x1b") || !utf8.ValidString(errs) {
		t.Errorf("unexpected stderr; got %q; want one line of valid UTF-8 without control characters", errs)
	}
	if !strings.Contains(errs, "502") || !strings.Contains(errs, "Bad Gateway") {
		t.Errorf("unexpected stderr; got %q; want the status and the page's title", errs)
	}
}

// An empty --deadline, as a script's "--deadline $D" with D unset sends
// it, was taken for no --deadline: drain then drained without one (its
// ids never released) and reported success. It is a usage error, and no
// request is sent (R-REG-6).
func TestEmptyDeadlineRefused_RREG6(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{
		{"drain", "c1", "--deadline", ""},
		{"drain", "c1", "--deadline="},
		{"undrain", "c1", "--deadline", ""},
		{"wind-down", "counters", "alice", "--revoke", "--deadline", ""},
	} {
		f.method = ""
		code, out, errs := runCtl(t, env, args...)
		if code != exitUsage || out != "" || f.method != "" || !strings.Contains(errs, "--deadline") {
			t.Errorf("unexpected result for %q; got exit %d, stdout %q, stderr %q, request %q; want exit %d, no request, naming --deadline", args, code, out, errs, f.method, exitUsage)
		}
	}
}

// A JSON error from something in front of pinboard (an API gateway's
// {"error":…}) went to stderr as it came: a line break in it split the
// one-line error, an escape sequence reached the operator's terminal.
// It is quoted like an error page; pinboard's own messages print as they
// are, and keep their hints.
func TestJSONErrorOnOneLine_RREG4_RREG6(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, `{"error":"upstream failed\r\nretry later \u001b[31m`+strings.Repeat("é", 150)+`"}`)
	}))
	t.Cleanup(srv.Close)
	code, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "workers")
	if code != exitAPI {
		t.Fatalf("unexpected exit; got %d; want %d (stderr %q)", code, exitAPI, errs)
	}
	if strings.Count(errs, "\n") != 1 || strings.ContainsAny(errs, "\r\x1b") || !utf8.ValidString(errs) || !strings.Contains(errs, "upstream failed") {
		t.Errorf("unexpected stderr; got %q; want one line of valid UTF-8 without control characters, with the message", errs)
	}
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	if code, _, errs := runCtl(t, env, "drain", "nope"); code != exitAPI || !strings.Contains(errs, `404 unknown clientId: no live worker has clientId "nope"`) {
		t.Errorf("unexpected drain of an unknown client; got exit %d, stderr %q; want pinboard's message with its hint", code, errs)
	}
}

// A PINBOARD_URL with a user and password is refused without echoing the
// password — also when url.Parse refuses it (a bad port, a space, an
// unclosed bracket) or it has no scheme: those were echoed whole, under
// a "must start with http://" that did not say what was wrong. (No
// requirement id: pinboardctl's own configuration; it cited R-REG-5, the
// health endpoint's quarantineMs, which it never reaches.)
func TestMalformedURLPasswordNotEchoed(t *testing.T) {
	for _, u := range []string{
		"http://op:s3cret@127.0.0.1:notaport",
		"http://op:s3cret@[::1",
		"https://op:s3cret@host /pb",
		"op:s3cret@127.0.0.1:8080",
		"ftp://op:s3cret@host",
	} {
		code, out, errs := runCtl(t, map[string]string{"PINBOARD_URL": u, "PINBOARD_TOKEN": "good"}, "health")
		if code != exitUsage || out != "" || !strings.Contains(errs, "PINBOARD_URL") {
			t.Errorf("unexpected result for %q; got exit %d, stdout %q, stderr %q; want exit %d naming PINBOARD_URL", u, code, out, errs, exitUsage)
		}
		if strings.Contains(errs, "s3cret") {
			t.Errorf("unexpected password in the error for %q: %q", u, errs)
		}
	}
	// An "@" in the path is no user info: the value shows as given.
	if _, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": "http://host:notaport/pb@x", "PINBOARD_TOKEN": "good"}, "health"); !strings.Contains(errs, `"http://host:notaport/pb@x"`) {
		t.Errorf("unexpected error for a path holding @; got %q; want the value as given", errs)
	}
}

// Error hints name where the URL and the token came from: with the right
// PINBOARD_TOKEN set and a wrong --token passed, "PINBOARD_TOKEN was not
// accepted" sent the operator to check the one value that was right
// (R-REG-6, the operator API's errors).
func TestErrorHintsNameFlagsWhenFlagsGiven_RREG6(t *testing.T) {
	f := &fake{}
	srv := f.server(t)
	env := map[string]string{"PINBOARD_URL": srv.URL + "/pb", "PINBOARD_TOKEN": "good"}
	code, _, errs := runCtl(t, env, "workers", "--token", "wrong")
	if code != exitAuth || !strings.Contains(errs, "(--token was not accepted") {
		t.Fatalf("unexpected result with a wrong --token; got exit %d, stderr %q; want exit %d naming --token", code, errs, exitAuth)
	}
	env["PINBOARD_TOKEN"] = "wrong"
	if code, _, errs = runCtl(t, env, "workers"); code != exitAuth || !strings.Contains(errs, "(PINBOARD_TOKEN was not accepted") {
		t.Fatalf("unexpected result with a wrong PINBOARD_TOKEN; got exit %d, stderr %q; want exit %d naming PINBOARD_TOKEN", code, errs, exitAuth)
	}
	env["PINBOARD_TOKEN"] = "good"
	dataPlane := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(404)
		io.WriteString(w, `{"error":"unknown namespace"}`)
	}))
	t.Cleanup(dataPlane.Close)
	if code, _, errs = runCtl(t, env, "workers", "--url", dataPlane.URL); code != exitAPI || !strings.Contains(errs, "(is --url pinboard itself") {
		t.Fatalf("unexpected result with a wrong --url; got exit %d, stderr %q; want exit %d naming --url", code, errs, exitAPI)
	}
	if code, _, errs = runCtl(t, env, "workers", "--url", "ftp://x"); code != exitUsage || !strings.Contains(errs, `--url "ftp://x" must start with http://`) {
		t.Fatalf("unexpected result with an ftp --url; got exit %d, stderr %q; want exit %d naming --url", code, errs, exitUsage)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	if code, _, errs = runCtl(t, env, "workers", "--url", closed.URL); code != exitUnreachable || !strings.Contains(errs, "(check --url and that pinboard is running)") {
		t.Fatalf("unexpected result with an unreachable --url; got exit %d, stderr %q; want exit %d naming --url", code, errs, exitUnreachable)
	}
	// An empty flag is the flag's fault, whatever the variable holds.
	if code, _, errs = runCtl(t, env, "workers", "--url", " "); code != exitUsage || !strings.Contains(errs, "--url is empty") {
		t.Fatalf("unexpected result with an empty --url; got exit %d, stderr %q; want exit %d naming --url", code, errs, exitUsage)
	}
	if code, _, errs = runCtl(t, env, "workers", "--token", ""); code != exitUsage || !strings.Contains(errs, "--token is empty") {
		t.Fatalf("unexpected result with an empty --token; got exit %d, stderr %q; want exit %d naming --token", code, errs, exitUsage)
	}
}

// A PINBOARD_URL with a base path pinboard does not have reaches the data
// plane, which on a fresh directory answers every request — /pinboard/
// registry/health included — 503 "cold start: placements resume in …"
// with Retry-After: one lease after the first placement attempt (which
// that very call makes). pinboardctl printed it with "(retry after 15s)",
// so the operator waited for a cold start the operator API never reports
// (GET /registry/health answers 200 with quarantineMs); only after it
// did a 404 "unknown namespace" point at the URL. A 503 only the data
// plane answers points at PINBOARD_URL at once, without the retry hint;
// the operator API's own 503s keep it (R-REG-6).
func TestDataPlaneUnavailableNamesTheURL_RREG6(t *testing.T) {
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "15")
		w.WriteHeader(503)
		io.WriteString(w, body.Load().(string))
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"PINBOARD_URL": srv.URL + "/pinboard", "PINBOARD_TOKEN": "good"}
	for _, msg := range []string{
		"cold start: placements resume in 15000ms",
		"no worker can take new placements for this namespace",
	} {
		body.Store(`{"error":"` + msg + `"}`)
		for _, args := range [][]string{{"health"}, {"workers"}, {"drain", "c1"}, {"where", "counters", "alice"}} {
			code, _, errs := runCtl(t, env, args...)
			if code != exitAPI || !strings.Contains(errs, "base path") || strings.Contains(errs, "retry after") {
				t.Errorf("unexpected result for %v answered %q; got exit %d, stderr %q; want exit %d pointing at PINBOARD_URL's base path, no retry hint", args, msg, code, errs, exitAPI)
			}
		}
	}
	for _, msg := range []string{"registry busy", "not the serving fleet", "directory unavailable"} {
		body.Store(`{"error":"` + msg + `"}`)
		code, _, errs := runCtl(t, env, "health")
		if code != exitAPI || strings.Contains(errs, "base path") || !strings.Contains(errs, "retry after 15s") {
			t.Errorf("unexpected result for the operator API's %q; got exit %d, stderr %q; want exit %d with the retry hint only", msg, code, errs, exitAPI)
		}
	}
}

// The operator API takes every method pinboardctl sends, so a 405 comes
// from something else — pinboard's admin listener (PINBOARD_METRICS_ADDR,
// GET and HEAD only) is the likely one: its port is the other one in the
// manifests. drain, undrain and wind-down printed a bare "405 method not
// allowed", as if the operator API refused a POST, where workers and
// where, answered 404 there, pointed at PINBOARD_URL (R-REG-6).
func TestMethodNotAllowedNamesTheURL_RREG6(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// pinboard's admin listener (server/admin.go)
		w.Header().Set("Allow", "GET, HEAD")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(405)
		io.WriteString(w, `{"error":"method not allowed"}`)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{
		{"drain", "c1"},
		{"undrain", "c1"},
		{"wind-down", "counters", "alice", "--revoke"},
	} {
		code, _, errs := runCtl(t, env, args...)
		if code != exitAPI || !strings.Contains(errs, "405") || !strings.Contains(errs, "admin listener") || !strings.Contains(errs, "PINBOARD_URL") {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d pointing at PINBOARD_URL and the admin listener", args, code, errs, exitAPI)
		}
	}
}

// opsAPI is an operator API stand-in for where and wind-down: no id is
// placed, ids with characters pinboard refuses get its 400, and the
// workers listing serves the namespaces given.
func opsAPI(t *testing.T, workers string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/registry/workers":
			io.WriteString(w, workers)
		case "/registry/placement":
			if strings.Contains(r.URL.Query().Get("id"), " ") {
				w.WriteHeader(400)
				io.WriteString(w, `{"error":"expected ?namespace=&id="}`)
				return
			}
			w.WriteHeader(404)
			io.WriteString(w, `{"error":"no placement"}`)
		case "/registry/wind-down":
			b, _ := io.ReadAll(r.Body)
			if bytes.Contains(b, []byte(" ")) {
				w.WriteHeader(400)
				io.WriteString(w, `{"error":"expected { namespace, id, deadline }"}`)
				return
			}
			w.WriteHeader(404)
			io.WriteString(w, `{"error":"no placement"}`)
		default:
			w.WriteHeader(404)
			io.WriteString(w, `{"error":"unknown namespace"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// "no placement" for a namespace no live worker serves is most often a
// typo: where and wind-down name the namespaces served; for a served
// namespace they say the id's next request places it (R-PL-5, R-CM-1).
func TestNoPlacementNamesUnservedNamespace_RPL5_RCM1(t *testing.T) {
	fleet := `{"workers":[{"clientId":"c1","sessionId":"s1","advertiseUrl":"http://10.0.0.1:8000","namespaces":["/tickers","/counters"],"headroom":1,"expiresInMs":15000},` +
		`{"clientId":"c2","sessionId":"s2","advertiseUrl":"http://10.0.0.2:8000","namespaces":["/counters"],"headroom":1,"expiresInMs":15000}]}`
	env := map[string]string{"PINBOARD_URL": opsAPI(t, fleet), "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{{"where", "counter", "alice"}, {"wind-down", "counter", "alice", "--deadline", "30s"}} {
		code, _, errs := runCtl(t, env, args...)
		if want := "nothing owns /counter/alice, and no live worker visible to this token serves /counter (served: /counters, /tickers)"; code != exitAPI || !strings.Contains(errs, want) {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d with %q", args, code, errs, exitAPI, want)
		}
		args[1] = "counters"
		code, _, errs = runCtl(t, env, args...)
		if want := "nothing owns /counters/alice (its next request through pinboard places it)"; code != exitAPI || !strings.Contains(errs, want) || strings.Contains(errs, "served") {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d with %q only", args, code, errs, exitAPI, want)
		}
	}
	env["PINBOARD_URL"] = opsAPI(t, `{"workers":[]}`)
	if code, _, errs := runCtl(t, env, "where", "counters", "alice"); code != exitAPI || !strings.Contains(errs, "there are none: 'pinboardctl workers'") {
		t.Errorf("unexpected result with no worker; got exit %d, stderr %q; want exit %d saying there are none", code, errs, exitAPI)
	}
}

// pinboard's 400 for an id or namespace it refuses names the request's
// shape ("expected ?namespace=&id="), which the operator never typed:
// pinboardctl adds the rule for ids (R-REG-7).
func TestRefusedNamespaceOrIDExplained_RREG7(t *testing.T) {
	env := map[string]string{"PINBOARD_URL": opsAPI(t, `{"workers":[]}`), "PINBOARD_TOKEN": "good"}
	for _, args := range [][]string{{"where", "counters", "a b"}, {"wind-down", "counters", "a b", "--deadline", "30s"}} {
		code, _, errs := runCtl(t, env, args...)
		if want := "an id is 1 to 256 characters of A-Z a-z 0-9 . _ ~ -"; code != exitAPI || !strings.Contains(errs, want) || !strings.Contains(errs, `"a b"`) {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d naming the id and %q", args, code, errs, exitAPI, want)
		}
	}
}

// A token copied with its "Bearer " prefix is refused before any request,
// saying to give the token alone (R-TR-1).
func TestTokenWithBearerPrefixExplained_RTR1(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "Bearer good"}
	code, _, errs := runCtl(t, env, "workers")
	if code != exitUsage || !strings.Contains(errs, `PINBOARD_TOKEN starts with "Bearer ": give the token alone`) || f.path != "" {
		t.Fatalf("unexpected result; got exit %d, stderr %q, request to %q; want exit %d, the Bearer hint, no request", code, errs, f.path, exitUsage)
	}
}

// A near-miss command names the one meant, and "where counters/alice"
// (the path as clients call it) says to give the namespace and id apart
// (R-REG-6).
func TestUnknownCommandAndJoinedPathExplained_RREG6(t *testing.T) {
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker"}, `unknown command "worker" (did you mean workers?)`},
		{[]string{"WHERE"}, `unknown command "WHERE" (did you mean where?)`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"where", "counters/alice"}, "give the namespace and the id apart (counters alice)"},
		{[]string{"wind-down", "/counters/alice", "--deadline", "30s"}, "give the namespace and the id apart (counters alice)"},
	} {
		code, _, errs := runCtl(t, env, tc.args...)
		if code != exitUsage || !strings.Contains(errs, tc.want) || (tc.args[0] == "frobnicate" && strings.Contains(errs, "did you mean")) {
			t.Errorf("unexpected result for %v; got exit %d, stderr %q; want exit %d with %q", tc.args, code, errs, exitUsage, tc.want)
		}
	}
}

// A PINBOARD_URL with a '#' is refused before any request, an empty
// fragment too: url.Parse leaves its Fragment "" and the '#' cut every
// path joined after it, so a drain POSTed to the base path itself
// (R-REG-6; docs/OPERATIONS.md: a malformed PINBOARD_URL is exit 2).
func TestURLWithFragmentRefused_RREG6(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(404)
	}))
	t.Cleanup(srv.Close)
	for _, u := range []string{srv.URL + "#", srv.URL + "/pb#", srv.URL + "/pb#x"} {
		code, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": u, "PINBOARD_TOKEN": "good"}, "drain", "c1", "--deadline", "5m")
		if code != exitUsage || hits.Load() != 0 || !strings.Contains(errs, "must be a base URL") {
			t.Errorf("unexpected result for PINBOARD_URL %q; got exit %d, %d request(s), stderr %q; want exit %d, no request", u, code, hits.Load(), errs, exitUsage)
		}
	}
}

// Retry-After may be an HTTP-date (RFC 9110 section 10.2.3), as a proxy
// in front of pinboard sends it: shown as it is, not as seconds ("GMTs"),
// and a front end's 429 passes its hint on too (R-REG-6).
func TestRetryAfterShownAsSent_RREG6(t *testing.T) {
	for _, tc := range []struct {
		status      int
		retry, want string
	}{
		{503, "Wed, 21 Oct 2015 07:28:00 GMT", "(retry after Wed, 21 Oct 2015 07:28:00 GMT)"},
		{503, "7", "(retry after 7s)"},
		{429, "7", "(retry after 7s)"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", tc.retry)
			w.WriteHeader(tc.status)
			io.WriteString(w, "<html><body>busy</body></html>")
		}))
		code, _, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, "drain", "c1")
		srv.Close()
		if code != exitAPI || !strings.Contains(errs, tc.want) {
			t.Errorf("unexpected result for %d with Retry-After %q; got exit %d, stderr %q; want exit %d and %q", tc.status, tc.retry, code, errs, exitAPI, tc.want)
		}
	}
}

// An answer cut after its status line is an answer: a drain answered 200
// was made, and "cannot reach pinboard ... check PINBOARD_URL" (exit 3)
// sent the operator to the URL and a script to think nothing happened. A
// change whose request went out whole before a timeout may have been
// made, and says so; a read's timeout stays "cannot reach" (R-REG-6).
func TestAnswerLostAfterRequestSaysChangeMayBeMade_RREG6(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return
		}
		c, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{\"clientId\":\"c1\",")
		bw.Flush()
		c.Close()
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	env := map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}
	code, _, errs := runCtl(t, env, "drain", "c1", "--deadline", "5m")
	if code != exitAPI || strings.Contains(errs, "cannot reach") || !strings.Contains(errs, "200 OK, then the answer was cut") || !strings.Contains(errs, "the change was made") {
		t.Errorf("unexpected result for a drain answered 200 and cut; got exit %d, stderr %q; want exit %d, the answer's status and that the change was made", code, errs, exitAPI)
	}
	env["PINBOARD_URL"] = srv.URL + "/slow"
	code, _, errs = runCtl(t, env, "drain", "c1", "--timeout", "200ms")
	if code != exitUnreachable || !strings.Contains(errs, "timed out") || !strings.Contains(errs, "the request was sent and may have taken effect") {
		t.Errorf("unexpected result for a drain that timed out after it was sent; got exit %d, stderr %q; want exit %d, that it may have taken effect", code, errs, exitUnreachable)
	}
	code, _, errs = runCtl(t, env, "workers", "--timeout", "200ms")
	if code != exitUnreachable || !strings.Contains(errs, "cannot reach pinboard") || strings.Contains(errs, "taken effect") {
		t.Errorf("unexpected result for workers timing out; got exit %d, stderr %q; want exit %d, cannot reach", code, errs, exitUnreachable)
	}
}

// A timed drain answers its drainDeadline and an untimed one none
// (PROTOCOL.md section 6). An answer without it to --deadline is a drain
// whose ids are never force-released, one with it to a plain drain
// releases them when that was not asked: both are errors, exit 1, not
// "draining c1" (R-REG-6).
func TestDrainAnswerMatchesItsDeadline_RREG6(t *testing.T) {
	for _, tc := range []struct {
		answer string
		args   []string
	}{
		{`{"clientId":"c1","draining":true}`, []string{"drain", "c1", "--deadline", "5m"}},
		{`{"clientId":"c1","draining":true,"drainDeadline":299.5}`, []string{"drain", "c1"}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, tc.answer)
		}))
		code, out, errs := runCtl(t, map[string]string{"PINBOARD_URL": srv.URL, "PINBOARD_TOKEN": "good"}, tc.args...)
		srv.Close()
		if code != exitAPI || out != "" || !strings.Contains(errs, "unexpected answer") {
			t.Errorf("unexpected result for %v answered %s; got exit %d, stdout %q, stderr %q; want exit %d and the answer named", tc.args, tc.answer, code, out, errs, exitAPI)
		}
	}
}

// --timeout reads seconds as --deadline does ("--timeout 5"), and a Go
// duration; it bounds the whole command.
func TestTimeoutFlagSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"5", 5 * time.Second},
		{"0.25", 250 * time.Millisecond},
		{"90s", 90 * time.Second},
		{"2m", 2 * time.Minute},
	} {
		var f timeoutFlag
		if err := f.Set(tc.in); err != nil || time.Duration(f) != tc.want {
			t.Errorf("unexpected --timeout %q; got %v, %v; want %v", tc.in, time.Duration(f), err, tc.want)
		}
	}
	f := &fake{}
	env := map[string]string{"PINBOARD_URL": f.server(t).URL + "/pb", "PINBOARD_TOKEN": "good"}
	if code, _, errs := runCtl(t, env, "--timeout", "5", "workers"); code != exitOK {
		t.Fatalf("unexpected result of --timeout 5; got exit %d, stderr %q; want %d", code, errs, exitOK)
	}
}

// A flag the parser refuses is named as usage and the docs spell it, with
// two dashes, and a bad value is quoted once.
func TestFlagErrorsNameLongFlags(t *testing.T) {
	env := map[string]string{"PINBOARD_URL": "http://127.0.0.1:1", "PINBOARD_TOKEN": "good"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"workers", "--foo"}, "pinboardctl: flag provided but not defined: --foo\n"},
		{[]string{"workers", "-foo"}, "pinboardctl: flag provided but not defined: --foo\n"},
		{[]string{"--url"}, "pinboardctl: flag needs an argument: --url\n"},
		{[]string{"workers", "--timeout", "soon"}, "pinboardctl: invalid value \"soon\" for flag --timeout: must be a duration like 30s or 2m, or seconds\n"},
	} {
		code, _, errs := runCtl(t, env, tc.args...)
		if code != exitUsage || !strings.HasPrefix(errs, tc.want) {
			t.Errorf("unexpected result for %q; got exit %d, stderr %q; want exit %d, stderr starting %q", tc.args, code, errs, exitUsage, tc.want)
		}
	}
}
