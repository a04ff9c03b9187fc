package bench

import (
	"bufio"
	"bytes"
	"testing"
)

func TestWSAcceptRFCExample(t *testing.T) {
	// RFC 6455 §1.3.
	if got := WSAccept([]byte("dGhlIHNhbXBsZSBub25jZQ==")); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("unexpected accept; got %q", got)
	}
}

func TestWSFrameRoundTrip(t *testing.T) {
	for _, n := range []int{0, 5, 125, 126, 200, 65535, 65536, 100_000} {
		for _, masked := range []bool{false, true} {
			payload := make([]byte, n)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			frame := AppendWSFrame(nil, WSBinary, payload, masked, [4]byte{9, 8, 7, 6})
			if masked && n > 0 && bytes.Contains(frame, payload) && n > 8 {
				t.Fatalf("unexpected unmasked payload in a masked frame of %d bytes", n)
			}
			op, fin, got, err := ReadWSFrame(bufio.NewReader(bytes.NewReader(frame)), nil)
			if err != nil {
				t.Fatalf("cannot read a frame of %d bytes (masked %v): %v", n, masked, err)
			}
			if op != WSBinary || !fin || !bytes.Equal(got, payload) {
				t.Fatalf("unexpected frame of %d bytes (masked %v); got op %d fin %v len %d", n, masked, op, fin, len(got))
			}
		}
	}
}

func TestWSFrameRFCExamples(t *testing.T) {
	// RFC 6455 §5.7: a single-frame unmasked and masked text "Hello".
	unmasked := []byte{0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f}
	if got := AppendWSFrame(nil, WSText, []byte("Hello"), false, [4]byte{}); !bytes.Equal(got, unmasked) {
		t.Fatalf("unexpected unmasked frame; got % x", got)
	}
	masked := []byte{0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58}
	if got := AppendWSFrame(nil, WSText, []byte("Hello"), true, [4]byte{0x37, 0xfa, 0x21, 0x3d}); !bytes.Equal(got, masked) {
		t.Fatalf("unexpected masked frame; got % x", got)
	}
	_, _, p, err := ReadWSFrame(bufio.NewReader(bytes.NewReader(masked)), nil)
	if err != nil || string(p) != "Hello" {
		t.Fatalf("unexpected decode of the RFC's masked frame; got %q, %v", p, err)
	}
}

func TestWSFrameTooLarge(t *testing.T) {
	hdr := []byte{0x82, 127, 0, 0, 0, 0, 0x7f, 0, 0, 0}
	if _, _, _, err := ReadWSFrame(bufio.NewReader(bytes.NewReader(hdr)), nil); err != errWSFrameTooLarge {
		t.Fatalf("unexpected error for a 2 GiB frame; got %v", err)
	}
}

func TestSSEParseUint(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "1700000000123456789": 1700000000123456789, "42": 42} {
		if got, ok := parseUint([]byte(in)); !ok || got != want {
			t.Fatalf("unexpected parseUint(%q); got %d, %v", in, got, ok)
		}
	}
	for _, in := range []string{"", "-1", "1a", "12345678901234567890"} {
		if _, ok := parseUint([]byte(in)); ok {
			t.Fatalf("unexpected success parsing %q", in)
		}
	}
}
