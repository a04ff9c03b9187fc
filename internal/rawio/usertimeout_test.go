package rawio

import (
	"crypto/tls"
	"net"
	"syscall"
	"testing"
	"time"
)

// userTimeout reads TCP_USER_TIMEOUT (ms) off c's socket.
func userTimeout(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := TCP(c).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpUserTimeout) }); err != nil || gerr != nil {
		t.Fatalf("cannot read TCP_USER_TIMEOUT: %v, %v", err, gerr)
	}
	return v
}

// The listener's connections, raw or behind TLS, carry the user timeout
// (R-DP-2, R-DP-3); d <= 0 leaves the kernel's default (0).
func TestUserTimeout_RDP2(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := UserTimeoutListener(ln, 0); got != ln {
		t.Fatalf("unexpected listener for d=0; got %T; want the listener as it was", got)
	}
	uln := UserTimeoutListener(Listener(ln), 1500*time.Millisecond)
	for _, tc := range []struct {
		name string
		d    time.Duration
		tls  bool
		want int
	}{{"listener", 0, false, 1500}, {"raw", 700 * time.Millisecond, false, 700}, {"tls", 900 * time.Millisecond, true, 900}, {"off", -1, false, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			a, err := uln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if tc.name == "listener" {
				if got := userTimeout(t, a); got != tc.want {
					t.Fatalf("unexpected TCP_USER_TIMEOUT; got %d; want %d", got, tc.want)
				}
				return
			}
			var c net.Conn = Wrap(d)
			if tc.tls {
				c = tls.Client(c, &tls.Config{InsecureSkipVerify: true})
			}
			SetUserTimeout(c, tc.d)
			if got := userTimeout(t, Wrap(d)); got != tc.want {
				t.Fatalf("unexpected TCP_USER_TIMEOUT; got %d; want %d", got, tc.want)
			}
		})
	}
}
