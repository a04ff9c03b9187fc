package attest

// pyB64URLDecode decodes one token segment exactly as the reference's
// _b64url_decode does: it appends "=" * (-len(segment) % 4), maps '-' to '+'
// and '_' to '/', and calls binascii.a2b_base64 in its default non-strict
// mode (CPython 3.11). That mode is far more lenient than
// base64.RawURLEncoding, and verification must accept what the reference
// accepts (R-TR-5):
//
//   - both alphabets: '+' and '/' decode like '-' and '_';
//   - bytes outside the alphabet are skipped;
//   - '=' before the second character of a quad is skipped; once a quad has
//     two or more characters, enough '=' to complete it ends decoding and
//     everything after is ignored; a data character resets the '=' count;
//   - leftover bits in the last character are ignored;
//   - input ending inside a quad is an error ("Incorrect padding", or one
//     character more than a multiple of four).
//
// seg must be ASCII (VerifyAttestation rejects anything else first, as the
// reference's str.encode("ascii") would). ok is false where Python raises.
func pyB64URLDecode(dst []byte, seg string) (out []byte, ok bool) {
	quad, pads := 0, 0
	var left byte
	total := len(seg) + (4-len(seg)%4)%4
	for i := 0; i < total; i++ {
		c := byte('=')
		if i < len(seg) {
			c = seg[i]
		}
		if c == '=' {
			if quad >= 2 {
				pads++
				if quad+pads >= 4 {
					return dst, true
				}
			}
			continue
		}
		v := b64Value(c)
		if v < 0 {
			continue
		}
		pads = 0
		switch quad {
		case 0:
			left = byte(v)
			quad = 1
		case 1:
			dst = append(dst, left<<2|byte(v)>>4)
			left = byte(v) & 0x0f
			quad = 2
		case 2:
			dst = append(dst, left<<4|byte(v)>>2)
			left = byte(v) & 0x03
			quad = 3
		case 3:
			dst = append(dst, left<<6|byte(v))
			quad = 0
		}
	}
	return dst, quad == 0
}

// b64Value maps both the standard and the URL-safe alphabet to 0..63, and
// everything else to -1.
func b64Value(c byte) int {
	switch {
	case 'A' <= c && c <= 'Z':
		return int(c - 'A')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 26
	case '0' <= c && c <= '9':
		return int(c-'0') + 52
	case c == '+' || c == '-':
		return 62
	case c == '/' || c == '_':
		return 63
	}
	return -1
}
