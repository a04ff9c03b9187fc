package registry

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/pinboard-go/pinboard/internal/rawio"
	"github.com/valyala/fasthttp"
)

// ProbeResult is the outcome of a challenge probe (R-REG-1, R-REG-2 probe
// table).
type ProbeResult uint8

const (
	// ProbeOK: the advertise URL answered the expected challengeValue.
	ProbeOK ProbeResult = iota
	// ProbeUnreachable: no connection, a timeout, or no body received.
	ProbeUnreachable
	// ProbeRejected: the URL answered with a non-2xx status (typically 403
	// from another worker's secret check, or 404 for a stale challenge).
	ProbeRejected
	// ProbeMismatch: the URL answered a different value: it reaches another
	// process.
	ProbeMismatch
)

// String is the result's name in logs: "ok", "unreachable", "rejected"
// or "mismatch" (also for any value past ProbeMismatch).
func (r ProbeResult) String() string {
	switch r {
	case ProbeOK:
		return "ok"
	case ProbeUnreachable:
		return "unreachable"
	case ProbeRejected:
		return "rejected"
	default:
		return "mismatch"
	}
}

// ProxySecretHeader carries the worker's registration secret on probes
// (pinned.pinboard.wire PROXY_SECRET_HEADER): before the register ack
// there is no session to mint an attestation for, so the worker accepts
// its own secret on GET /_pinned/challenge.
const ProxySecretHeader = "Pinboard-Proxy-Secret"

// maxProbeBody bounds what a probe reads back.
const maxProbeBody = 64 << 10

// maxProbeHeader bounds the header of a probe's answer: 16 KiB, as the
// data plane reads a worker's answers (proxy.UpstreamOptions.BufferSize).
// The challenge route answers through the worker app's middleware, and
// a header one adds to every answer (a long Content-Security-Policy, a
// cookie) is on it too. fasthttp's default, 4 KiB, failed every probe of
// an app whose answers carry more: its register was deferred (503
// "advertise URL unreachable") for as long as it ran and its heartbeats
// marked it degraded, while requests to it were relayed
// (TestProbeAnswerWithLargeHeader_RREG1_RLS3).
const maxProbeHeader = 16 << 10

// Prober calls GET <advertiseUrl>/_pinned/challenge?challenge=… and
// compares the answer with challengeValue. It is safe for concurrent use.
type Prober struct {
	client *fasthttp.Client
	// fresh confirms a mismatch on a connection of its own, closed after
	// the answer: a pooled connection can hold a stale answer (see Probe).
	fresh   *fasthttp.Client
	timeout time.Duration
	// dialer dials both clients' connections; its Control (nil here)
	// lets a test see a dial's network and address before the connect.
	dialer *net.Dialer
}

// CloseIdle closes the probe connections idle in p's pools.
func (p *Prober) CloseIdle() {
	p.client.CloseIdleConnections()
	p.fresh.CloseIdleConnections()
}

// NewProber returns a Prober whose probes give up after timeout. The
// worker's own HTTP timeout on register and heartbeat is 5 s
// (pinned.pinboard.registration), so the probe must finish well inside it.
func NewProber(timeout time.Duration) *Prober {
	// Raw read(2)/write(2) (internal/rawio), as on the data plane's worker
	// connections: a probe's loopback write keeps its P instead of handing
	// it to another thread past sysmon's 20 µs, and 3,333 heartbeats a
	// second (10,000 workers) each make one.
	//
	// The dial is net.Dialer's on "tcp", as the data plane dials workers
	// (proxy/upstream.go), so the probe proves what requests will reach.
	// fasthttp.DialTimeout dials IPv4 only: a worker advertising an IPv6
	// address ("http://[fd00::7]:8000", an IPv6 pod's POD_IP) or a name
	// with AAAA records only failed every probe, and its register was
	// answered 503 "advertise URL unreachable" for as long as it ran —
	// the worker defers and retries, never registered — while the data
	// plane would have reached it (TestProbeDialsIPv6_RREG1). It also
	// cached each name's addresses for a minute: a worker restarted
	// under the same DNS name at a new address (a rescheduled
	// StatefulSet pod) was probed at the old one meanwhile.
	p := &Prober{timeout: timeout, dialer: &net.Dialer{Timeout: timeout}}
	dial := func(addr string) (net.Conn, error) {
		c, err := p.dialer.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		return rawio.Wrap(c), nil
	}
	p.fresh = &fasthttp.Client{
		NoDefaultUserAgentHeader: true,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		MaxConnWaitTimeout:       timeout,
		MaxResponseBodySize:      maxProbeBody,
		ReadBufferSize:           maxProbeHeader,
		Dial:                     dial,
	}
	p.client = &fasthttp.Client{
		NoDefaultUserAgentHeader: true,
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		// Heartbeats come every 3 s: a connection idle up to 4 s is
		// reused by the next probe (one dial saved per heartbeat), and
		// still closes before uvicorn's 5 s keep-alive timeout.
		MaxIdleConnDuration: 4 * time.Second,
		// Workers may share one host:port behind path prefixes: a burst
		// of probes queues for a connection instead of failing at once
		// (which would mark healthy workers degraded).
		MaxConnsPerHost:     64,
		MaxConnWaitTimeout:  timeout,
		MaxResponseBodySize: maxProbeBody,
		ReadBufferSize:      maxProbeHeader,
		Dial:                dial,
	}
	return p
}

// Probe runs one challenge probe.
//
// A mismatch voids the session (R-LS-3), so it is confirmed on a fresh
// connection first: a pooled connection may still hold an answer to an
// earlier probe. fasthttp pools a connection after a response framed with
// both Content-Length and Transfer-Encoding (RFC 9112 section 6.3: "ought
// to be handled as an error"), reading it as chunked, and whatever the
// Content-Length covered past the chunked body is the next probe's
// "answer", with another challenge's value. Idle connections are closed
// too, so a desynchronised one does not mislead the next probe as well.
// Both share one timeout: the worker waits 5 s for its register or
// heartbeat answer.
func (p *Prober) Probe(advertiseURL, secret, challenge, challengeValue string) (ProbeResult, error) {
	return p.ProbeBy(time.Time{}, advertiseURL, secret, challenge, challengeValue)
}

// ErrAnswerDue is a probe ProbeBy cut short, or did not make, because its
// worker stops waiting for the answer to the register or heartbeat that
// asked for it before the probe could end.
var ErrAnswerDue = errors.New("the worker stops waiting for its answer before the probe could end")

// ProbeBy is Probe ending by answerBy (the zero time: no bound but the
// probe timeout). A probe that answerBy stopped, or that could not start
// before it, reports ErrAnswerDue: its outcome says nothing of the worker
// (it timed out on the worker's budget, not its own), and a worker that
// gave up on its heartbeat has a new challenge and answers the old one
// 404 — a healthy session marked degraded on a reply nobody reads.
func (p *Prober) ProbeBy(answerBy time.Time, advertiseURL, secret, challenge, challengeValue string) (ProbeResult, error) {
	now := time.Now()
	deadline := now.Add(p.timeout)
	due := !answerBy.IsZero() && answerBy.Before(deadline)
	if due {
		deadline = answerBy
		if !now.Before(deadline) {
			return ProbeUnreachable, ErrAnswerDue
		}
	}
	res, err := p.probe(p.client, deadline, advertiseURL, secret, challenge, challengeValue)
	if res == ProbeMismatch {
		p.client.CloseIdleConnections()
		res, err = p.probe(p.fresh, deadline, advertiseURL, secret, challenge, challengeValue)
	}
	if due && res == ProbeUnreachable && !time.Now().Before(deadline) {
		return res, fmt.Errorf("%w: %w", ErrAnswerDue, err)
	}
	return res, err
}

// probe runs one challenge probe through c; a probe through p.fresh
// closes its connection after the answer.
func (p *Prober) probe(c *fasthttp.Client, deadline time.Time, advertiseURL, secret, challenge, challengeValue string) (ProbeResult, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimSuffix(advertiseURL, "/") + "/_pinned/challenge?challenge=" + url.QueryEscape(challenge))
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(ProxySecretHeader, secret)
	req.Header.Set(fasthttp.HeaderAccept, "application/json")
	if c == p.fresh {
		req.SetConnectionClose()
	}
	if err := c.DoDeadline(req, resp, deadline); err != nil {
		return ProbeUnreachable, fmt.Errorf("cannot probe %s: %w", advertiseURL, err)
	}
	status := resp.StatusCode()
	if status < 200 || status > 299 {
		if status >= 500 {
			return ProbeUnreachable, fmt.Errorf("probe of %s answered %d", advertiseURL, status)
		}
		return ProbeRejected, fmt.Errorf("probe of %s answered %d", advertiseURL, status)
	}
	// Read as the reference reads body.value: by its exact name, the last
	// of duplicates winning (decode). encoding/json alone matched "VALUE"
	// and "Value" too, so an answer also naming one of those was read by
	// it — a different value, which voids the session (R-LS-3).
	var body struct {
		Value *string `json:"value"`
	}
	if err := decode(resp.Body(), &body); err != nil || body.Value == nil {
		return ProbeUnreachable, errors.New("probe answer carried no challenge value")
	}
	if *body.Value != challengeValue {
		return ProbeMismatch, errors.New("probe answered a different challenge value")
	}
	return ProbeOK, nil
}
