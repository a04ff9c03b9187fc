package attest

import (
	"encoding/hex"
	"testing"
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
