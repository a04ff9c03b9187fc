package attest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// The reference worker mints attestations with json.dumps(claims,
// separators=(",", ":")) and its default ensure_ascii=True (pinned
// pinboard/attestation.py). Encoding strings the same way makes our tokens
// byte-identical to the reference's for the same inputs (R-TR-5), which is
// what lets the test vectors pin the format down.

const lowerHex = "0123456789abcdef"

// appendPyString appends s as a JSON string the way Python's
// json.dumps(ensure_ascii=True) writes it: printable ASCII as is except '"'
// and '\\'; \n \r \t \b \f short escapes; every other byte below 0x20, DEL and
// every non-ASCII code point as \uXXXX in lower-case hex, astral code points
// as a surrogate pair. Invalid UTF-8 (which a Python str cannot hold) is
// written as \ufffd. It allocates nothing beyond growing dst.
func appendPyString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch c {
		case '"':
			dst = append(dst, `\"`...)
		case '\\':
			dst = append(dst, `\\`...)
		case '\n':
			dst = append(dst, `\n`...)
		case '\r':
			dst = append(dst, `\r`...)
		case '\t':
			dst = append(dst, `\t`...)
		case '\b':
			dst = append(dst, `\b`...)
		case '\f':
			dst = append(dst, `\f`...)
		default:
			if c < utf8.RuneSelf {
				dst = appendU4(dst, rune(c))
				break
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			i += size
			if r >= 0x10000 {
				r -= 0x10000
				dst = appendU4(dst, 0xd800|(r>>10)&0x3ff)
				dst = appendU4(dst, 0xdc00|r&0x3ff)
			} else {
				dst = appendU4(dst, r)
			}
			continue
		}
		i++
	}
	return append(dst, '"')
}

func appendU4(dst []byte, r rune) []byte {
	return append(dst, '\\', 'u',
		lowerHex[r>>12&0xf], lowerHex[r>>8&0xf], lowerHex[r>>4&0xf], lowerHex[r&0xf])
}

// appendPyJSON re-encodes the JSON document raw compactly, keeping member
// order (json.dumps keeps dict insertion order) and escaping strings with
// appendPyString. Numbers are written as the Node pinboard writes what it
// parsed (appendJSNumber). Used once per passport key, never per request.
func appendPyJSON(dst []byte, raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type frame struct {
		object bool
		n      int // members (object: keys and values) written so far
	}
	var stack []frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			dst = append(dst, byte(d))
			continue
		}
		if len(stack) > 0 {
			top := &stack[len(stack)-1]
			switch {
			case top.object && top.n%2 == 1:
				dst = append(dst, ':')
			case top.n > 0:
				dst = append(dst, ',')
			}
			top.n++
		}
		switch t := tok.(type) {
		case json.Delim:
			dst = append(dst, byte(t))
			stack = append(stack, frame{object: t == '{'})
		case string:
			dst = appendPyString(dst, t)
		case json.Number:
			dst = appendJSNumber(dst, string(t))
		case bool:
			dst = strconv.AppendBool(dst, t)
		case nil:
			dst = append(dst, "null"...)
		default:
			panic(fmt.Sprintf("BUG: unexpected JSON token %T", tok))
		}
	}
	return dst, nil
}

// appendJSNumber writes the JSON number literal lit as JavaScript's
// JSON.stringify writes the double JSON.parse reads it as: the Node
// pinboard parses its passport, so a key's claims reach the worker that
// way, and Python's json reads "1000000" as an int where the passport's
// "1e6" or "1.0" would be a float. Shortest round-trip digits, plain
// decimal for magnitudes in [1e-6, 1e21), else an exponent without
// leading zeros ("1e-7", "1e+21"); -0 is "0", and a literal beyond the
// double range, Infinity to JavaScript, is null.
func appendJSNumber(dst []byte, lit string) []byte {
	f, err := strconv.ParseFloat(lit, 64)
	switch {
	case err != nil || math.IsInf(f, 0): // a json.Number is well formed: only out of range
		return append(dst, "null"...)
	case f == 0:
		return append(dst, '0')
	}
	format := byte('f')
	if a := math.Abs(f); a < 1e-6 || a >= 1e21 {
		format = 'e'
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, format, -1, 64)
	if b := dst[start:]; format == 'e' && len(b) >= 4 && b[len(b)-4] == 'e' && b[len(b)-2] == '0' {
		// Go writes two exponent digits at least: e-07 is e-7.
		b[len(b)-2] = b[len(b)-1]
		dst = dst[:len(dst)-1]
	}
	return dst
}
