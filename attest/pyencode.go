package attest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// appendPyString. Numbers keep their literal text. Used once per passport
// key, never per request.
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
			dst = append(dst, t...)
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
