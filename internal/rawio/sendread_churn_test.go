package rawio

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

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
	go func() {
		buf := make([]byte, 64)
		i := 0
		for {
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			if i%5 == 0 {
				time.Sleep(50 * time.Microsecond)
			}
			i++
			if _, err := server.Write(bytes.ToUpper(buf[:n])); err != nil {
				return
			}
		}
	}()
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
