package attest

import (
	"errors"
	"math"
	"strconv"
)

// pyLoads parses the bytes of a token segment the way the reference's
// json.loads (CPython 3.11, C scanner, strict=True) does, because whether a
// worker accepts an attestation is decided by that parser (R-TR-5). The
// differences from encoding/json that matter:
//
//   - the input may be UTF-16 or UTF-32 (see pyDecodeText) and strings may
//     hold lone surrogates;
//   - NaN, Infinity and -Infinity are numbers;
//   - an integer literal (no fraction, no exponent) is an int of any size,
//     except that more than 4300 digits raises ValueError (CPython's
//     int_max_str_digits); a literal with fraction or exponent is a float;
//   - duplicate object keys: the last value wins;
//   - nesting too deep raises RecursionError. Python's limit depends on how
//     deep the caller's stack already is; we reject beyond pyMaxDepth levels.
//     No attestation the reference or pinboard mints nests beyond three.
//
// The parser runs only after the signature checks out, so its input was
// produced by a holder of the secret.
func pyLoads(b []byte) (*pyValue, error) {
	text, ok := pyDecodeText(b)
	if !ok {
		return nil, errPyDecode
	}
	p := pyParser{s: text}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return nil, errPyExtraData
	}
	return v, nil
}

const (
	pyMaxDepth     = 512
	pyMaxIntDigits = 4300
)

var (
	errPyDecode     = errors.New("not decodable text")
	errPyExtraData  = errors.New("extra data after the JSON value")
	errPySyntax     = errors.New("invalid JSON")
	errPyIntDigits  = errors.New("integer literal exceeds 4300 digits")
	errPyRecursion  = errors.New("nested too deeply")
	errPyBadString  = errors.New("invalid JSON string")
	errPyUnexpected = errors.New("unexpected end of JSON input")
)

// pyKind is the Python type json.loads produces.
type pyKind uint8

const (
	pyNone pyKind = iota
	pyBool
	pyInt
	pyFloat
	pyStr
	pyList
	pyDict
)

// pyValue is one parsed JSON value.
type pyValue struct {
	kind pyKind
	// str holds a pyStr's value (generalized UTF-8) or a pyInt's literal.
	str     string
	list    []*pyValue
	members []pyMember // pyDict, in first-insertion order, keys unique
	raw     []byte     // the value's text, for handing objects on unparsed
	truth   bool       // pyBool
}

// pyMember is one key of a dict and its value.
type pyMember struct {
	key string
	val *pyValue
}

// get returns the dict member named key, or nil.
func (v *pyValue) get(key string) *pyValue {
	for i := range v.members {
		if v.members[i].key == key {
			return v.members[i].val
		}
	}
	return nil
}

// isStr reports whether v is a str equal to s.
func (v *pyValue) isStr(s string) bool {
	return v != nil && v.kind == pyStr && v.str == s
}

// int64Value returns a pyInt's value clamped to the int64 range, and
// whether it was clamped.
func (v *pyValue) int64Value() (n int64, clamped bool) {
	n, err := strconv.ParseInt(v.str, 10, 64)
	if err == nil {
		return n, false
	}
	if v.str[0] == '-' {
		return math.MinInt64, true
	}
	return math.MaxInt64, true
}

type pyParser struct {
	s     []byte
	i     int
	arena []pyValue // values are carved from chunks: one allocation per 8
}

// newValue returns a zeroed value of kind k. Chunks are never regrown, so
// returned pointers stay valid.
func (p *pyParser) newValue(k pyKind) *pyValue {
	if len(p.arena) == cap(p.arena) {
		p.arena = make([]pyValue, 0, 8)
	}
	p.arena = append(p.arena, pyValue{kind: k})
	return &p.arena[len(p.arena)-1]
}

// skipSpace skips JSON white space; Python's set is exactly " \t\n\r".
func (p *pyParser) skipSpace() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *pyParser) literal(word string) bool {
	if len(p.s)-p.i >= len(word) && string(p.s[p.i:p.i+len(word)]) == word {
		p.i += len(word)
		return true
	}
	return false
}

// value parses one value at p.i, like the C scanner's scan_once.
func (p *pyParser) value(depth int) (*pyValue, error) {
	if p.i >= len(p.s) {
		return nil, errPyUnexpected
	}
	start := p.i
	var v *pyValue
	var err error
	switch c := p.s[p.i]; {
	case c == '"':
		p.i++
		var s string
		if s, err = p.str(); err == nil {
			v = p.newValue(pyStr)
			v.str = s
		}
	case c == '{':
		v, err = p.object(depth + 1)
	case c == '[':
		v, err = p.array(depth + 1)
	case c == 'n' && p.literal("null"):
		v = p.newValue(pyNone)
	case c == 't' && p.literal("true"):
		v = p.newValue(pyBool)
		v.truth = true
	case c == 'f' && p.literal("false"):
		v = p.newValue(pyBool)
	case c == 'N' && p.literal("NaN"), c == 'I' && p.literal("Infinity"), c == '-' && p.literal("-Infinity"):
		v = p.newValue(pyFloat)
	default:
		v, err = p.number()
	}
	if err != nil {
		return nil, err
	}
	v.raw = p.s[start:p.i]
	return v, nil
}

// number parses -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?. Like the C
// scanner it stops before a '.' or 'e' not followed by digits, leaving the
// caller to reject what follows.
func (p *pyParser) number() (*pyValue, error) {
	start := p.i
	if p.i < len(p.s) && p.s[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.s) && '1' <= p.s[p.i] && p.s[p.i] <= '9':
		p.i++
		p.digits()
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	default:
		return nil, errPySyntax
	}
	intEnd := p.i
	float := false
	if p.i+1 < len(p.s) && p.s[p.i] == '.' && isDigit(p.s[p.i+1]) {
		p.i += 2
		p.digits()
		float = true
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		e := p.i
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '-' || p.s[p.i] == '+') {
			p.i++
		}
		if p.digits() > 0 {
			float = true
		} else {
			p.i = e
		}
	}
	if float {
		return p.newValue(pyFloat), nil
	}
	lit := string(p.s[start:intEnd])
	if digits := len(lit) - boolInt(lit[0] == '-'); digits > pyMaxIntDigits {
		return nil, errPyIntDigits
	}
	v := p.newValue(pyInt)
	v.str = lit
	return v, nil
}

func (p *pyParser) digits() int {
	n := 0
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
		n++
	}
	return n
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// str parses a string body after its opening quote, like scanstring with
// strict=True: no raw control characters, the JSON escapes only, \uXXXX
// high+low surrogate escapes combined and lone ones kept.
func (p *pyParser) str() (string, error) {
	start := p.i
	var buf []byte // nil until the first escape
	for {
		if p.i >= len(p.s) {
			return "", errPyBadString
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			var s string
			if buf == nil {
				s = string(p.s[start:p.i])
			} else {
				s = string(buf)
			}
			p.i++
			return s, nil
		case c < 0x20:
			return "", errPyBadString
		case c != '\\':
			if buf != nil {
				buf = append(buf, c)
			}
			p.i++
			continue
		}
		if buf == nil {
			buf = append([]byte(nil), p.s[start:p.i]...)
		}
		if p.i+1 >= len(p.s) {
			return "", errPyBadString
		}
		esc := p.s[p.i+1]
		p.i += 2
		switch esc {
		case '"', '\\', '/':
			buf = append(buf, esc)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := p.hex4(p.i)
			if !ok {
				return "", errPyBadString
			}
			p.i += 4
			if r >= 0xd800 && r <= 0xdbff && p.i+1 < len(p.s) && p.s[p.i] == '\\' && p.s[p.i+1] == 'u' {
				r2, ok := p.hex4(p.i + 2)
				if !ok {
					return "", errPyBadString
				}
				if r2 >= 0xdc00 && r2 <= 0xdfff {
					r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
					p.i += 6
				}
			}
			buf = appendCodePoint(buf, r)
		default:
			return "", errPyBadString
		}
	}
}

func (p *pyParser) hex4(at int) (rune, bool) {
	if at+4 > len(p.s) {
		return 0, false
	}
	var r rune
	for _, c := range p.s[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func (p *pyParser) object(depth int) (*pyValue, error) {
	if depth > pyMaxDepth {
		return nil, errPyRecursion
	}
	v := p.newValue(pyDict)
	p.i++ // '{'
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return v, nil
	}
	var index map[string]int // built once an object grows past a few keys
	for {
		if p.i >= len(p.s) || p.s[p.i] != '"' {
			return nil, errPySyntax
		}
		p.i++
		key, err := p.str()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return nil, errPySyntax
		}
		p.i++
		p.skipSpace()
		val, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		v.set(key, val, &index)
		done, err := p.after('}')
		if err != nil {
			return nil, err
		}
		if done {
			return v, nil
		}
	}
}

// set stores a member, the last duplicate winning as in a Python dict.
func (v *pyValue) set(key string, val *pyValue, index *map[string]int) {
	if *index == nil && len(v.members) >= 16 {
		*index = make(map[string]int, 2*len(v.members))
		for i, m := range v.members {
			(*index)[m.key] = i
		}
	}
	if *index != nil {
		if i, ok := (*index)[key]; ok {
			v.members[i].val = val
			return
		}
		(*index)[key] = len(v.members)
	} else {
		for i := range v.members {
			if v.members[i].key == key {
				v.members[i].val = val
				return
			}
		}
	}
	v.members = append(v.members, pyMember{key, val})
}

func (p *pyParser) array(depth int) (*pyValue, error) {
	if depth > pyMaxDepth {
		return nil, errPyRecursion
	}
	v := p.newValue(pyList)
	p.i++ // '['
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		elem, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		v.list = append(v.list, elem)
		done, err := p.after(']')
		if err != nil {
			return nil, err
		}
		if done {
			return v, nil
		}
	}
}

// after reads what follows a member of an object or an element of an
// array: the container's closing byte (done) or a comma and the space
// after it (another member follows).
func (p *pyParser) after(closing byte) (done bool, err error) {
	p.skipSpace()
	if p.i >= len(p.s) {
		return false, errPyUnexpected
	}
	switch p.s[p.i] {
	case closing:
		p.i++
		return true, nil
	case ',':
		p.i++
		p.skipSpace()
		return false, nil
	}
	return false, errPySyntax
}
