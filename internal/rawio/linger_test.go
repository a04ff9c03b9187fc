package rawio

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// lingerPair is a client connection and the server side of it accepted
// through ListenerLinger with l.
func lingerPair(t *testing.T, l *Linger) (client net.Conn, server *Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lln := ListenerLinger(ln, l)
	defer lln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := lln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	t.Cleanup(func() { client.Close(); c.Close() })
	rc, ok := c.(*Conn)
	if !ok {
		t.Fatalf("unexpected accepted connection %T; want *Conn", c)
	}
	return client, rc
}

// unreadInput leaves n bytes from client unread at server.
func unreadInput(t *testing.T, client net.Conn, server *Conn, n int) {
	t.Helper()
	if _, err := client.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return peekTCP(server.TCPConn) == peekData })
}

// closeEnd is how the client's read ends after the server's close: nil
// for a clean end (FIN), the error otherwise (a reset).
func closeEnd(t *testing.T, client net.Conn) error {
	t.Helper()
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.ReadAll(client)
	return err
}

// A connection closed with the client's bytes unread lingers: the client
// reads a clean end, may go on sending (its bytes are dropped), and the
// connection closes once the client does; with nothing unread, or past
// Stop, a close is immediate as net.Conn's (R-DP-2).
func TestLingerClose_RDP2(t *testing.T) {
	t.Run("unread input lingers", func(t *testing.T) {
		l := NewLinger(4, 2*time.Second, 10*time.Second)
		client, server := lingerPair(t, l)
		_, _ = server.Write([]byte("answer"))
		unreadInput(t, client, server, 1000)
		if err := server.Close(); err != nil {
			t.Fatalf("unexpected close error; got %v", err)
		}
		buf := make([]byte, 6)
		if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "answer" {
			t.Fatalf("unexpected answer; got %q, %v", buf, err)
		}
		if err := closeEnd(t, client); err != nil {
			t.Fatalf("unexpected end after a lingering close; got %v; want a clean end", err)
		}
		for range 64 { // 4 MiB more: taken and dropped, not reset
			if _, err := client.Write(make([]byte, 64<<10)); err != nil {
				t.Fatalf("unexpected write error while the server lingers; got %v", err)
			}
		}
		if l.Lingering() != 1 {
			t.Fatalf("unexpected lingering count; got %d; want 1", l.Lingering())
		}
		client.Close()
		waitFor(t, func() bool { return l.Lingering() == 0 })
	})

	t.Run("a silent client is let go after Wait", func(t *testing.T) {
		// Total far past waitFor's 10 s: only Wait can end this linger.
		l := NewLinger(4, 50*time.Millisecond, time.Hour)
		client, server := lingerPair(t, l)
		unreadInput(t, client, server, 10)
		_ = server.Close()
		if l.Lingering() != 1 {
			t.Fatalf("unexpected lingering count; got %d; want 1", l.Lingering())
		}
		waitFor(t, func() bool { return l.Lingering() == 0 })
		if err := closeEnd(t, client); err != nil {
			t.Fatalf("unexpected end after a lingering close; got %v; want a clean end", err)
		}
	})

	t.Run("MoreInput lingers with nothing unread yet", func(t *testing.T) {
		l := NewLinger(4, 2*time.Second, 10*time.Second)
		client, server := lingerPair(t, l)
		MoreInput(server)
		_ = server.Close()
		if l.Lingering() != 1 {
			t.Fatalf("unexpected lingering count; got %d; want 1", l.Lingering())
		}
		for range 64 { // the body the client was still sending
			if _, err := client.Write(make([]byte, 64<<10)); err != nil {
				t.Fatalf("unexpected write error while the server lingers; got %v", err)
			}
		}
		if err := closeEnd(t, client); err != nil {
			t.Fatalf("unexpected end after a lingering close; got %v; want a clean end", err)
		}
		client.Close()
		waitFor(t, func() bool { return l.Lingering() == 0 })
	})

	t.Run("InputDone takes MoreInput back", func(t *testing.T) {
		l := NewLinger(4, 2*time.Second, 10*time.Second)
		_, server := lingerPair(t, l)
		MoreInput(server)
		InputDone(server)
		_ = server.Close()
		if l.Lingering() != 0 {
			t.Fatalf("unexpected lingering count; got %d; want 0", l.Lingering())
		}
	})

	t.Run("nothing unread closes at once", func(t *testing.T) {
		l := NewLinger(4, 2*time.Second, 10*time.Second)
		client, server := lingerPair(t, l)
		_ = server.Close()
		if l.Lingering() != 0 {
			t.Fatalf("unexpected lingering count; got %d; want 0", l.Lingering())
		}
		if err := closeEnd(t, client); err != nil {
			t.Fatalf("unexpected end; got %v; want a clean end", err)
		}
	})

	for _, tc := range []struct {
		name  string
		setup func(l *Linger, server *Conn)
	}{
		{"after Stop", func(l *Linger, _ *Conn) { l.Stop() }},
		{"past max", func(l *Linger, _ *Conn) { l.slots <- struct{}{} }},
		{"NoLinger", func(_ *Linger, server *Conn) { NoLinger(server) }},
	} {
		t.Run(tc.name+" closes at once", func(t *testing.T) {
			l := NewLinger(1, 2*time.Second, 10*time.Second)
			client, server := lingerPair(t, l)
			tc.setup(l, server)
			unreadInput(t, client, server, 1000)
			_ = server.Close()
			// Closed with unread input: the kernel resets the connection.
			if err := closeEnd(t, client); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("unexpected end; got %v; want a reset (closed at once)", err)
			}
		})
	}
}
