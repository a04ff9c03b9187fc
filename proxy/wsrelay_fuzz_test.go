package proxy

import (
	"encoding/binary"
	"slices"
	"testing"
)

// FuzzFrameTracker_RDP2 feeds a byte stream to frameTracker in pieces of
// fuzzed sizes and compares the boundaries it reports with those of a
// whole-stream frame decoder (RFC 6455 §5.2): every frame end, no other
// offset, and nothing once a length has its top bit set. A Close frame
// written at a reported boundary is then never inside a frame.
func FuzzFrameTracker_RDP2(f *testing.F) {
	f.Add(append(frame(0x1, []byte("hi"), false), frame(0x9, nil, true)...), []byte{0})
	f.Add(frame(0x2, make([]byte, 300), true), []byte{2, 0, 6})
	f.Add([]byte{0x82, 0x7f, 0x80, 0, 0, 0, 0, 0, 0, 1, 0x81, 0}, []byte{3})
	f.Add([]byte{0x82, 0xfe, 0, 0, 1, 2, 3, 4, 0x81, 0x80, 1, 2, 3, 4}, []byte{1, 9})
	f.Fuzz(func(t *testing.T, stream, pieces []byte) {
		var want []int
		for off := 0; off+2 <= len(stream); {
			hl := 2
			l := uint64(stream[off+1] & 0x7f)
			switch l {
			case 126:
				hl += 2
			case 127:
				hl += 8
			}
			if stream[off+1]&0x80 != 0 {
				hl += 4
			}
			if off+hl > len(stream) {
				break
			}
			switch l {
			case 126:
				l = uint64(binary.BigEndian.Uint16(stream[off+2:]))
			case 127:
				l = binary.BigEndian.Uint64(stream[off+2:])
			}
			if l>>63 != 0 || l > uint64(len(stream)-off-hl) {
				break
			}
			off += hl + int(l)
			want = append(want, off)
		}
		var fr frameTracker
		var got []int
		off := 0
		for i := 0; off < len(stream); i++ {
			size := len(stream)
			if len(pieces) > 0 {
				size = int(pieces[i%len(pieces)]) + 1
			}
			p := stream[off:min(off+size, len(stream))]
			for len(p) > 0 {
				n := fr.span(p)
				if n <= 0 || n > len(p) {
					t.Fatalf("unexpected span %d of %d bytes", n, len(p))
				}
				off += n
				p = p[n:]
				if fr.boundary() {
					got = append(got, off)
				}
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("unexpected boundaries of %x; got %v; want %v", stream, got, want)
		}
	})
}
