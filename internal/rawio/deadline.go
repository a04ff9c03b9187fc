package rawio

import (
	"errors"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// KeepWriteDeadline keeps c's write deadline about d ahead of now, so that
// a peer that stops reading is cut about d after the last write that was
// due: on a *Conn it is set only once it drifted by more than
// min(1s, d/10) — a busy connection pays a runtime timer operation about
// once a second instead of once per response. Other connections get it
// set on every call. d ≤ 0 or a nil c does nothing.
func KeepWriteDeadline(c net.Conn, now time.Time, d time.Duration) {
	if d <= 0 || c == nil {
		return
	}
	if rc, ok := c.(*Conn); ok {
		rc.KeepWriteDeadline(now, d)
		return
	}
	_ = c.SetWriteDeadline(now.Add(d))
}

// KeepWriteDeadline is the package function for a *Conn, whose caller
// knows it has one.
func (c *Conn) KeepWriteDeadline(now time.Time, d time.Duration) {
	if d <= 0 {
		return
	}
	var last time.Time
	if at := c.wdl.Load(); at != 0 {
		last = time.Unix(0, at)
	}
	if DeadlineDue(last, now, d) {
		_ = c.SetWriteDeadline(now.Add(d))
	}
}

// DeadlineDue reports whether a deadline kept about d ahead of now, last
// set to last (zero: none), is due for renewal: once it has drifted by more
// than a slack of min(1s, d/10). Such a deadline fires between d minus the
// slack and d after the last renewal that was due, and costs a runtime
// timer operation about once a second on a busy connection instead of
// once per request or chunk. The one rule for every lazily kept deadline
// (KeepWriteDeadline, the proxy's lazyDeadline).
func DeadlineDue(last, now time.Time, d time.Duration) bool {
	return last.Before(now.Add(d - min(time.Second, d/10)))
}

// noDeadline stands for "none" in readDeadline, so that every deadline
// compares as a point in time.
const noDeadline = math.MaxInt64

// readDeadline is a raw connection's read deadline, kept lazily
// (Conn.SetReadDeadline). want is the deadline the caller set; set is the
// one armed in the poller. Both are unix nanoseconds, noDeadline for none.
type readDeadline struct {
	want atomic.Int64
	set  atomic.Int64
	// reading is true while a read or AwaitEdge runs: a deadline
	// earlier than the armed one must then be armed at once, since the
	// read may be parked on the armed one.
	reading atomic.Bool
	mu      sync.Mutex // serialises arming: set follows the latest want
}

// store records t as wanted, and arms it when a read runs and it is
// earlier than the armed one. The order — want stored, then reading
// loaded; reading stored, then want loaded in settle — makes sure that a
// read parked or about to park sees an earlier deadline one way or the
// other.
func (d *readDeadline) store(tc *net.TCPConn, t time.Time) error {
	w := int64(noDeadline)
	if !t.IsZero() {
		w = t.UnixNano()
	}
	d.want.Store(w)
	if d.reading.Load() && w < d.set.Load() {
		return d.arm(tc)
	}
	return nil
}

// arm gives the poller the wanted deadline.
func (d *readDeadline) arm(tc *net.TCPConn) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.want.Load()
	if w == d.set.Load() {
		return nil
	}
	t := time.Time{}
	if w != noDeadline {
		t = time.Unix(0, w)
	}
	if err := tc.SetReadDeadline(t); err != nil {
		return err
	}
	d.set.Store(w)
	return nil
}

// due reports, when a read is about to park, whether the wanted deadline
// must be armed first: an earlier one than the armed one always, a later
// one only once it drifted by more than a slack of min(1s, a tenth of the
// time left) — parked on the earlier one, the read is woken early and
// wait parks it again on the right one.
func (d *readDeadline) due() bool {
	w, s := d.want.Load(), d.set.Load()
	switch {
	case w == s:
		return false
	case w < s, s == noDeadline || w == noDeadline:
		return true
	}
	return w-s > min(int64(time.Second), (w-time.Now().UnixNano())/10)
}

// errTimeout is what a read whose deadline passed returns, as net.Conn's.
var errTimeout error = os.ErrDeadlineExceeded

// wait runs fn as a RawConn read callback under the wanted deadline.
//
// Relays park here for hours, thousands at once, and the collector shrinks
// a parked goroutine's stack only while it uses under a quarter of it: the
// deepest the stack ever went decides whether an idle stream's goroutine
// keeps 2 KiB or 4 (BenchmarkIdleSSEStreamMemory). So the rare cases are
// in waitSlow, and a deadline is armed here, not in the callback, where
// the runtime's timer code would run under RawConn.Read's frames.
func (x *rawConn) wait(fn func(fd uintptr) bool) error {
	d := &x.rd
	d.reading.Store(true)
	var err error
	x.edged = false // each wait of AwaitEdge looks first
	if d.want.Load() < d.set.Load() {
		err = x.waitSlow(fn, nil)
	} else if err = x.rc.Read(fn); err != nil || x.rearm {
		err = x.waitSlow(fn, err)
	}
	d.reading.Store(false)
	return err
}

// waitSlow is wait when the wanted deadline is earlier than the armed one
// (first nil), when a callback asked for the deadline to be armed
// (rearm), or once a read under the armed one ended with first.
//
//go:noinline
func (x *rawConn) waitSlow(fn func(fd uintptr) bool, first error) error {
	d := &x.rd
	err := first
	for {
		if x.rearm {
			x.rearm = false
			if err := d.arm(x.tc); err != nil {
				return err
			}
			err = nil
		} else if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
			// Woken by an armed deadline earlier than the wanted one:
			// wait on, under the wanted one, unless it passed as well.
			w := d.want.Load()
			if w <= d.set.Load() || w <= time.Now().UnixNano() {
				return err
			}
			if err := d.arm(x.tc); err != nil {
				return err
			}
			err = nil
		}
		// A deadline earlier than the armed one that already passed
		// fails the read before it starts, as the poller would.
		if w := d.want.Load(); w < d.set.Load() && w <= time.Now().UnixNano() {
			return errTimeout
		}
		x.edged = false
		if err = x.rc.Read(fn); err == nil && !x.rearm {
			return nil
		}
	}
}
