package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// frame builds one WebSocket frame; masked frames use a fixed key.
func frame(op byte, payload []byte, masked bool) []byte {
	b := []byte{0x80 | op}
	var m byte
	if masked {
		m = 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, m|byte(n))
	case n <= 0xffff:
		b = append(b, m|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, m|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if !masked {
		return append(b, payload...)
	}
	key := [4]byte{1, 2, 3, 4}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i%4])
	}
	return b
}

func TestFrameTrackerBoundaries(t *testing.T) {
	var stream []byte
	var ends []int // offsets where a frame ends
	for _, f := range [][]byte{
		frame(0x1, []byte("hi"), false),
		frame(0x9, nil, true),
		frame(0x2, bytes.Repeat([]byte{7}, 125), true),
		frame(0x2, bytes.Repeat([]byte{7}, 126), false),
		frame(0x2, bytes.Repeat([]byte{7}, 70000), true),
		frame(0x8, goingAway, false),
	} {
		stream = append(stream, f...)
		ends = append(ends, len(stream))
	}
	for _, chunk := range []int{1, 3, 7, 1000, len(stream)} {
		var f frameTracker
		var got []int
		off := 0
		for off < len(stream) {
			end := min(off+chunk, len(stream))
			p := stream[off:end]
			for len(p) > 0 {
				n := f.span(p)
				off += n
				p = p[n:]
				if f.boundary() {
					got = append(got, off)
				}
			}
		}
		if len(got) != len(ends) {
			t.Fatalf("chunk %d: unexpected boundaries; got %v; want %v", chunk, got, ends)
		}
		for i := range got {
			if got[i] != ends[i] {
				t.Fatalf("chunk %d: unexpected boundaries; got %v; want %v", chunk, got, ends)
			}
		}
	}
}

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot listen: %v", err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("cannot dial: %v", err)
	}
	b := <-accepted
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// readFrame reads one frame and returns its opcode and unmasked payload.
func readFrame(t *testing.T, br *bufio.Reader) (byte, []byte) {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatalf("cannot read frame header: %v", err)
	}
	n := int(h[1] & 0x7f)
	switch n {
	case 126:
		var e [2]byte
		io.ReadFull(br, e[:])
		n = int(binary.BigEndian.Uint16(e[:]))
	case 127:
		var e [8]byte
		io.ReadFull(br, e[:])
		n = int(binary.BigEndian.Uint64(e[:]))
	}
	var key []byte
	if h[1]&0x80 != 0 {
		key = make([]byte, 4)
		io.ReadFull(br, key)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatalf("cannot read frame payload: %v", err)
	}
	for i := range p {
		if key != nil {
			p[i] ^= key[i%4]
		}
	}
	return h[0] & 0x0f, p
}

// TestRelayShutdownSendsGoingAway: at shutdown both sides get Close 1001
// "going away"; a direction inside a frame gets it right after the frame,
// never inside it.
func TestRelayShutdownSendsGoingAway(t *testing.T) {
	hj := newHijacks()
	client, worker, cbr, wbr := relayed(t, hj, frame(0x1, []byte("early"), false))
	if op, p := readFrame(t, cbr); op != 0x1 || string(p) != "early" {
		t.Fatalf("unexpected first frame; got %x %q; want text early", op, p)
	}
	client.Write(frame(0x1, []byte("hi"), true))
	if op, p := readFrame(t, wbr); op != 0x1 || string(p) != "hi" {
		t.Fatalf("unexpected frame at the worker; got %x %q", op, p)
	}
	// The worker is inside a 10-byte frame when shutdown comes.
	long := frame(0x2, []byte("0123456789"), false)
	worker.Write(long[:6])
	waitOpen(t, hj, 1)
	// The relay is inside the frame once the client has its first bytes
	// (a fixed sleep was not always enough on a loaded machine: the
	// relay, still between frames, sent Close first).
	if _, err := cbr.Peek(6); err != nil {
		t.Fatalf("the relay did not forward the partial frame: %v", err)
	}
	hj.shutdown(time.Now().Add(5 * time.Second))

	// The worker side is between frames: Close comes at once, masked.
	if op, p := readFrame(t, wbr); op != 0x8 || !bytes.Equal(p, goingAway) {
		t.Fatalf("unexpected frame at the worker; got %x %q; want close 1001", op, p)
	}
	// The client side gets the rest of the frame, then Close.
	worker.Write(long[6:])
	if op, p := readFrame(t, cbr); op != 0x2 || string(p) != "0123456789" {
		t.Fatalf("unexpected frame at the client; got %x %q; want the whole binary frame", op, p)
	}
	op, p := readFrame(t, cbr)
	if op != 0x8 || binary.BigEndian.Uint16(p) != 1001 || string(p[2:]) != "going away" {
		t.Fatalf("unexpected frame at the client; got %x %q; want close 1001", op, p)
	}
	// Closing handshake: both answer Close; the worker closes TCP, which
	// ends the relay.
	client.Write(frame(0x8, goingAway[:2], true))
	worker.Write(frame(0x8, goingAway[:2], false))
	worker.Close()
	// The relay may end on the worker's close before it has read the
	// client's Close reply, and a socket closed with input unread sends a
	// reset, not a FIN (in pinboard the listener's lingering close turns
	// it into a FIN): either way the client's connection is closed.
	if _, err := cbr.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("unexpected client read after the close handshake; got %v; want EOF or a reset", err)
	}
	waitRelays(t, hj, "after the closing handshake")
}

// relayed starts a relay on hj between a fresh client and worker, the
// worker's 101 followed by pending, and returns the test's ends of both
// with readers, the 101 already read off the client's (the first thing
// the client must get).
func relayed(t *testing.T, hj *hijacks, pending []byte) (client, worker net.Conn, cbr, wbr *bufio.Reader) {
	t.Helper()
	relayClient, client := tcpPair(t)
	relayUp, worker := tcpPair(t)
	handshake := []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n")
	go hj.relay(relayClient, relayUp, handshake, pending, nil)
	cbr, wbr = bufio.NewReader(client), bufio.NewReader(worker)
	client.SetDeadline(time.Now().Add(10 * time.Second))
	worker.SetDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(handshake))
	if _, err := io.ReadFull(cbr, got); err != nil || !bytes.Equal(got, handshake) {
		t.Fatalf("unexpected handshake; got %q, %v; want the 101 first", got, err)
	}
	return client, worker, cbr, wbr
}

// waitOpen waits up to 10 s for hj to count n open relays.
func waitOpen(t *testing.T, hj *hijacks, n int64) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%d open relays", n), func() bool { return hj.Open() == n })
}

// waitRelays fails unless every relay on hj ends within 5 s.
func waitRelays(t *testing.T, hj *hijacks, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !hj.wait(ctx) {
		t.Fatalf("unexpected relay still running %s", when)
	}
}

// TestRelayShutdownDeadline: a peer that never completes its frame is cut
// at the deadline.
func TestRelayShutdownDeadline(t *testing.T) {
	relayClient, client := tcpPair(t)
	relayUp, worker := tcpPair(t)
	hj := newHijacks()
	go hj.relay(relayClient, relayUp, []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"), nil, nil)
	client.Write(frame(0x2, []byte("0123456789"), true)[:5]) // stalls inside a frame
	waitOpen(t, hj, 1)
	// The relay is inside the frame once the worker has its first bytes.
	worker.SetDeadline(time.Now().Add(10 * time.Second))
	wbr := bufio.NewReader(worker)
	if _, err := wbr.Peek(5); err != nil {
		t.Fatalf("the relay did not forward the partial frame: %v", err)
	}
	hj.shutdown(time.Now().Add(200 * time.Millisecond))
	waitRelays(t, hj, "past the deadline")
	// The worker saw the partial frame and then the connection end, no
	// Close frame inside the frame.
	worker.SetDeadline(time.Now().Add(5 * time.Second))
	rest, _ := io.ReadAll(wbr)
	if want := frame(0x2, []byte("0123456789"), true)[:5]; !bytes.Equal(rest, want) {
		t.Fatalf("unexpected bytes at the worker; got %x; want %x", rest, want)
	}
}

// A relay whose 101 comes after shutdown began — a handshake the worker
// answered late — gets its goodbye right after the 101, both ways, and is
// tracked, instead of outliving the shutdown (R-DP-2).
func TestRelayStartedAfterShutdownGoesAway_RDP2(t *testing.T) {
	hj := newHijacks()
	hj.shutdown(time.Now().Add(5 * time.Second))
	client, worker, cbr, wbr := relayed(t, hj, frame(0x1, []byte("early"), false))
	if op, p := readFrame(t, cbr); op != 0x1 || string(p) != "early" {
		t.Fatalf("unexpected first frame; got %x %q; want the worker's early text frame", op, p)
	}
	if op, p := readFrame(t, cbr); op != 0x8 || !bytes.Equal(p, goingAway) {
		t.Fatalf("unexpected frame at the client; got %x %q; want close 1001", op, p)
	}
	if op, p := readFrame(t, wbr); op != 0x8 || !bytes.Equal(p, goingAway) {
		t.Fatalf("unexpected frame at the worker; got %x %q; want close 1001", op, p)
	}
	if hj.Open() != 1 {
		t.Fatalf("unexpected open relays; got %d; want 1 (tracked)", hj.Open())
	}
	client.Write(frame(0x8, goingAway[:2], true))
	worker.Write(frame(0x8, goingAway[:2], false))
	worker.Close()
	waitRelays(t, hj, "after the closing handshake")
}

// A client that does not read (its receive window full) blocks the 101's
// write. Shutdown must still return and bound the relay by its deadline:
// it cannot wait for that write to finish (R-DP-2).
func TestRelayShutdownWithHandshakeWriteBlocked_RDP2(t *testing.T) {
	relayClient, _ := tcpPair(t)
	relayUp, _ := tcpPair(t)
	// Fill the path to the client, which never reads.
	for _, size := range []int{64 << 10, 1 << 10, 16, 1} {
		chunk := make([]byte, size)
		relayClient.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		for {
			if _, err := relayClient.Write(chunk); err != nil {
				break
			}
		}
	}
	relayClient.SetWriteDeadline(time.Time{})
	hj := newHijacks()
	go hj.relay(relayClient, relayUp, []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"), nil, nil)
	waitOpen(t, hj, 1)
	time.Sleep(100 * time.Millisecond) // the relay is inside the 101's write (not observable)
	done := make(chan struct{})
	go func() {
		hj.shutdown(time.Now().Add(200 * time.Millisecond))
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatalf("unexpected shutdown still blocked behind a 101 the client does not read")
	}
	waitRelays(t, hj, "past the shutdown deadline")
}

// wait covers relays that start while it waits (after shutdown began,
// a late 101): it returns once every relay ended, not when the ones it
// first saw did (R-DP-2).
func TestWaitCoversRelaysStartedDuringIt_RDP2(t *testing.T) {
	hj := newHijacks()
	handshake := []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n")
	start := func() (client, worker net.Conn) {
		relayClient, client := tcpPair(t)
		relayUp, worker := tcpPair(t)
		n := hj.Open()
		go hj.relay(relayClient, relayUp, handshake, nil, nil)
		waitOpen(t, hj, n+1)
		return client, worker
	}
	_, w1 := start()
	done := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- hj.wait(ctx)
	}()
	_, w2 := start()
	w1.Close()
	waitOpen(t, hj, 1)
	select {
	case <-done:
		t.Fatalf("unexpected wait return with a relay still open")
	case <-time.After(100 * time.Millisecond):
	}
	w2.Close()
	if ok := <-done; !ok {
		t.Fatalf("unexpected wait result; got false; want true once every relay ended")
	}
}

// A client that goes away ends its relay and the worker's connection even
// when the worker has nothing to send and ignores the half-close: the
// relay's goroutines and both descriptors must not wait for the worker's
// next frame, which may never come. A reset (or a dead peer found by TCP
// keep-alive) ends it at once; a FIN is passed on, and the worker, which
// should close its end then (RFC 6455 §7.1.1), gets DefaultCloseWait
// (R-DP-2).
func TestClientGoneEndsRelay_RDP2(t *testing.T) {
	for name, leave := range map[string]func(c *net.TCPConn){
		"reset":      func(c *net.TCPConn) { c.SetLinger(0); c.Close() },
		"half-close": func(c *net.TCPConn) { c.CloseWrite() },
	} {
		t.Run(name, func(t *testing.T) {
			hj := newHijacks()
			client, worker, _, wbr := relayed(t, hj, nil)
			leave(client.(*net.TCPConn)) // the worker stays silent, its end open
			ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseWait+3*time.Second)
			defer cancel()
			if !hj.wait(ctx) {
				t.Fatalf("unexpected open relays after the client left; got %d; want 0", hj.Open())
			}
			worker.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := wbr.ReadByte(); err != io.EOF {
				t.Fatalf("unexpected worker read after the client left; got %v; want %v", err, io.EOF)
			}
		})
	}
}

// A goodbye that comes between a forward's look at going and its renewal
// of the write deadline must not have its deadline pushed back by that
// renewal: toward a peer that does not read, the write would then block
// for the whole stall timeout instead of ending at the goodbye's deadline
// (R-DP-2). The hook puts the goodbye exactly there.
func TestGoodbyeDeadlineNotPushedBack_RDP2(t *testing.T) {
	relayClient, client := net.Pipe() // the client never reads
	relayUp, worker := net.Pipe()
	defer client.Close()
	defer worker.Close()
	go io.Copy(io.Discard, worker) // the worker reads: its Close frame goes through
	r := newWSRelay(relayClient, relayUp, time.Minute)
	r.started = true // the 101 is through
	var once sync.Once
	r.down.renewHook = func() {
		once.Do(func() { r.goAway(time.Now().Add(50 * time.Millisecond)) })
	}
	errc := make(chan error, 1)
	go func() { errc <- r.down.forward(frame(0x2, []byte("payload"), false)) }()
	select {
	case err := <-errc:
		if !isTimeout(err) {
			t.Fatalf("unexpected forward result; got %v; want the goodbye's deadline", err)
		}
	case <-time.After(5 * time.Second):
		relayClient.Close()
		t.Fatal("unexpected write still blocked 5s after the goodbye's deadline (50ms)")
	}
}

// A client that answers shutdown's Close and half-closes its connection
// (the closing handshake, RFC 6455 §7.1.1) gives the worker
// DefaultCloseWait to close its end — but no longer than the goodbye's
// deadline: a silent worker is cut at that deadline, not 2 s after the
// client's FIN (R-DP-2). The close wait is an hour here, so that a
// bounded wait tells the two apart on any machine.
func TestHalfCloseWaitWithinGoodbye_RDP2(t *testing.T) {
	hj := newHijacks()
	hj.closeWait = time.Hour
	client, _, cbr, _ := relayed(t, hj, nil)
	hj.shutdown(time.Now().Add(300 * time.Millisecond))
	if op, p := readFrame(t, cbr); op != 0x8 || !bytes.Equal(p, goingAway) {
		t.Fatalf("unexpected frame at the client; got %x %q; want close 1001", op, p)
	}
	client.Write(frame(0x8, goingAway[:2], true))
	client.(*net.TCPConn).CloseWrite() // the worker stays silent, its end open
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !hj.wait(ctx) {
		t.Fatal("unexpected relay still open 20s after the client's half-close; want it cut at the goodbye's deadline (300ms), not after the close wait (1h)")
	}
}

// stalledRelay starts a relay on hj whose client never reads while its
// worker streams one endless binary frame, and returns a channel closed
// once the relay's write to the client is blocked: the worker's own
// writes stall.
func stalledRelay(t *testing.T, hj *hijacks) <-chan struct{} {
	t.Helper()
	relayClient, client := tcpPair(t)
	relayUp, worker := tcpPair(t)
	client.(*net.TCPConn).SetReadBuffer(4 << 10)
	relayClient.(*net.TCPConn).SetWriteBuffer(4 << 10)
	go hj.relay(relayClient, relayUp, []byte("HTTP/1.1 101 Switching Protocols\r\n\r\n"), nil, nil)
	blocked := make(chan struct{})
	go func() {
		defer close(blocked)
		// One frame of 1 GiB: the relay is inside it from its first bytes.
		worker.Write([]byte{0x82, 127, 0, 0, 0, 0, 0x40, 0, 0, 0})
		chunk := make([]byte, 32<<10)
		for {
			worker.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := worker.Write(chunk); err != nil {
				return
			}
		}
	}()
	return blocked
}

// One client that stops reading must not hold up the other relays'
// goodbyes at shutdown: each relay's Close frame goes out at once,
// whatever the others do. Before, shutdown said goodbye to one relay
// after the other, and a relay whose write to its client was blocked (a
// slow or stalled reader) cost 0.1 s of retries each: with twenty of them
// the whole close budget (CloseWait, 2 s) went by before healthy relays
// further down the list were told, and those were cut without their
// Close 1001 (R-DP-2). Here forty stalled relays are 4 s of such retries
// against a 1 s deadline: told one after the other, a healthy relay
// behind ten of them is cut (the list's order is the map's, so with three
// healthy ones at least one is nearly always that far down). No stopwatch:
// the Close frame arriving, or the relay cut without it, says which.
func TestStalledClientsDoNotDelayOtherGoodbyes_RDP2(t *testing.T) {
	hj := newHijacks()
	const stalled, healthy = 40, 3
	var blocked []<-chan struct{}
	for range stalled {
		blocked = append(blocked, stalledRelay(t, hj))
	}
	for _, b := range blocked {
		<-b
	}
	var cbrs []*bufio.Reader
	for range healthy {
		_, _, cbr, _ := relayed(t, hj, nil)
		cbrs = append(cbrs, cbr)
	}
	waitOpen(t, hj, stalled+healthy)
	hj.shutdown(time.Now().Add(time.Second))
	for i, cbr := range cbrs {
		if op, p := readFrame(t, cbr); op != 0x8 || !bytes.Equal(p, goingAway) {
			t.Fatalf("unexpected frame at healthy client %d; got %x %q; want close 1001", i, op, p)
		}
	}
	waitRelays(t, hj, "past the shutdown deadline")
}
