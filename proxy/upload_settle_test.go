package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// These tests take the window between the upload's last read of the
// client's body and the end of its last write to the worker: uvicorn
// answers as soon as it has the body, so the handler often reads the
// answer inside it. Under make test that window once closed a client's
// keep-alive connection unanswered (stop had interrupted a read that was
// no longer waited for). synctest holds each goroutine where the test
// needs it, so the window is hit every run, not by luck.

// clientConn stands in for the client's connection: it records the read
// deadlines stop and renew set on it.
type clientConn struct {
	net.Conn
	mu    sync.Mutex
	reads []time.Time
}

func (c *clientConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.reads = append(c.reads, t)
	c.mu.Unlock()
	return nil
}

// deadlines returns the read deadlines set so far.
func (c *clientConn) deadlines() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.reads...)
}

// gateWriter is the worker's side of the upload: each write blocks until
// the test opens the gate.
type gateWriter struct{ gate chan struct{} }

func (w gateWriter) Write(p []byte) (int, error) {
	<-w.gate
	return len(p), nil
}

// gateReader is the client's body: its one read blocks until the test
// opens the gate, then brings the whole body.
type gateReader struct {
	gate chan struct{}
	body string
	done bool
}

func (r *gateReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	<-r.gate
	r.done = true
	return copy(p, r.body), io.EOF
}

// newGatedUpload starts an upload of body (sized) to w, the client being
// client; the worker connection only takes deadlines.
func newGatedUpload(body io.Reader, cl int, w io.Writer, client net.Conn) *upload {
	worker := &pconn{c: &deadlineConn{}}
	return startUpload(body, bufio.NewWriterSize(w, 64), cl, func(*bufio.Writer) {},
		client, worker, time.Second, 0, time.Second)
}

// A stop that comes while the upload's last write to the worker is under
// way leaves the client's connection alone: the body was read whole, so
// no read waits to be interrupted, and a deadline set in the past stays
// on a keep-alive connection the client will send its next request on
// (R-DP-1, R-DP-2).
func TestStopAfterTheWholeBodyLeavesTheClientAlone_RDP1_RDP2(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const body = "hello"
		client := &clientConn{}
		gate := make(chan struct{})
		// The body fits bw's buffer: the only write is the last flush.
		u := newGatedUpload(&gateReader{gate: closedChan(), body: body}, len(body), gateWriter{gate}, client)
		synctest.Wait() // the upload waits in its last write
		stopped := make(chan struct{})
		go func() { u.stop(); close(stopped) }()
		synctest.Wait() // stop waits for the upload
		// Errors, not fatals, until the gate opens: the bubble's
		// goroutines must end for the test to.
		for _, d := range client.deadlines() {
			if !d.IsZero() {
				t.Errorf("unexpected read deadline set on the client's connection; got %v; want none (its body was read whole)", d)
			}
		}
		close(gate)
		<-stopped
		if !u.wait() {
			t.Fatalf("unexpected upload failure; got %v; want the body sent", u.err)
		}
	})
}

// A stop that interrupts the client's read just as that read brings the
// body's last bytes takes the interruption back once the upload ends: the
// client's connection is left with no deadline, ready for its next
// request (R-DP-1, R-DP-2).
func TestStopMeetingTheLastReadIsUndone_RDP1_RDP2(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const body = "hello"
		client := &clientConn{}
		read := make(chan struct{})
		u := newGatedUpload(&gateReader{gate: read, body: body}, len(body), io.Discard, client)
		synctest.Wait() // the upload waits in its read of the body
		stopped := make(chan struct{})
		go func() { u.stop(); close(stopped) }()
		synctest.Wait() // stop interrupted the read and waits for the upload
		if ds := client.deadlines(); len(ds) == 0 || ds[len(ds)-1].IsZero() {
			t.Errorf("unexpected read deadlines before the read ended; got %v; want the read interrupted", ds)
		}
		close(read) // the read had the bytes before the interruption
		<-stopped
		if !u.wait() {
			t.Fatalf("unexpected upload failure; got %v; want the body sent", u.err)
		}
		if ds := client.deadlines(); !ds[len(ds)-1].IsZero() {
			t.Fatalf("unexpected read deadline left on the client's connection; got %v; want none", ds[len(ds)-1])
		}
	})
}

// An answer read while the upload's last write is under way waits for
// that write, for at most settleWait: the worker connection goes back to
// the pool and an event stream is relayed as for any finished upload
// (R-DP-1, R-DP-2). An upload still reading the client's body is not
// waited for.
func TestSettledWaitsForTheLastWriteOnly_RDP1_RDP2(t *testing.T) {
	const body = "hello"
	t.Run("last write ends", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			gate := make(chan struct{})
			u := newGatedUpload(&gateReader{gate: closedChan(), body: body}, len(body), gateWriter{gate}, &clientConn{})
			synctest.Wait()
			got := make(chan bool)
			go func() { got <- u.settled() }()
			synctest.Wait()
			close(gate)
			if !<-got {
				t.Fatal("unexpected settled; got false; want true once the last write ended")
			}
		})
	})
	t.Run("last write blocked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			gate := make(chan struct{})
			u := newGatedUpload(&gateReader{gate: closedChan(), body: body}, len(body), gateWriter{gate}, &clientConn{})
			synctest.Wait()
			start := time.Now()
			if u.settled() {
				t.Error("unexpected settled; got true; want false while the write is blocked")
			}
			if waited := time.Since(start); waited != settleWait {
				t.Errorf("unexpected wait; got %v; want settleWait (%v)", waited, settleWait)
			}
			// An event stream asks twice (relayable, then its body's
			// close): a wait that ran out is not made again.
			start = time.Now()
			if u.settled() {
				t.Error("unexpected settled the second time; got true; want false while the write is blocked")
			}
			if waited := time.Since(start); waited != 0 {
				t.Errorf("unexpected second wait; got %v; want none", waited)
			}
			close(gate)
			u.wait()
		})
	})
	t.Run("body still coming", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			read := make(chan struct{})
			u := newGatedUpload(&gateReader{gate: read, body: body}, len(body), io.Discard, &clientConn{})
			synctest.Wait()
			start := time.Now()
			if u.settled() {
				t.Error("unexpected settled; got true; want false while the body is read")
			}
			if waited := time.Since(start); waited != 0 {
				t.Errorf("unexpected wait; got %v; want none", waited)
			}
			close(read)
			u.wait()
		})
	})
}

// A last read larger than bw's free space is written to the worker
// directly, inside the copy loop: the worker may have the whole body, and
// answer, before that write returns. The body counts as in from its read
// (R-DP-1, R-DP-2).
func TestLastBytesWrittenPastTheBufferCountAsIn_RDP1_RDP2(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		body := strings.Repeat("b", 100) // bw holds 64 (newGatedUpload)
		client := &clientConn{}
		gate := make(chan struct{})
		u := newGatedUpload(&gateReader{gate: closedChan(), body: body}, len(body), gateWriter{gate}, client)
		synctest.Wait() // the upload waits in its write of the last bytes
		stopped := make(chan struct{})
		go func() { u.stop(); close(stopped) }()
		settled := make(chan bool, 1)
		go func() { settled <- u.settled() }()
		synctest.Wait()
		for _, d := range client.deadlines() {
			if !d.IsZero() {
				t.Errorf("unexpected read deadline set on the client's connection; got %v; want none (its body was read whole)", d)
			}
		}
		close(gate)
		<-stopped
		if !<-settled {
			t.Error("unexpected settled; got false; want true once the write ended")
		}
		if !u.wait() {
			t.Errorf("unexpected upload failure; got %v; want the body sent", u.err)
		}
	})
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
