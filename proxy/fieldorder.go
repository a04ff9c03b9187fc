package proxy

import (
	"bytes"
	"errors"
	"iter"
	"slices"

	"github.com/valyala/fasthttp"
)

// Field order (RFC 9110 §5.3): the order of the lines of a field sent
// more than once is significant — tracestate, Via, a trusted proxy's
// Forwarded, a request coded twice — and "a proxy MUST NOT change the
// order of these field line values when forwarding a message".
// fasthttp deletes a header by moving the header's last line into its
// place (delAllArgs), so each line pinboard removes (a browser's
// Connection: keep-alive, a consumed Authorization, a client's
// pinboard-* or X-Real-IP) could move the last line of a repeated field
// in front of its siblings: the worker read them last first, and a
// client's own Forwarded line could end up behind the one its trusted
// proxy appended.
//
// keepFieldOrder puts that order back once pinboard's edits are done.
// Only the relative order of lines that share a name is restored (fields
// with different names may be reordered, §5.3); each repeated field left
// as the client sent it, with as many lines, is moved to the end in the
// order the client sent its lines (RequestHeader.AllInOrder, which reads
// the raw header). Fields pinboard rewrote (X-Forwarded-For) or removed
// keep pinboard's lines.

// editor is the header of a request being forwarded, for deleting its
// lines. fasthttp fills a deleted line's place with the header's last
// line (delAllArgs), which may move a repeated field's line in front of
// its siblings: each deletion through an editor marks the field order for
// repair (keepFieldOrder), so that no edit of the request's header can
// forget to. The forwarding code deletes from the header only through
// one (rewriteRequest); it is two pointers, passed by value.
type editor struct {
	h  *fasthttp.RequestHeader
	fo *fieldOrder
}

// All iterates over h's lines (stripHop's hopHeader).
func (e editor) All() iter.Seq2[[]byte, []byte] { return e.h.All() }

// Del deletes every line named k.
func (e editor) Del(k string) {
	e.h.Del(k)
	e.fo.edited = true
}

// DelBytes deletes every line named k.
func (e editor) DelBytes(k []byte) {
	e.h.DelBytes(k)
	e.fo.edited = true
}

// fieldOrder is keepFieldOrder's scratch space, kept in the pooled
// request: nothing is allocated once it is warm.
type fieldOrder struct {
	// edited: pinboard deleted something from the header (editor);
	// nothing moved otherwise (set, not add, rewrites in place).
	edited bool
	keys   []byte  // the names of the header's lines, back to back
	ends   []int   // ends[i]: the end of line i's name in keys
	idx    []int32 // line numbers, sorted by name
	// lineRun[i]: the fieldRun of line i, or -1 (a field sent once).
	lineRun []int32
	runs    []fieldRun
	cur     []curLine // the runs' lines now, grouped by run
	vals    []byte    // their values, back to back
	raw     []byte    // name and value of each raw line of a repeated field
	lines   []rawLine
}

// curLine is a value in vals.
type curLine struct{ start, end int }

// fieldRun is a name the header holds on more than one line.
type fieldRun struct {
	start, end  int // the name, in keys
	cur, raw    int // its lines now, and in the raw header
	first, next int // where its lines start in cur; the next to fill
}

// rawLine is one line of a repeated field, in raw order: run is its
// fieldRun; its name ends at kEnd and its value at vEnd, in raw.
type rawLine struct {
	run        int
	kEnd, vEnd int
}

func (fo *fieldOrder) reset() {
	fo.edited = false
	fo.clear()
}

// clear empties the scratch space, keeping edited.
func (fo *fieldOrder) clear() {
	fo.keys, fo.ends, fo.idx, fo.lineRun = fo.keys[:0], fo.ends[:0], fo.idx[:0], fo.lineRun[:0]
	fo.runs, fo.raw, fo.lines = fo.runs[:0], fo.raw[:0], fo.lines[:0]
	fo.cur, fo.vals = fo.cur[:0], fo.vals[:0]
}

func (fo *fieldOrder) key(i int32) []byte {
	start := 0
	if i > 0 {
		start = fo.ends[i-1]
	}
	return fo.keys[start:fo.ends[i]]
}

// run returns the fieldRun named k, or -1 (runs are sorted by name).
func (fo *fieldOrder) run(k []byte) int {
	lo, hi := 0, len(fo.runs)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		r := fo.runs[m]
		if string(fo.keys[r.start:r.end]) < string(k) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(fo.runs) {
		if r := fo.runs[lo]; string(fo.keys[r.start:r.end]) == string(k) {
			return lo
		}
	}
	return -1
}

// findRuns fills fo with h's lines, sorted by name, and its runs: the
// names h holds on more than one line, Cookie apart (the proxy keeps a
// request's Cookie lines apart from its other fields, saveCookies). A
// header with no such name (repeats) has no runs, and its lines are not
// copied and sorted.
func (fo *fieldOrder) findRuns(h *fasthttp.RequestHeader) {
	if !repeats(h) {
		fo.clear()
		return
	}
	fo.sortRuns(h)
}

// sortRuns is findRuns without the quick look: every line copied and
// sorted by name.
func (fo *fieldOrder) sortRuns(h *fasthttp.RequestHeader) {
	fo.clear()
	for k := range h.All() {
		fo.keys = append(fo.keys, k...)
		fo.ends = append(fo.ends, len(fo.keys))
		fo.idx = append(fo.idx, int32(len(fo.idx)))
	}
	slices.SortFunc(fo.idx, func(a, b int32) int { return bytes.Compare(fo.key(a), fo.key(b)) })
	fo.lineRun = slices.Grow(fo.lineRun[:0], len(fo.idx))[:len(fo.idx)]
	for i := 0; i < len(fo.idx); {
		j := i + 1
		for j < len(fo.idx) && bytes.Equal(fo.key(fo.idx[i]), fo.key(fo.idx[j])) {
			j++
		}
		r := int32(-1)
		if k := fo.key(fo.idx[i]); j-i > 1 && string(k) != fasthttp.HeaderCookie {
			r = int32(len(fo.runs))
			start := fo.ends[fo.idx[i]] - len(k)
			fo.runs = append(fo.runs, fieldRun{start: start, end: start + len(k), cur: j - i})
		}
		for _, line := range fo.idx[i:j] {
			fo.lineRun[line] = r
		}
		i = j
	}
}

// repeatsScan is how many lines repeats compares pairwise; a longer
// header is handed to sortRuns, whose sort is cheaper at that size.
const repeatsScan = 32

// repeats reports whether h may hold a name other than Cookie on more
// than one line: sortRuns finds none otherwise, and keepFieldOrder has
// nothing to put back. A browser's request has a dozen lines and no
// repeated name, and every request it sends has its Connection:
// keep-alive deleted: compared pairwise, lengths first, its names cost
// tens of nanoseconds where sortRuns' copy and sort cost a microsecond
// (BenchmarkRewriteRequestBrowser). Names are compared as sortRuns
// compares them, byte for byte (fasthttp normalises them as it parses).
func repeats(h *fasthttp.RequestHeader) bool {
	return repeatedName(h.All(), isCookie) // true: sortRuns decides
}

// isCookie: fasthttp keeps a request's cookies apart from its lines.
func isCookie(k []byte) bool { return string(k) == fasthttp.HeaderCookie }

// repeatedName reports whether all yields a name twice among those skip
// does not rule out, or more than repeatsScan such names (the caller's
// slow path decides then). Allocates nothing.
func repeatedName(all iter.Seq2[[]byte, []byte], skip func([]byte) bool) bool {
	var names [repeatsScan][]byte
	n := 0
	for k := range all {
		if skip(k) {
			continue
		}
		if n == len(names) {
			return true
		}
		for _, o := range names[:n] {
			if len(o) == len(k) && string(o) == string(k) {
				return true
			}
		}
		names[n] = k
		n++
	}
	return false
}

// checkRepeatBound returns errTooManyRepeated for a request of lines
// header lines that sends more than maxStripped distinct fields on
// several lines. keepFieldOrder rewrites each such field with a deletion,
// a pass over the whole header (fasthttp), once an edit moved a line:
// the proxy checks the bound with the rest of what the header alone
// refuses (Proxy.parse), before the request is placed or told 100
// Continue. Fewer than 2 × (maxStripped + 1) lines cannot hold that many,
// and cost nothing more.
func checkRepeatBound(h *fasthttp.RequestHeader, fo *fieldOrder, lines int) error {
	if lines < 2*(maxStripped+1) {
		return nil
	}
	fo.findRuns(h)
	n := len(fo.runs)
	fo.clear()
	if n > maxStripped {
		return errTooManyRepeated
	}
	return nil
}

// keepFieldOrder restores the order of repeated fields (above) in h, the
// request rq is forwarding, after pinboard edited it. When a line moved,
// every repeated field is rewritten (one deletion each, then its lines
// appended in order): a deletion moves lines of other fields too, and
// with every repeated field out of the way, only fields sent once are
// left behind, whose order does not matter. Each deletion costs a pass
// over the header (fasthttp): a request with more than maxStripped
// repeated fields was refused before (checkRepeatBound). Clients send a
// handful: a browser's Connection: keep-alive moves one line. The caller
// puts the client's Cookie lines back afterwards (restoreCookies): they
// are kept apart from the other fields.
//
// stripResponseHopInOrder does the same for an answer, and stays a
// separate function: the reference order here is the raw request
// (AllInOrder), read after every edit, where an answer has no raw header
// and must copy its lines before stripHop; this runs on every edited
// request, so it allocates nothing (pooled scratch, bounded by
// checkRepeatBound) and rewrites nothing when no line moved, where an
// answer's slow path allocates and always rewrites; and a field pinboard
// rewrote keeps pinboard's lines here, which cannot happen to an answer
// (stripHop deletes a field whole). Cookie is the one name kept apart
// here, keptApart's nine there. One function would take the reference
// source, the kept-apart set and the always-rewrite choice as
// parameters, the request path would pay indirect calls per line for an
// answer's rare case, and the branches would each serve one side.
func keepFieldOrder(h *fasthttp.RequestHeader, rq *request) {
	fo := &rq.order
	if !fo.edited {
		return // Fast path: nothing was deleted, nothing moved.
	}
	fo.edited = false
	fo.findRuns(h)
	if len(fo.runs) == 0 {
		return // No field on several lines: nothing to put back.
	}
	// The lines of each run as they are now, grouped by run in order
	// (first: where a run's lines start in cur).
	for i, n := 0, 0; i < len(fo.runs); i++ {
		fo.runs[i].first, n = n, n+fo.runs[i].cur
		fo.runs[i].next = fo.runs[i].first
	}
	fo.cur = slices.Grow(fo.cur[:0], len(fo.idx))[:len(fo.idx)]
	line := 0
	for _, v := range h.All() {
		if r := fo.lineRun[line]; r >= 0 {
			run := &fo.runs[r]
			fo.cur[run.next] = curLine{start: len(fo.vals)}
			fo.vals = append(fo.vals, v...)
			fo.cur[run.next].end = len(fo.vals)
			run.next++
		}
		line++
	}
	// The raw lines of each run, in the order the client sent them,
	// compared with the lines now.
	moved := false
	for k, v := range h.AllInOrder() {
		r := fo.run(k)
		if r < 0 {
			continue
		}
		run := &fo.runs[r]
		if rank := run.raw; rank < run.cur {
			c := fo.cur[run.first+rank]
			moved = moved || !bytes.Equal(fo.vals[c.start:c.end], v)
		}
		run.raw++
		fo.raw = append(fo.raw, k...)
		kEnd := len(fo.raw)
		fo.raw = append(fo.raw, v...)
		fo.lines = append(fo.lines, rawLine{run: r, kEnd: kEnd, vEnd: len(fo.raw)})
	}
	if !moved {
		return
	}
	for _, r := range fo.runs {
		h.DelBytes(fo.keys[r.start:r.end])
	}
	// A run with as many lines as the client sent is the client's, in
	// its order; one pinboard rewrote keeps pinboard's lines.
	start := 0
	for _, l := range fo.lines {
		if r := fo.runs[l.run]; r.cur == r.raw {
			h.AddBytesKV(fo.raw[start:l.kEnd], fo.raw[l.kEnd:l.vEnd])
		}
		start = l.vEnd
	}
	for _, r := range fo.runs {
		if r.cur == r.raw {
			continue
		}
		for _, c := range fo.cur[r.first : r.first+r.cur] {
			h.AddBytesKV(fo.keys[r.start:r.end], fo.vals[c.start:c.end])
		}
	}
}

// errTooManyRepeated refuses a request with more than maxStripped
// repeated fields (checkRepeatBound).
var errTooManyRepeated = errors.New("too many header fields sent on several lines")

// Responses. A worker's answer loses its hop-by-hop lines the same way
// (stripResponseHop), and the same deletion moved the header's last line
// into the deleted one's place: a worker whose server or sidecar answers
// with Connection: keep-alive (Node, Apache, nginx) had its Link
// preloads, WWW-Authenticate challenges and Cache-Control lines sent to
// the client last first. An answer's parsed header is still in the
// worker's order before the deletions, so its lines are read then.

// keptApart reports whether fasthttp keeps the response field k out of its
// list of lines: one value each, or Set-Cookie in a list of its own, whose
// order no deletion here changes. Only the other fields can move.
func keptApart(k []byte) bool {
	switch string(k) {
	case fasthttp.HeaderContentLength, fasthttp.HeaderContentType, fasthttp.HeaderContentEncoding,
		fasthttp.HeaderServer, fasthttp.HeaderSetCookie, fasthttp.HeaderTrailer, fasthttp.HeaderConnection,
		fasthttp.HeaderTransferEncoding, fasthttp.HeaderDate:
		return true
	}
	return false
}

// responseRepeats is repeats for a worker's answer: whether it may hold a
// field on more than one line among those a deletion can move (keptApart).
// Allocates nothing.
func responseRepeats(h *fasthttp.ResponseHeader) bool {
	return repeatedName(h.All(), keptApart) // true: stripResponseHopInOrder decides
}

// stripResponseHopInOrder is stripResponseHop for an answer that may hold
// a field on several lines: its lines are copied before stripHop deletes
// anything, and each such field left is rewritten in the worker's order
// (one deletion, then its lines appended), as keepFieldOrder does for a
// request. Slow path: it allocates, for an answer that carries both a
// hop-by-hop header and a repeated field.
//
// It differs from keepFieldOrder, and stays apart from it (see there):
// the worker's order is a copy taken before stripHop (a ResponseHeader
// has no AllInOrder), only fields stripHop left are rewritten (a
// repeated hop-by-hop field the copy holds stays removed:
// TestRepeatedHopFieldStaysRemoved_RDP1), keptApart rather than Cookie
// is skipped, and the fields left are rewritten whether or not a line
// moved (their lines are all there: a field is deleted whole).
func stripResponseHopInOrder(found uint16, h *fasthttp.ResponseHeader) {
	type line struct{ kEnd, vEnd int } // the name ends at kEnd in buf, the value at vEnd
	var buf []byte
	var lines []line
	count := make(map[string]int)
	for k, v := range h.All() {
		if keptApart(k) {
			continue
		}
		count[string(k)]++
		buf = append(buf, k...)
		kEnd := len(buf)
		buf = append(buf, v...)
		lines = append(lines, line{kEnd: kEnd, vEnd: len(buf)})
	}
	stripHop(found, hopExpect, h)
	// Repeated fields stripHop left: a field is deleted whole or not at all.
	left := make(map[string]bool)
	for k := range h.All() {
		if count[string(k)] > 1 {
			left[string(k)] = true
		}
	}
	if len(left) == 0 {
		return
	}
	for k := range left {
		h.Del(k)
	}
	start := 0
	for _, l := range lines {
		if k := buf[start:l.kEnd]; left[string(k)] {
			h.AddBytesKV(k, buf[l.kEnd:l.vEnd])
		}
		start = l.vEnd
	}
}
