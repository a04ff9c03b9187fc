package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// ProbeResult is the outcome of a challenge probe (R-REG-1, R-HB probe
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

// Prober calls GET <advertiseUrl>/_pinned/challenge?challenge=… and
// compares the answer with challengeValue. It is safe for concurrent use.
type Prober struct {
	client  *fasthttp.Client
	timeout time.Duration
}

// NewProber returns a Prober whose probes give up after timeout. The
// worker's own HTTP timeout on register and heartbeat is 5 s
// (pinned.pinboard.registration), so the probe must finish well inside it.
func NewProber(timeout time.Duration) *Prober {
	return &Prober{
		timeout: timeout,
		client: &fasthttp.Client{
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
			Dial: func(addr string) (net.Conn, error) {
				return fasthttp.DialTimeout(addr, timeout)
			},
		},
	}
}

// Probe runs one challenge probe.
func (p *Prober) Probe(advertiseURL, secret, challenge, challengeValue string) (ProbeResult, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(strings.TrimSuffix(advertiseURL, "/") + "/_pinned/challenge?challenge=" + url.QueryEscape(challenge))
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(ProxySecretHeader, secret)
	req.Header.Set(fasthttp.HeaderAccept, "application/json")
	if err := p.client.DoTimeout(req, resp, p.timeout); err != nil {
		return ProbeUnreachable, fmt.Errorf("cannot probe %s: %w", advertiseURL, err)
	}
	status := resp.StatusCode()
	if status < 200 || status > 299 {
		if status >= 500 {
			return ProbeUnreachable, fmt.Errorf("probe of %s answered %d", advertiseURL, status)
		}
		return ProbeRejected, fmt.Errorf("probe of %s answered %d", advertiseURL, status)
	}
	var body struct {
		Value *string `json:"value"`
	}
	if err := json.Unmarshal(resp.Body(), &body); err != nil || body.Value == nil {
		return ProbeUnreachable, errors.New("probe answer carried no challenge value")
	}
	if *body.Value != challengeValue {
		return ProbeMismatch, errors.New("probe answered a different challenge value")
	}
	return ProbeOK, nil
}
