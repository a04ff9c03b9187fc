package registry

import (
	"strconv"
)

// decodeFast decodes a heartbeat body in the form workers send —
// an object of the six members 003_d935a1d8ec89be7a.txt names, each at
// most once, strings of printable ASCII without escapes, a plain JSON
// number for headroom — into hb, exactly as decodeJSON would, and reports
// whether it did (fastBody). Anything else (another key, a null, an
// escape, a non-ASCII byte, a syntax error) is left to decodeJSON, which
// reads every body as the reference does: ok false, hb untouched.
//
// Why: decodeJSON is encoding/json plus a reflective check of the keys, about
// 8 µs and 19 allocations a body; with 10,000 workers (3,333 heartbeats a
// second) it was the largest piece of pinboard's own work in a heartbeat
// storm (docs/bench/HISTORY.md). FuzzHeartbeatFastDecodeAgrees_RREG2 holds the two
// equal on every body this accepts.
func (hb *heartbeatBody) decodeFast(b []byte) bool {
	d := fastDec{b: b}
	var out heartbeatBody
	var seen uint8
	d.ws()
	if !d.eat('{') {
		return false
	}
	d.ws()
	if d.eat('}') {
		return d.end(hb, &out)
	}
	for {
		key, ok := d.str()
		if !ok {
			return false
		}
		d.ws()
		if !d.eat(':') {
			return false
		}
		d.ws()
		var bit uint8
		switch string(key) { // compared, not copied
		case "sessionId":
			bit = 1
			out.SessionID, ok = d.strPtr()
		case "headroom":
			bit = 2
			out.Headroom, ok = d.num()
		case "draining":
			bit = 4
			out.Draining, ok = d.boolean()
		case "challenge":
			bit = 8
			out.Challenge, ok = d.strPtr()
		case "challengeValue":
			bit = 16
			out.ChallengeValue, ok = d.strPtr()
		case "acks":
			bit = 32
			out.Acks.list, ok = d.strs()
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		d.ws()
		if d.eat('}') {
			return d.end(hb, &out)
		}
		if !d.eat(',') {
			return false
		}
		d.ws()
	}
}

// fastDec reads b from i on; every method reports failure instead of
// erring, and the caller gives up on the body.
type fastDec struct {
	b []byte
	i int
}

// end accepts the body when only white space follows the object.
func (d *fastDec) end(hb, out *heartbeatBody) bool {
	d.ws()
	if d.i != len(d.b) {
		return false
	}
	*hb = *out
	return true
}

func (d *fastDec) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *fastDec) eat(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes; its bytes alias b.
func (d *fastDec) str() ([]byte, bool) {
	if !d.eat('"') {
		return nil, false
	}
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
		d.i++
	}
	return nil, false
}

// strPtr reads a string value, copied.
func (d *fastDec) strPtr() (*string, bool) {
	s, ok := d.str()
	if !ok {
		return nil, false
	}
	c := string(s)
	return &c, true
}

// num reads a JSON number (RFC 8259 §6) as encoding/json decodes it into a
// float64: strconv.ParseFloat of its text, a value out of range left to
// decode (which refuses it as a schema failure).
func (d *fastDec) num() (*float64, bool) {
	start := d.i
	d.eat('-')
	switch {
	case d.eat('0'):
	case d.i < len(d.b) && d.b[d.i] >= '1' && d.b[d.i] <= '9':
		d.digits()
	default:
		return nil, false
	}
	if d.eat('.') && !d.digits() {
		return nil, false
	}
	if d.eat('e') || d.eat('E') {
		if !d.eat('+') {
			d.eat('-')
		}
		if !d.digits() {
			return nil, false
		}
	}
	f, err := strconv.ParseFloat(string(d.b[start:d.i]), 64)
	if err != nil {
		return nil, false
	}
	return &f, true
}

// digits reads one or more decimal digits.
func (d *fastDec) digits() bool {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	return d.i > start
}

func (d *fastDec) boolean() (*bool, bool) {
	var v bool
	switch {
	case d.lit("true"):
		v = true
	case d.lit("false"):
	default:
		return nil, false
	}
	return &v, true
}

func (d *fastDec) lit(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// strs reads an array of strings (acks).
func (d *fastDec) strs() (*[]*string, bool) {
	if !d.eat('[') {
		return nil, false
	}
	out := []*string{}
	d.ws()
	if d.eat(']') {
		return &out, true
	}
	for {
		s, ok := d.strPtr()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		d.ws()
		if d.eat(']') {
			return &out, true
		}
		if !d.eat(',') {
			return nil, false
		}
		d.ws()
	}
}
