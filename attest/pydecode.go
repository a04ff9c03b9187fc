package attest

import (
	"bytes"
	"unicode/utf8"
)

// pyDecodeText turns the bytes json.loads receives into text the way CPython
// 3.11 does for bytes input: json.detect_encoding picks UTF-32, UTF-16 or
// UTF-8 from a BOM or the pattern of NUL bytes in the first four bytes, and
// the bytes are decoded with errors="surrogatepass". ok is false where
// Python raises UnicodeDecodeError.
//
// The result is "generalized UTF-8": UTF-8 in which a lone surrogate code
// point (which surrogatepass lets through, and a Python str may hold) is
// written with the usual three-byte pattern. Equal Python strings map to
// equal byte strings and code point order is byte order, so comparisons
// keep the reference's meaning. Valid UTF-8 input is returned as is.
func pyDecodeText(b []byte) (text []byte, ok bool) {
	switch {
	case bytes.HasPrefix(b, []byte{0x00, 0x00, 0xfe, 0xff}):
		return decodeUTF32(b[4:], true)
	case bytes.HasPrefix(b, []byte{0xff, 0xfe, 0x00, 0x00}):
		return decodeUTF32(b[4:], false)
	case bytes.HasPrefix(b, []byte{0xfe, 0xff}):
		return decodeUTF16(b[2:], true)
	case bytes.HasPrefix(b, []byte{0xff, 0xfe}):
		return decodeUTF16(b[2:], false)
	case bytes.HasPrefix(b, []byte{0xef, 0xbb, 0xbf}):
		return b[3:], validSurrogatePassUTF8(b[3:])
	}
	switch {
	case len(b) >= 4 && b[0] == 0 && b[1] != 0:
		return decodeUTF16(b, true)
	case len(b) >= 4 && b[0] == 0:
		return decodeUTF32(b, true)
	case len(b) >= 4 && b[1] == 0 && (b[2] != 0 || b[3] != 0):
		return decodeUTF16(b, false)
	case len(b) >= 4 && b[1] == 0:
		return decodeUTF32(b, false)
	case len(b) == 2 && b[0] == 0:
		return decodeUTF16(b, true)
	case len(b) == 2 && b[1] == 0:
		return decodeUTF16(b, false)
	}
	return b, validSurrogatePassUTF8(b)
}

// validSurrogatePassUTF8 reports whether Python's UTF-8 decoder with
// surrogatepass accepts b: strict UTF-8 plus encoded surrogates
// (ED A0..BF 80..BF).
func validSurrogatePassUTF8(b []byte) bool {
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			if !isEncodedSurrogate(b[i:]) {
				return false
			}
			size = 3
		}
		i += size
	}
	return true
}

func isEncodedSurrogate(b []byte) bool {
	return len(b) >= 3 && b[0] == 0xed && b[1]&0xe0 == 0xa0 && b[2]&0xc0 == 0x80
}

// appendCodePoint writes r in generalized UTF-8 (surrogates included).
func appendCodePoint(dst []byte, r rune) []byte {
	if r >= 0xd800 && r <= 0xdfff {
		return append(dst, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
	}
	return utf8.AppendRune(dst, r)
}

// decodeUTF16 decodes UTF-16 with surrogatepass: pairs combine, lone
// surrogates pass through; an odd trailing byte is an error.
func decodeUTF16(b []byte, bigEndian bool) ([]byte, bool) {
	if len(b)%2 != 0 {
		return nil, false
	}
	unit := func(i int) rune {
		if bigEndian {
			return rune(b[i])<<8 | rune(b[i+1])
		}
		return rune(b[i+1])<<8 | rune(b[i])
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i += 2 {
		r := unit(i)
		if r >= 0xd800 && r <= 0xdbff && i+3 < len(b) {
			if r2 := unit(i + 2); r2 >= 0xdc00 && r2 <= 0xdfff {
				r = 0x10000 + (r-0xd800)<<10 + (r2 - 0xdc00)
				i += 2
			}
		}
		out = appendCodePoint(out, r)
	}
	return out, true
}

// decodeUTF32 decodes UTF-32 with surrogatepass: any code point up to
// U+10FFFF, surrogates included; a trailing partial unit is an error.
func decodeUTF32(b []byte, bigEndian bool) ([]byte, bool) {
	if len(b)%4 != 0 {
		return nil, false
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i += 4 {
		var r uint32
		if bigEndian {
			r = uint32(b[i])<<24 | uint32(b[i+1])<<16 | uint32(b[i+2])<<8 | uint32(b[i+3])
		} else {
			r = uint32(b[i+3])<<24 | uint32(b[i+2])<<16 | uint32(b[i+1])<<8 | uint32(b[i])
		}
		if r > utf8.MaxRune {
			return nil, false
		}
		out = appendCodePoint(out, rune(r))
	}
	return out, true
}
