package scenario

import (
	"strconv"
	"time"

	"github.com/pinboard-go/pinboard/attest"
	"github.com/pinboard-go/pinboard/bench"
	"github.com/pinboard-go/pinboard/bench/fleet"
)

// Target names.
const (
	direct   = "direct"
	nginx    = "nginx"
	pinboard = "pinboard"
	// The floors of the hot-ids scenario (package bench/relay): Go relays
	// that do no HTTP work, one per shape.
	relayGoroutine = "relay-goroutine"
	relayEpoll     = "relay-epoll"
)

// target is one way to reach the fleet.
type target struct {
	name string
	// addrs are dialled round-robin by the generator's connections.
	addrs []string
	// pid is the proxy process measured for CPU (0: none, direct).
	pid  int
	tree bool // sum the process's children too (nginx workers)
	// viaWorker: requests name the worker themselves (/w/<k>/…) and carry
	// an attestation the generator minted for the worker's session — the
	// baselines reach exactly the backend work pinboard's requests do.
	viaWorker bool
}

// route builds request targets and headers for one target over a fixed
// worker list.
type route struct {
	t       *target
	workers []fleet.WorkerInfo
	tokens  []string // "Pinboard-Attestation: …" per worker
}

// newRoute mints one attestation per worker, valid for about a minute
// (iat now, exp +30 s, +30 s skew): enough for one phase.
func newRoute(t *target, ws []fleet.WorkerInfo) *route {
	r := &route{t: t, workers: ws}
	if t.viaWorker {
		now := time.Now().Unix()
		for _, w := range ws {
			tok := attest.AppendAttestation(nil, &attest.AttestationInput{
				Secret: []byte(w.Secret), Aud: w.SessionID, IssuedAt: now, Depth: attest.NoDepth,
			})
			r.tokens = append(r.tokens, attest.HeaderName+": "+string(tok))
		}
	}
	return r
}

// appendPath appends the request target for instance id of ns and action;
// for baselines, k picks the worker.
func (r *route) appendPath(dst []byte, k int, ns, id, action string) []byte {
	if r.t.viaWorker {
		dst = append(dst, "/w/"...)
		dst = strconv.AppendInt(dst, int64(r.workers[k%len(r.workers)].Index), 10)
	}
	dst = append(dst, ns...)
	dst = append(dst, '/')
	dst = append(dst, id...)
	dst = append(dst, '/')
	return append(dst, action...)
}

// headers returns the extra header lines for worker k.
func (r *route) headers(k int) []string {
	if !r.t.viaWorker {
		return nil
	}
	return []string{r.tokens[k%len(r.tokens)]}
}

// addr is the address generator connection w dials.
func (r *route) addr(w int) string { return r.t.addrs[w%len(r.t.addrs)] }

// hotRequests pre-renders one GET per hot id: the generator then only
// copies bytes.
func (r *route) hotRequests(ns string, ids int, action string) [][]byte {
	out := make([][]byte, ids)
	for i := range out {
		path := r.appendPath(nil, i, ns, HotID(i), action)
		out[i] = bench.AppendGET(nil, "bench.local", path, r.headers(i)...)
	}
	return out
}

// HotID is the name of the i-th id the hot-ids scenario places ("h0",
// "h1", …), which `pinbench load -ids` requests too.
func HotID(i int) string { return "h" + strconv.Itoa(i) }

// doers returns the Loop's doer factory for a fixed request list.
func (r *route) fixedDoers(reqs [][]byte) func(int) (bench.Doer, error) {
	n := uint64(len(reqs))
	return func(w int) (bench.Doer, error) {
		t := &bench.HTTPTarget{Addr: r.addr(w), Request: func(dst []byte, seq uint64) []byte {
			return append(dst, reqs[seq%n]...)
		}}
		return t.NewDoer(w)
	}
}

// coldDoers sends every request to a new id ("c<run>-<seq>"; a phase
// measured again, "c<run>.<attempt>-<seq>": ids of the first attempt are
// placed already). A loop makes its doers in order, worker 0 first.
func (r *route) coldDoers(ns, run, action string) func(int) (bench.Doer, error) {
	headers := make([][]byte, max(1, len(r.tokens)))
	for i := range r.tokens {
		headers[i] = []byte(r.tokens[i] + "\r\n")
	}
	attempt := 0
	return func(w int) (bench.Doer, error) {
		if w == 0 {
			attempt++
		}
		run := run
		if attempt > 1 {
			run += "." + strconv.Itoa(attempt)
		}
		t := &bench.HTTPTarget{Addr: r.addr(w), Request: func(dst []byte, seq uint64) []byte {
			k := int(seq % uint64(max(1, len(r.workers))))
			dst = append(dst, "GET "...)
			if r.t.viaWorker {
				dst = append(dst, "/w/"...)
				dst = strconv.AppendInt(dst, int64(r.workers[k].Index), 10)
			}
			dst = append(dst, ns...)
			dst = append(dst, "/c"...)
			dst = append(dst, run...)
			dst = append(dst, '-')
			dst = strconv.AppendUint(dst, seq, 10)
			dst = append(dst, '/')
			dst = append(dst, action...)
			dst = append(dst, " HTTP/1.1\r\nHost: bench.local\r\n"...)
			if r.t.viaWorker {
				dst = append(dst, headers[k]...)
			}
			return append(dst, "\r\n"...)
		}}
		return t.NewDoer(w)
	}
}
