package rawio

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

// TestSendReadRoundTrips_RDP1: the send goes out whole and the answer
// comes back, over many round trips whose answers race the wait (the
// peer answers at once): an edge the wait skipped its look for would hang
// a round trip until the deadline.
func TestSendReadRoundTrips_RDP1(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	go echoUpper(server, 0)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 64)
	for i := range 5000 {
		n, sent, err := SendRead(c, []byte("ping"), buf, i%2 == 0)
		if err != nil || !sent || string(buf[:n]) != "PING" {
			t.Fatalf("round trip %d: got %q, sent %v, %v; want PING, true, nil", i, buf[:n], sent, err)
		}
	}
}

// TestSendReadNotQuiet_RDP1: with quiet asked, a connection the peer sent
// unasked bytes on, or closed, carries nothing and says ErrNotQuiet;
// without it, the send goes and the bytes there are read as the answer.
func TestSendReadNotQuiet_RDP1(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	if _, err := server.Write([]byte("stray")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return Readable(c) })
	buf := make([]byte, 64)
	if n, sent, err := SendRead(c, []byte("req"), buf, true); n != 0 || sent || !errors.Is(err, ErrNotQuiet) {
		t.Fatalf("unexpected send on a connection with bytes waiting; got %d, sent %v, %v; want 0, false, ErrNotQuiet", n, sent, err)
	}
	_ = server.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := server.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected bytes at the peer after a refused send; got %q, %v", buf[:n], err)
	}
	n, sent, err := SendRead(c, []byte("req"), buf, false)
	if err != nil || !sent || string(buf[:n]) != "stray" {
		t.Fatalf("unexpected send without the quiet check; got %q, sent %v, %v; want stray, true, nil", buf[:n], sent, err)
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.ReadFull(server, buf[:3]); err != nil || string(buf[:n]) != "req" {
		t.Fatalf("unexpected bytes at the peer; got %q, %v; want req", buf[:n], err)
	}

	client2, server2 := rawTCPPair(t)
	c2 := Wrap(client2)
	server2.Close()
	waitFor(t, func() bool { return PeerClosed(c2) })
	if _, sent, err := SendRead(c2, []byte("req"), buf, true); sent || !errors.Is(err, ErrNotQuiet) {
		t.Fatalf("unexpected send on a connection the peer closed; got sent %v, %v; want false, ErrNotQuiet", sent, err)
	}
}

// TestSendReadLargeSend_RDP1: a send larger than the socket buffers goes
// on as a Write once the buffer is full, every byte in order, and the
// answer is read after it.
func TestSendReadLargeSend_RDP1(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // let the send buffer fill
		b := make([]byte, len(data))
		_, err := io.ReadFull(server, b)
		if err == nil {
			_, err = server.Write([]byte("done"))
		}
		if err != nil {
			b = nil
		}
		got <- b
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 64)
	n, sent, err := SendRead(c, data, buf, true)
	if err != nil || !sent || string(buf[:n]) != "done" {
		t.Fatalf("unexpected large send; got %q, sent %v, %v; want done, true, nil", buf[:n], sent, err)
	}
	if !bytes.Equal(<-got, data) {
		t.Fatal("unexpected bytes at the peer")
	}
}

// TestSendReadDeadlines_RDP2: a read deadline already passed fails the
// call before anything is sent; one that passes while the answer is
// awaited fails the read after the send.
func TestSendReadDeadlines_RDP2(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, sent, err := SendRead(c, []byte("early"), buf, false); sent || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("unexpected send past the deadline; got sent %v, %v; want false, deadline exceeded", sent, err)
	}
	var ne *net.OpError
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, sent, err := SendRead(c, []byte("late"), buf, false)
	if !sent || !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || ne.Op != "read" {
		t.Fatalf("unexpected end of a wait for an answer past the deadline; got sent %v, %v; want true, a read's deadline error", sent, err)
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.ReadFull(server, buf[:4]); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("unexpected bytes at the peer; got %q, %v; want only the send made before its deadline", buf[:n], err)
	}
}

// TestSendReadWithoutRawAccess_RDP1: a connection without a socket
// writes and then reads.
func TestSendReadWithoutRawAccess_RDP1(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		buf := make([]byte, 8)
		n, _ := b.Read(buf)
		_, _ = b.Write(bytes.ToUpper(buf[:n]))
	}()
	buf := make([]byte, 8)
	n, sent, err := SendRead(a, []byte("pipe"), buf, true)
	if err != nil || !sent || string(buf[:n]) != "PIPE" {
		t.Fatalf("unexpected round trip over a pipe; got %q, sent %v, %v", buf[:n], sent, err)
	}
}

// TestSendReadDeadlineChurn_RDP1: the read deadline moves before every
// round trip (earlier, later, none), so SendRead goes through the rearm
// and waitSlow paths with the answer racing the wait; a lost edge would
// end a round trip at its deadline, or hang one without, which a
// watchdog ends by closing the connection.
func TestSendReadDeadlineChurn_RDP1(t *testing.T) {
	client, server := rawTCPPair(t)
	c := Wrap(client)
	watchdog := time.AfterFunc(2*time.Minute, func() { c.Close() })
	defer watchdog.Stop()
	go echoUpper(server, 5)
	buf := make([]byte, 64)
	ds := []time.Duration{10 * time.Second, 3 * time.Second, 0, 8 * time.Second, 2 * time.Second, 30 * time.Second}
	for i := range 6000 {
		d := ds[i%len(ds)]
		if d == 0 {
			_ = c.SetReadDeadline(time.Time{})
		} else {
			_ = c.SetReadDeadline(time.Now().Add(d))
		}
		n, sent, err := SendRead(c, []byte("ping"), buf, i%3 != 0)
		if err != nil || !sent || string(buf[:n]) != "PING" {
			t.Fatalf("round trip %d (deadline %v): got %q, sent %v, %v; want PING, true, nil", i, d, buf[:n], sent, err)
		}
	}
}

// TestSendReadPeerClosesAfterSend_RDP1: a peer that reads the send and
// closes (or resets) at once: the parked wait wakes on the FIN's edge
// (or the reset's) and reports the end, not the deadline.
func TestSendReadPeerClosesAfterSend_RDP1(t *testing.T) {
	for i := range 100 {
		client, server := rawTCPPair(t)
		c := Wrap(client)
		go func() {
			buf := make([]byte, 16)
			_, _ = server.Read(buf)
			if i%2 == 1 {
				_ = server.(interface{ SetLinger(int) error }).SetLinger(0)
			}
			server.Close()
		}()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 16)
		_, sent, err := SendRead(c, []byte("req"), buf, true)
		if !sent || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%d: unexpected end of a send the peer closed after; got sent %v, %v; want true and the close", i, sent, err)
		}
		client.Close()
	}
}

// echoUpper answers every read on server with its bytes in upper case
// until server fails; with slowEvery > 0, every slowEvery-th answer
// waits 50 µs first, so that some answers race the wait and others come
// after it parked.
func echoUpper(server net.Conn, slowEvery int) {
	buf := make([]byte, 64)
	for i := 0; ; i++ {
		n, err := server.Read(buf)
		if err != nil {
			return
		}
		if slowEvery > 0 && i%slowEvery == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		if _, err := server.Write(bytes.ToUpper(buf[:n])); err != nil {
			return
		}
	}
}

// TestNotQuietTLS_RDP1: a TLS connection has no socket to peek at, and a
// peek under it would see the peer's close_notify as data; NotQuiet reads
// its socket's TCP state instead: quiet while established and idle, not
// once the peer closed. A plain connection is not quiet as Readable says.
func TestNotQuietTLS_RDP1(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One exchange, so that whatever the server sends after its handshake
	// (session tickets) has been read.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	if NotQuiet(c) {
		t.Fatal("unexpected not-quiet idle TLS connection")
	}
	srv.CloseClientConnections()
	waitFor(t, func() bool { return NotQuiet(c) })

	client, server := rawTCPPair(t)
	p := Wrap(client)
	if NotQuiet(p) {
		t.Fatal("unexpected not-quiet idle connection")
	}
	_, _ = server.Write([]byte("x"))
	waitFor(t, func() bool { return NotQuiet(p) })
}
