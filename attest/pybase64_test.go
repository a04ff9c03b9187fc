package attest

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestPyB64URLDecode_ReferenceVectors_RTR5 compares the lenient decoder with
// the reference's _b64url_decode over fixed and random segments.
func TestPyB64URLDecode_ReferenceVectors_RTR5(t *testing.T) {
	for _, bv := range vectors(t).Base64 {
		got, ok := pyB64URLDecode(nil, bv.Segment)
		switch {
		case bv.Hex == nil && ok:
			t.Errorf("unexpected success for %q; got %x; the reference raises", bv.Segment, got)
		case bv.Hex != nil && !ok:
			t.Errorf("unexpected failure for %q; want %s", bv.Segment, *bv.Hex)
		case bv.Hex != nil && hex.EncodeToString(got) != *bv.Hex:
			t.Errorf("unexpected bytes for %q; got %x; want %s", bv.Segment, got, *bv.Hex)
		}
	}
}

// FuzzPyB64URLDecode_RTR5 checks the lenient decoder against encoding/base64
// where Python's a2b_base64 and Go's decoders agree: canonical unpadded
// base64url and padded standard base64 decode to the same bytes, and
// characters outside both alphabets are skipped. The output never exceeds
// three bytes per four characters (R-TR-5).
func FuzzPyB64URLDecode_RTR5(f *testing.F) {
	for _, s := range []string{"", "eyJhbGciOiJIUzI1NiJ9", "YQ", "YWI", "YQ==", "Y=Q", "YQ=x", "Y", "a+/-_b", "!!YQ!!", "YQ===YQ", "====", "YW=I"} {
		f.Add(s)
	}
	for _, bv := range vectors(f).Base64[:64] {
		f.Add(bv.Segment)
	}
	f.Fuzz(func(t *testing.T, seg string) {
		out, ok := pyB64URLDecode(nil, seg)
		if len(out) > (len(seg)+3)/4*3 {
			t.Fatalf("unexpected output length for %q; got %d bytes", seg, len(out))
		}
		if want, err := base64.RawURLEncoding.DecodeString(seg); err == nil && (!ok || !bytes.Equal(out, want)) {
			t.Fatalf("unexpected decoding of %q; got %x, %v; encoding/base64 %x", seg, out, ok, want)
		}
		if want, err := base64.StdEncoding.DecodeString(seg); err == nil && (!ok || !bytes.Equal(out, want)) {
			t.Fatalf("unexpected decoding of %q; got %x, %v; encoding/base64 %x", seg, out, ok, want)
		}
		// Dropping the bytes a2b_base64 skips changes nothing but the
		// padding the reference appends, which only counts the length.
		kept := strings.Map(func(r rune) rune {
			if r == '=' || b64Value(byte(r)) >= 0 && r < utf8.RuneSelf {
				return r
			}
			return -1
		}, seg)
		if len(kept)%4 == len(seg)%4 {
			again, ok2 := pyB64URLDecode(nil, kept)
			if ok2 != ok || ok && !bytes.Equal(again, out) {
				t.Fatalf("unexpected decoding of %q once %q is left; got %x, %v; want %x, %v", seg, kept, again, ok2, out, ok)
			}
		}
		// Round trip: what RawURLEncoding writes decodes back.
		enc := base64.RawURLEncoding.EncodeToString([]byte(seg))
		if back, ok := pyB64URLDecode(nil, enc); !ok || string(back) != seg {
			t.Fatalf("unexpected round trip of %q; got %q, %v", seg, back, ok)
		}
	})
}
