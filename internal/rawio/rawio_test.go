package rawio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func rawTCPPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestRawWriterFullBuffer: a write larger than the socket buffers waits
// for the reader (EAGAIN → poller) and delivers every byte in order.
func TestRawWriterFullBuffer(t *testing.T) {
	client, server := rawTCPPair(t)
	w := Wrap(client)
	if _, ok := w.(*Conn); !ok {
		t.Fatalf("unexpected conn for a TCP connection; got %T", w)
	}
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 31)
	}
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		time.Sleep(50 * time.Millisecond) // let the send buffer fill
		_, _ = io.CopyN(&buf, server, int64(len(data)))
		got <- buf.Bytes()
	}()
	n, err := w.Write(data)
	if err != nil || n != len(data) {
		t.Fatalf("unexpected write; got %d, %v", n, err)
	}
	if !bytes.Equal(<-got, data) {
		t.Fatal("unexpected bytes on the other side")
	}
}

func TestRawWriterClosedPeer(t *testing.T) {
	client, server := rawTCPPair(t)
	server.Close()
	w := Wrap(client)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = w.Write(make([]byte, 64<<10))
		time.Sleep(time.Millisecond)
	}
	if err == nil {
		t.Fatal("unexpected success writing to a closed peer")
	}
	if _, ok := err.(*net.OpError); !ok {
		t.Fatalf("unexpected error type; got %T (%v)", err, err)
	}
}

// TestRawReader: reads wait for data, return what arrived, report EOF at
// the peer's close and a timeout at the read deadline.
func TestRawReader(t *testing.T) {
	client, server := rawTCPPair(t)
	r := Wrap(client)
	go func() {
		time.Sleep(20 * time.Millisecond) // most often, the read waits first
		server.Write([]byte("hello"))
	}()
	buf := make([]byte, 64)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("unexpected read; got %q, %v", buf[:n], err)
	}
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("unexpected empty read; got %d, %v", n, err)
	}
	client.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := r.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected error at the deadline; got %v", err)
	}
	client.SetReadDeadline(time.Time{})
	server.Close()
	if _, err := r.Read(buf); err != io.EOF {
		t.Fatalf("unexpected error after the peer closed; got %v; want EOF", err)
	}
}

// TestRawListener: accepted connections echo through raw Read and Write
// and keep *net.TCPConn's other methods (CloseWrite: a half-close reaches
// the peer as EOF).
func TestRawListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(inner)
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if _, ok := c.(*Conn); !ok || TCP(c) == nil {
			done <- fmt.Errorf("unexpected accepted conn %T", c)
			return
		}
		_, err = io.Copy(c, c) // echo until the client half-closes
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
		}
		done <- err
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte("pinboard "), 100_000)
	go func() {
		c.Write(msg)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("unexpected echo; got %d bytes, %v; want %d", len(got), err, len(msg))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestReadable: a live idle connection is not readable, also with its
// read deadline in the past; one with data waiting is, and the data is
// not consumed; one whose peer closed or reset it is. PeerClosed says
// only the last two, also for a connection without Wrap.
func TestReadable_RDP1(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (net.Conn, net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		return Wrap(c), s
	}
	c, s := pair()
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if Readable(c) {
		t.Fatal("unexpected readable live idle connection")
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return Readable(c) })
	if !Readable(c) || PeerClosed(c) {
		t.Fatalf("unexpected peek with data waiting; got readable %v, closed %v; want true, false", Readable(c), PeerClosed(c))
	}
	_ = c.SetReadDeadline(time.Time{})
	b := make([]byte, 1)
	if n, err := c.Read(b); n != 1 || b[0] != 'x' || err != nil {
		t.Fatalf("unexpected read after the peek; got %d %q %v", n, b, err)
	}
	s.Close()
	waitFor(t, func() bool { return PeerClosed(c) })
	if !Readable(c) || !PeerClosed(c) {
		t.Fatalf("unexpected peek after the peer closed; got readable %v, closed %v; want true, true", Readable(c), PeerClosed(c))
	}
	c2, s2 := pair()
	_ = s2.(*net.TCPConn).SetLinger(0) // close sends RST
	s2.Close()
	waitFor(t, func() bool { return PeerClosed(c2) })
	if !Readable(c2) || !PeerClosed(c2) {
		t.Fatalf("unexpected peek after the peer reset; got readable %v, closed %v; want true, true", Readable(c2), PeerClosed(c2))
	}
	c3, s3 := pair()
	plain := TCP(c3)
	if PeerClosed(plain) || Readable(plain) {
		t.Fatal("unexpected readable live idle connection without Wrap")
	}
	s3.Close()
	waitFor(t, func() bool { return PeerClosed(plain) })
	if !PeerClosed(plain) {
		t.Fatal("unexpected not closed after the peer closed, without Wrap")
	}
}

// returnsOnceDataArrives checks that wait blocks while the connection is
// idle and returns nil once the peer writes "event".
func returnsOnceDataArrives(t *testing.T, peer io.Writer, wait func() error) {
	t.Helper()
	returnsOnce(t, "data arrived", func() error {
		_, err := peer.Write([]byte("event"))
		return err
	}, wait)
}

// returnsOnce checks that wait blocks while the connection is idle (for
// 50ms: a wait that does not block returns well within it) and returns
// nil once act ran.
func returnsOnce(t *testing.T, what string, act func() error, wait func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		t.Fatalf("unexpected return before %s; got %v", what, err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := act(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("unexpected error once %s; got %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("unexpected wait past the moment %s", what)
	}
}

// TestAwaitEdgeReadable_RDP2: AwaitEdge returns only once data is there
// and takes none of it (a Read gets it all), honours the read deadline,
// and returns for a peer's close, whether it came while the wait was
// parked or before it began (the read that follows reports EOF). A
// connection without raw access returns at once.
func TestAwaitEdgeReadable_RDP2(t *testing.T) {
	client, server := rawTCPPair(t)
	r := Wrap(client)
	returnsOnceDataArrives(t, server, func() error { return AwaitEdge(r) })
	buf := make([]byte, 64)
	if n, err := r.Read(buf); err != nil || string(buf[:n]) != "event" {
		t.Fatalf("unexpected read after the wait; got %q, %v; want all of the data", buf[:n], err)
	}
	r.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if err := AwaitEdge(r); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected error at the deadline; got %v", err)
	}
	r.SetReadDeadline(time.Time{})
	returnsOnce(t, "the peer closed", server.Close, func() error { return AwaitEdge(r) })
	// The close is there before this wait begins: its first look finds it
	// (the deadline bounds a wait that would park instead).
	r.SetReadDeadline(time.Now().Add(2 * time.Second))
	if err := AwaitEdge(r); err != nil {
		t.Fatalf("unexpected error after the peer closed; got %v; want nil", err)
	}
	r.SetReadDeadline(time.Time{})
	if _, err := TryRead(r, buf); err != io.EOF {
		t.Fatalf("unexpected read after the peer closed; got %v; want EOF", err)
	}
	if err := AwaitEdge(client); err != nil {
		t.Fatalf("unexpected error for a connection without raw access; got %v", err)
	}
}

// TestKeepWriteDeadline: the deadline is set when none is, renewed only
// once it drifted past the slack, renewed after one set directly has
// passed, and it bounds a write to a peer that does not read.
func TestKeepWriteDeadline_RDP2(t *testing.T) {
	client, _ := rawTCPPair(t)
	c := Wrap(client).(*Conn)
	now := time.Now()
	KeepWriteDeadline(c, now, 10*time.Second)
	first := c.wdl.Load()
	if first != now.Add(10*time.Second).UnixNano() {
		t.Fatalf("unexpected deadline; got %v; want now+10s", time.Unix(0, first))
	}
	KeepWriteDeadline(c, now.Add(500*time.Millisecond), 10*time.Second)
	if c.wdl.Load() != first {
		t.Fatal("unexpected renewal within the slack")
	}
	KeepWriteDeadline(c, now.Add(2*time.Second), 10*time.Second)
	if c.wdl.Load() != now.Add(12*time.Second).UnixNano() {
		t.Fatal("unexpected deadline not renewed past the slack")
	}
	_ = c.SetWriteDeadline(now.Add(-time.Second))
	KeepWriteDeadline(c, now, 10*time.Second)
	if c.wdl.Load() != now.Add(10*time.Second).UnixNano() {
		t.Fatal("unexpected passed deadline not renewed")
	}
	KeepWriteDeadline(c, time.Now(), 100*time.Millisecond)
	_ = c.SetWriteDeadline(time.Time{})
	KeepWriteDeadline(c, time.Now(), 100*time.Millisecond)
	buf := make([]byte, 1<<20)
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		_, err = c.Write(buf) // the peer never reads
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected write error to a peer that does not read; got %v; want the deadline", err)
	}
}

// TestLazyReadDeadline_RDP2: read deadlines keep net.Conn's meaning —
// a passed one fails the next read even with data waiting, an earlier
// one set while a read is parked wakes it, a later one set while it is
// parked on an earlier one keeps it waiting — while a deadline reaches
// the poller only when a read is about to wait: a keep-alive
// connection whose requests arrive whole pays no timer operation for
// the header and body deadlines fasthttp sets per request.
func TestLazyReadDeadline_RDP2(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client).(*Conn)
	buf := make([]byte, 64)

	// Deadlines set while data is waiting are never armed.
	if _, err := server.Write([]byte("req")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return Readable(c) })
	for _, d := range []time.Duration{75 * time.Second, 30 * time.Second, 60 * time.Second} {
		_ = c.SetReadDeadline(time.Now().Add(d))
	}
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "req" {
		t.Fatalf("unexpected read of waiting data; got %q, %v", buf[:n], err)
	}
	if got := c.x.rd.set.Load(); got != noDeadline {
		t.Fatalf("unexpected deadline armed for a read that did not wait; got %v", time.Unix(0, got))
	}

	// A passed deadline fails the next read, data waiting or not.
	if _, err := server.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return Readable(c) })
	_ = c.SetReadDeadline(time.Unix(1, 0))
	if n, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected read past the deadline; got %q, %v; want the deadline", buf[:n], err)
	}
	_ = c.SetReadDeadline(time.Time{})
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "more" {
		t.Fatalf("unexpected read after the deadline was cleared; got %q, %v", buf[:n], err)
	}

	// A read about to wait arms the wanted deadline.
	at := time.Now().Add(time.Minute)
	_ = c.SetReadDeadline(at)
	parked := make(chan error, 1)
	go func() { _, err := c.Read(buf); parked <- err }()
	waitFor(t, func() bool { return c.x.rd.set.Load() == at.UnixNano() })

	// An earlier deadline set while it is parked wakes it.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	select {
	case err := <-parked:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("unexpected end of a parked read; got %v; want the deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("unexpected parked read not woken by an earlier deadline")
	}

	// A later deadline set while it is parked on an earlier one is
	// honoured: the read outlives the earlier one and gets the data.
	early := time.Now().Add(200 * time.Millisecond)
	_ = c.SetReadDeadline(early)
	got := make(chan string, 1)
	go func() {
		n, err := c.Read(buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	waitFor(t, func() bool { return c.x.rd.reading.Load() && c.x.rd.set.Load() == early.UnixNano() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(time.Until(early) + 50*time.Millisecond) // past the earlier deadline
	if _, err := server.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "late" {
		t.Fatalf("unexpected read parked on an earlier deadline; got %q; want the data sent after it", s)
	}

	// AwaitEdge keeps the same deadlines.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if err := AwaitEdge(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected wait past the deadline; got %v", err)
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("unexpected condition not reached in 10 s")
		}
	}
}

// TestTryReadAwaitEdge_RDP2: TryRead never waits (ErrWouldBlock when
// drained), AwaitEdge parks until bytes arrive, honours the read deadline
// (also one armed earlier than wanted), and returns at the peer's close;
// together they relay every byte in order, bytes that arrive between a
// read and the next wait included.
func TestTryReadAwaitEdge_RDP2(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	buf := make([]byte, 64)
	if _, err := TryRead(c, buf); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("unexpected read of a drained connection; got %v; want ErrWouldBlock", err)
	}
	returnsOnceDataArrives(t, server, func() error { return AwaitEdge(c) })
	if n, err := TryRead(c, buf); err != nil || string(buf[:n]) != "event" {
		t.Fatalf("unexpected read after the edge; got %q, %v", buf[:n], err)
	}

	// The deadline bounds the wait, and one armed earlier than wanted
	// does not cut it short.
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if err := AwaitEdge(c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected end of a wait past the deadline; got %v", err)
	}
	early := time.Now().Add(200 * time.Millisecond)
	_ = c.SetReadDeadline(early)
	done := make(chan error, 1)
	go func() { done <- AwaitEdge(c) }()
	rc := c.(*Conn)
	waitFor(t, func() bool { return rc.x.rd.reading.Load() && rc.x.rd.set.Load() == early.UnixNano() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	time.Sleep(time.Until(early) + 50*time.Millisecond)
	if _, err := server.Write([]byte("late")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("unexpected end of a wait whose deadline was moved later; got %v", err)
	}
	// A stale wake is possible: read until the bytes are there.
	got := ""
	for got != "late" {
		n, err := TryRead(c, buf)
		switch {
		case errors.Is(err, ErrWouldBlock):
			if err := AwaitEdge(c); err != nil {
				t.Fatal(err)
			}
		case err != nil:
			t.Fatal(err)
		}
		got += string(buf[:n])
	}
	_ = c.SetReadDeadline(time.Time{})

	// Many small writes: every byte arrives, in order.
	var want, seen bytes.Buffer
	for i := range 200 {
		fmt.Fprintf(&want, "m%d;", i)
	}
	go func() {
		for i := range 200 {
			_, _ = fmt.Fprintf(server, "m%d;", i)
			if i%10 == 0 { // let reads drain the socket between writes
				time.Sleep(time.Millisecond)
			}
		}
		server.Close()
	}()
	for {
		n, err := TryRead(c, buf)
		seen.Write(buf[:n])
		if errors.Is(err, ErrWouldBlock) {
			if err := AwaitEdge(c); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if seen.String() != want.String() {
		t.Fatalf("unexpected bytes relayed; got %d bytes; want %d in order", seen.Len(), want.Len())
	}
	if _, err := TryRead(client, buf); err != io.EOF {
		t.Fatalf("unexpected TryRead of a connection without raw access; got %v; want it read as usual", err)
	}
}

// TestCopyFromConnKeepsDeadlines_RDP2: io.Copy from a *Conn reads
// through its Read, so a read deadline kept lazily applies: the embedded
// TCPConn's WriteTo would read the socket past it.
func TestCopyFromConnKeepsDeadlines_RDP2(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	if _, err := server.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return Readable(c) })
	_ = c.SetReadDeadline(time.Unix(1, 0))
	// Bounded: a copy that reads past the deadline ends when the peer
	// closes, with the bytes it should not have read.
	stop := time.AfterFunc(2*time.Second, func() { server.Close() })
	defer stop.Stop()
	var got bytes.Buffer
	n, err := io.Copy(&got, c)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 0 {
		t.Fatalf("unexpected copy past a passed deadline; got %d bytes (%q), %v; want none and the deadline", n, got.String(), err)
	}
}
