package proxy

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/internal/rawio"
)

// A relayed WebSocket is copied byte for byte, but the copier follows the
// frame boundaries (RFC 6455 §5.2) so that shutdown can say goodbye
// properly: a Close frame with status 1001 "going away" (§7.4.1) to the
// client and to the worker, each sent only between two frames, never inside
// one. Control frames may sit between the fragments of a message (§5.4),
// so a frame boundary is always a safe place. A direction that is inside a
// frame when shutdown comes gets its Close frame as soon as that frame
// ends; one still inside a frame at the deadline is cut by closing TCP.

// goingAway is the Close payload: status 1001 and its reason.
var goingAway = append(binary.BigEndian.AppendUint16(nil, 1001), "going away"...)

// frameTracker follows frame boundaries in a byte stream without decoding
// payloads. The zero value is at a boundary.
type frameTracker struct {
	hdr  [14]byte
	hn   int    // header bytes seen of the current frame
	need int    // header length, known once two bytes are in
	left uint64 // payload bytes left in the current frame
	lost bool   // an impossible length: never at a boundary again
}

// boundary reports whether the bytes so far end exactly between frames.
func (f *frameTracker) boundary() bool { return !f.lost && f.hn == 0 && f.left == 0 }

// span consumes bytes of p up to the end of the current frame and returns
// how many: all of p when the frame goes on past it.
func (f *frameTracker) span(p []byte) int {
	if f.lost {
		return len(p)
	}
	i := 0
	for i < len(p) {
		if f.left > 0 {
			n := uint64(len(p) - i)
			if n > f.left {
				n = f.left
			}
			i += int(n)
			f.left -= n
			if f.left == 0 {
				return i
			}
			continue
		}
		f.hdr[f.hn] = p[i]
		f.hn++
		i++
		if f.hn == 2 {
			f.need = 2
			switch f.hdr[1] & 0x7f {
			case 126:
				f.need += 2
			case 127:
				f.need += 8
			}
			if f.hdr[1]&0x80 != 0 {
				f.need += 4 // masking key
			}
		}
		if f.hn < 2 || f.hn < f.need {
			continue
		}
		var n uint64
		switch l := f.hdr[1] & 0x7f; l {
		case 126:
			n = uint64(binary.BigEndian.Uint16(f.hdr[2:4]))
		case 127:
			n = binary.BigEndian.Uint64(f.hdr[2:10])
			if n>>63 != 0 { // §5.2: the most significant bit must be 0
				f.lost = true
				return len(p)
			}
		default:
			n = uint64(l)
		}
		f.hn, f.need, f.left = 0, 0, n
		if n == 0 {
			return i
		}
	}
	return i
}

// wsDir is one direction of a relay.
type wsDir struct {
	src, dst net.Conn
	// mask: frames this relay writes to dst must be masked (toward the
	// worker, where pinboard is the client, §5.3).
	mask  bool
	going *atomic.Bool
	// goodbye is the relay's wsRelay.goodbye.
	goodbye *atomic.Int64

	// stall bounds each write to dst (UpstreamOptions.StallTimeout; 0:
	// none): a peer that stops reading while the other sends is cut
	// instead of holding the relay for ever. An idle relay writes nothing
	// and is never cut.
	stall time.Duration

	mu     sync.Mutex
	fr     frameTracker
	closed bool // our Close frame went out: nothing more is forwarded

	// renewHook, when set (tests only), runs between forward's look at
	// going and its renewal of the write deadline.
	renewHook func()
}

// wsBufs are the relays' copy buffers, held only while bytes move.
var wsBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copy forwards src to dst until either fails. It waits for src without a
// buffer (rawio.AwaitEdge) and takes one from wsBufs only to move what
// arrived: an idle WebSocket holds no copy buffer (two of 32 KiB before).
func (d *wsDir) copy() error {
	for {
		// An error here is the read's to report. AwaitEdge does not look
		// again once woken: a message costs a look and a read instead of
		// two looks and a read; a wake for bytes already read finds
		// nothing (ErrWouldBlock) and waits again, without a buffer.
		_ = rawio.AwaitEdge(d.src)
		bp := wsBufs.Get().(*[]byte)
		n, err := rawio.TryRead(d.src, *bp)
		if errors.Is(err, rawio.ErrWouldBlock) {
			wsBufs.Put(bp)
			continue
		}
		var werr error
		if n > 0 {
			werr = d.forward((*bp)[:n])
		}
		wsBufs.Put(bp)
		if werr != nil {
			return werr
		}
		if err != nil {
			return err
		}
	}
}

// forward writes p frame piece by frame piece, sending the Close frame at
// the first boundary once shutdown began. After it, bytes are dropped: an
// endpoint that sent Close sends no more data (§5.5.1).
func (d *wsDir) forward(p []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(p) > 0 && !d.closed {
		n := d.fr.span(p)
		if !d.going.Load() {
			if d.renewHook != nil {
				d.renewHook()
			}
			rawio.KeepWriteDeadline(d.dst, time.Now(), d.stall)
			// Shutdown's deadline, once set, is not pushed back: a goodbye
			// that came since the look at going set its deadline before
			// this renewal replaced it, for a write that could then
			// block for the whole stall timeout. goAway sets goodbye,
			// then going, then the deadline, so either its deadline comes
			// after the renewal or going is seen here.
			if d.going.Load() {
				_ = d.dst.SetWriteDeadline(time.Unix(0, d.goodbye.Load()))
			}
		}
		if _, err := d.dst.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
		if d.going.Load() && d.fr.boundary() {
			d.sendClose()
		}
	}
	return nil
}

// tryClose sends the Close frame now if dst is between frames; otherwise
// forward sends it when the current frame ends. A forward blocked writing
// holds mu: tryClose does not wait for it (the forward checks going once
// its write returns), it only retries briefly in case the forward was just
// finishing.
func (d *wsDir) tryClose() {
	for i := 0; ; i++ {
		if d.mu.TryLock() {
			break
		}
		if i == 20 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	defer d.mu.Unlock()
	if !d.closed && d.fr.boundary() {
		d.sendClose()
	}
}

// sendClose writes Close 1001 to dst. Called with mu held.
func (d *wsDir) sendClose() {
	d.closed = true
	frame := make([]byte, 0, 6+len(goingAway))
	frame = append(frame, 0x88) // FIN, opcode 8 (Close)
	if !d.mask {
		frame = append(frame, byte(len(goingAway)))
		frame = append(frame, goingAway...)
	} else {
		var key [4]byte
		_, _ = rand.Read(key[:])
		frame = append(frame, 0x80|byte(len(goingAway)))
		frame = append(frame, key[:]...)
		for i, c := range goingAway {
			frame = append(frame, c^key[i%4])
		}
	}
	_, _ = d.dst.Write(frame)
}

// wsRelay is one relayed WebSocket: client and worker connections and the
// two directions between them.
type wsRelay struct {
	client, upstream net.Conn
	going            atomic.Bool
	// goodbye is shutdown's deadline (unix ns), set before going.
	goodbye  atomic.Int64
	up, down wsDir // client→worker, worker→client

	// hs orders the 101 before any Close frame toward the client: a
	// goodbye that comes while the handshake is not yet written only marks
	// the relay (going, dl) and bounds the connections by dl, and the
	// relay sends it once the 101 is out.
	hs      sync.Mutex
	started bool      // the 101 went to the client
	dl      time.Time // the goodbye's deadline, once going

	// owner is the session the worker's side belongs to: a relay whose
	// session ended is told goodbye (hijacks.endRevoked). Nil in tests
	// that relay without a directory.
	owner *directory.Owner
}

func newWSRelay(client, upstream net.Conn, stall time.Duration) *wsRelay {
	r := &wsRelay{client: client, upstream: upstream}
	r.up = wsDir{src: client, dst: upstream, mask: true, going: &r.going, goodbye: &r.goodbye, stall: stall}
	r.down = wsDir{src: upstream, dst: client, going: &r.going, goodbye: &r.goodbye, stall: stall}
	return r
}

// goAway is shutdown, deferred until the 101 has reached the client when
// it has not yet (see hs).
func (r *wsRelay) goAway(deadline time.Time) {
	r.hs.Lock()
	r.goodbye.Store(deadline.UnixNano())
	r.going.Store(true)
	r.dl = deadline
	started := r.started
	r.hs.Unlock()
	if started {
		r.shutdown(deadline)
		return
	}
	// The 101 is not through yet: its write, which a client that does not
	// read can hold for ever, is bounded by the deadline like the rest of
	// the relay; the relay sends the Close frames once it is through.
	_ = r.client.SetDeadline(deadline)
	_ = r.upstream.SetDeadline(deadline)
}

// writeHandshake sends the worker's 101 to the client and reports whether
// a goodbye came before it was through, and its deadline. hs is not held
// across the write: goAway must not wait behind it.
func (r *wsRelay) writeHandshake(handshake []byte) (going bool, deadline time.Time, err error) {
	_, err = r.client.Write(handshake)
	r.hs.Lock()
	defer r.hs.Unlock()
	r.started = true
	return r.going.Load(), r.dl, err
}

// capToGoodbye sets the deadline set applies (a read deadline) back to
// shutdown's once one is set and earlier than t, the deadline just set:
// a renewal may not push the goodbye's back (see wsDir.forward).
func (r *wsRelay) capToGoodbye(t time.Time, set func(time.Time) error) {
	if !r.going.Load() {
		return
	}
	if g := time.Unix(0, r.goodbye.Load()); g.Before(t) {
		_ = set(g)
	}
}

// shutdown starts the closing handshake in both directions and bounds what
// is left of the relay by deadline: the peers answer Close and the worker
// closes its connection, which ends the relay; a peer that does not, or a
// direction stuck inside a frame, is cut at the deadline.
func (r *wsRelay) shutdown(deadline time.Time) {
	r.goodbye.Store(deadline.UnixNano())
	r.going.Store(true)
	_ = r.client.SetDeadline(deadline)
	_ = r.upstream.SetDeadline(deadline)
	r.down.tryClose()
	r.up.tryClose()
}
