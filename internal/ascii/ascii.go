// Package ascii compares and lower-cases host names the DNS way: ASCII
// letters fold, every other byte is itself (RFC 4343). strings.EqualFold
// and strings.ToLower fold Unicode too — "\u212a" (KELVIN SIGN) passes for
// "k" — and Redis's Lua string.lower does not, so a Go side that folded
// Unicode would match host names that are not the same, and disagree with
// the scripts.
package ascii

// Lower lower-cases the ASCII letters of s; s itself when it has none.
func Lower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				b[j] = LowerByte(b[j])
			}
			return string(b)
		}
	}
	return s
}

// IsHex reports whether c is a hexadecimal digit, in either case.
func IsHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c|0x20 && c|0x20 <= 'f'
}

// AppendLower appends s to dst with its ASCII letters lower-cased.
func AppendLower(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = append(dst, LowerByte(s[i]))
	}
	return dst
}

// EqualFold reports whether a and b are equal with ASCII letters compared
// case-insensitively and every other byte exactly. It does not allocate.
func EqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if LowerByte(a[i]) != LowerByte(b[i]) {
			return false
		}
	}
	return true
}

// LowerByte lower-cases c if it is an ASCII capital letter.
func LowerByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// IndexSpaceOrCtl returns the index of the first byte of s that no HTTP
// token or credential may hold — a space, a control byte or DEL (RFC 9110
// §5.5, RFC 6750 §2.1) — or -1. A token read from a secret file usually
// fails it on its trailing newline.
func IndexSpaceOrCtl(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return i
		}
	}
	return -1
}
