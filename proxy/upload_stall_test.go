package proxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// deadlineConn records the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	mu    sync.Mutex
	write time.Time
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.write = t
	c.mu.Unlock()
	return nil
}

func (c *deadlineConn) SetReadDeadline(time.Time) error { return nil }

// slowReader answers its one read after a pause.
type slowReader struct{ pause time.Duration }

func (r slowReader) Read(p []byte) (int, error) {
	time.Sleep(r.pause)
	return copy(p, "x"), nil
}

// Bytes a client took most of the stall timeout to send still have the
// whole timeout to reach the worker: the write deadline is renewed once
// they came, not only before the read (R-DP-2; docs/OPERATIONS.md,
// PINBOARD_STALL_TIMEOUT_MS).
func TestUploadWriteDeadlineFromTheBytesArrival_RDP2(t *testing.T) {
	const stall = time.Second
	worker := &deadlineConn{}
	client := &deadlineConn{}
	u := &upload{client: client, worker: &pconn{c: worker}, stall: stall}
	er := &errReader{r: slowReader{pause: 600 * time.Millisecond}, u: u}
	if n, err := er.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("unexpected read; got %d, %v", n, err)
	}
	arrived := time.Now()
	worker.mu.Lock()
	got := worker.write
	worker.mu.Unlock()
	// The slack of a lazily kept deadline is a tenth of it.
	if min := arrived.Add(stall - stall/10 - 50*time.Millisecond); got.Before(min) {
		t.Fatalf("unexpected write deadline %v after the bytes came; want at least %v (the stall timeout from then, less its slack)", got.Sub(arrived), min.Sub(arrived))
	}
}
