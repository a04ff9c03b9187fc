package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Exit codes, for scripts.
const (
	exitOK          = 0
	exitAPI         = 1 // pinboard answered with an error (404 unknown clientId, 503, …)
	exitUsage       = 2 // bad command line or environment
	exitUnreachable = 3 // no answer from pinboard (refused, timeout, DNS, TLS)
	exitAuth        = 4 // 401 or 403: the token is wrong or lacks pinboard:operator
)

// client calls the operator API at base with a bearer token.
type client struct {
	base  string // PINBOARD_URL without a trailing slash
	token string
	http  *http.Client
	// urlName and tokenName say where the URL and the token came from
	// (PINBOARD_URL or --url, PINBOARD_TOKEN or --token), for the hints
	// of errors: an operator with the right variable set who passed a
	// wrong flag was sent to check the variable.
	urlName, tokenName string
}

// apiError is a non-2xx answer.
type apiError struct {
	Method, Path string
	Status       int
	Message      string // the body's "error", or the raw body
	RetryAfter   string
	Location     string // a redirect's target
	// URLName and TokenName name the URL's and the token's source
	// (client.urlName, client.tokenName).
	URLName, TokenName string
}

// redirect reports whether the answer was a redirect (3xx).
func (e *apiError) redirect() bool { return e.Status >= 300 && e.Status <= 399 }

func (e *apiError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	s := fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Status, msg)
	switch e.Status {
	case http.StatusUnauthorized:
		s += " (" + e.TokenName + " was not accepted: check it is the deployment's operator token)"
	case http.StatusForbidden:
		s += " (the token lacks the pinboard:operator scope, or its claims do not cover that namespace or worker)"
	case http.StatusNotFound:
		if !e.fromRegistry() {
			// Not the operator API's own 404: a PINBOARD_URL without
			// pinboard's base path reaches its data plane ("unknown
			// namespace"), or it is not pinboard at all.
			s += " (is " + e.URLName + " pinboard itself, with its base path?)"
		}
	case http.StatusMethodNotAllowed:
		// The operator API takes every method pinboardctl sends: another
		// server answered, most likely pinboard's admin listener (GET and
		// HEAD only), whose port is the other one in the deploy files.
		s += " (pinboard's operator API takes " + e.Method + " here: is " + e.URLName + " pinboard's public listener, not its admin listener, with its base path?)"
	case http.StatusServiceUnavailable:
		switch {
		case e.fromDataPlane():
			// A fresh directory answers every data-plane request "cold
			// start" for one lease, and a base path pinboard does not
			// have sends /registry/… there: waiting it out only turned it
			// into a 404 "unknown namespace".
			s += " (pinboard's data plane answered, not its operator API: is " + e.URLName + " pinboard itself, with its base path?)"
		case e.RetryAfter != "":
			s += " (retry after " + retryAfter(e.RetryAfter) + ")"
		}
	case http.StatusTooManyRequests:
		// Not pinboard's (it answers busy with 503): a front end's limit.
		if e.RetryAfter != "" {
			s += " (retry after " + retryAfter(e.RetryAfter) + ")"
		}
	}
	if e.redirect() {
		// Pinboard never redirects: something in front of it does (an
		// http:// URL sent to https://, a login page). Followed, a drain's
		// POST came back a GET and the bearer token was dropped on
		// another host, and the error blamed the token or the base path.
		s += " (pinboard does not redirect: " + e.URLName + " reaches something in front of it"
		if e.Location != "" {
			s += " that sends it to " + cell(clip(e.Location, 200)) + "; if that is pinboard, set " + e.URLName + " to it"
		}
		s += ")"
	}
	return s
}

// retryAfter renders a Retry-After value: seconds as "Ns", an HTTP-date
// (RFC 9110 section 10.2.3, as proxies in front of pinboard send it) as
// it is, clipped.
func retryAfter(v string) string {
	if v != "" && strings.Trim(v, "0123456789") == "" {
		return v + "s"
	}
	return cell(clip(v, 64))
}

// The operator API's own 404 messages (registry/errors.go).
const (
	msgUnknownClient = "unknown clientId"
	msgNoPlacement   = "no placement"
)

// fromRegistry reports whether a 404 is one the operator API answers about
// a worker or an id.
func (e *apiError) fromRegistry() bool {
	return e.Status == http.StatusNotFound && (e.Message == msgUnknownClient || e.Message == msgNoPlacement)
}

// fromDataPlane reports whether a 503 is one only pinboard's data plane
// answers (proxy/placement.go); the operator API's are "directory
// unavailable", "registry busy" and "not the serving fleet", and its
// health answers a cold start with 200 and quarantineMs.
func (e *apiError) fromDataPlane() bool {
	return e.Status == http.StatusServiceUnavailable &&
		(strings.HasPrefix(e.Message, "cold start: ") || e.Message == "no worker can take new placements for this namespace")
}

// unreachableError: no HTTP answer at all.
type unreachableError struct {
	URL     string
	URLName string // PINBOARD_URL or --url
	Err     error
	// Change: a request that changes something was sent whole before
	// the answer failed to come (a timeout, a reset): it may have been
	// made.
	Change bool
}

func (e *unreachableError) Error() string {
	if e.Change {
		return fmt.Sprintf("no answer from pinboard at %s: %v; the request was sent and may have taken effect (check with 'pinboardctl workers' before repeating it)", e.URL, e.Err)
	}
	return fmt.Sprintf("cannot reach pinboard at %s: %v (check %s and that pinboard is running)", e.URL, e.Err, e.URLName)
}

// changeHint says what an answer cut after its status means for a request
// that changes something.
func changeHint(method string, status int) string {
	if method != http.MethodGet && status >= 200 && status <= 299 {
		return " (pinboard accepted it: the change was made; check with 'pinboardctl workers')"
	}
	return ""
}

func (e *unreachableError) Unwrap() error { return e.Err }

// exitCode maps an error to the process exit status.
func exitCode(err error) int {
	var ae *apiError
	var ue *unreachableError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ae):
		if ae.Status == http.StatusUnauthorized || ae.Status == http.StatusForbidden {
			return exitAuth
		}
		return exitAPI
	case errors.As(err, &ue):
		return exitUnreachable
	}
	return exitAPI
}

// do sends one request and decodes a 2xx JSON answer into out.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("cannot encode request body: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("cannot build request %s %s: %w", method, u, err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	// sent notes that the whole request went out: a change that timed out
	// or lost its connection after that may have been made.
	var sent atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	}))
	res, err := c.http.Do(req)
	if err != nil {
		return &unreachableError{URL: c.base, URLName: c.urlName, Err: unwrapURLError(err), Change: sent.Load() && method != http.MethodGet}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		// Pinboard answered: the change, if any, was made (a 2xx) or
		// refused; only the answer's body is missing. Not "unreachable",
		// whose hint sends the operator to check the URL.
		return fmt.Errorf("%s %s: %d %s, then the answer was cut: %w%s", method, path, res.StatusCode, http.StatusText(res.StatusCode), unwrapURLError(err), changeHint(method, res.StatusCode))
	}
	if res.StatusCode < 200 || res.StatusCode > 299 {
		ae := &apiError{Method: method, Path: path, Status: res.StatusCode, RetryAfter: res.Header.Get("Retry-After"),
			Location: res.Header.Get("Location"), URLName: c.urlName, TokenName: c.tokenName}
		var eb struct {
			Error string `json:"error"`
		}
		switch {
		case ae.redirect():
			// A redirect's body is a link to its Location (net/http's
			// "<a href=…>Found</a>."): the status text and the target say it.
		case json.Unmarshal(b, &eb) == nil && eb.Error != "":
			// Pinboard's messages print as they are; JSON from something
			// else in front of it (a gateway's {"error":…}) may hold a
			// line break or an escape sequence, quoted as a page is.
			ae.Message = cell(clip(eb.Error, 200))
		default:
			// Not pinboard's JSON: a proxy's error page, often HTML over
			// several lines. Quoted when it does not print, so the error
			// stays on its one line and nothing reaches the terminal.
			ae.Message = cell(clip(strings.TrimSpace(string(b)), 200))
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if raw, ok := out.(*json.RawMessage); ok {
		*raw = append((*raw)[:0], b...)
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("cannot decode the answer to %s %s: %w", method, path, err)
	}
	return nil
}

// clip cuts s to at most n bytes, between two characters, marking the cut
// with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// unwrapURLError drops net/url's "Get "…": " prefix; the message names the
// URL already.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("timed out: %w", err)
	}
	return err
}

func newHTTPClient(timeout time.Duration) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableCompression = true
	// Redirects are answers, not followed (apiError): the operator API
	// never sends one.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: noRedirect}
}
