package proxy

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP_RPL4 checks PINBOARD_TRUSTED_PROXIES parsing and the client-IP
// walk over X-Forwarded-For (R-PL-4). A refused list gives a one-line
// error naming the entry; every entry of an accepted list is trusted. The
// client IP is the peer when the peer is not trusted, else the peer or an
// address written in X-Forwarded-For; it is never IPv4-mapped, and it is
// a trusted proxy only when every hop walked was one.
func FuzzClientIP_RPL4(f *testing.F) {
	f.Add("10.0.0.0/8, 127.0.0.1 ::1", "127.0.0.1", []byte("9.9.9.9, 1.2.3.4, 10.1.1.1"))
	f.Add("10.0.0.0/8, 127.0.0.1 ::1", "203.0.113.9", []byte("1.2.3.4"))
	f.Add("10.0.0.0/8, 127.0.0.1 ::1", "127.0.0.1", []byte("garbage, 10.1.1.1"))
	f.Add("10.0.0.0/8, 127.0.0.1 ::1", "::1", []byte("[2001:db8::1]:443"))
	f.Add("10.0.0.0/8, 127.0.0.1 ::1", "::ffff:127.0.0.1", []byte("5.6.7.8:1234"))
	f.Add("127.0.0.1", "127.0.0.1", []byte("1.1.1.1, 6.6.6.6"))
	f.Add("::ffff:10.0.0.0/104", "10.1.2.3", []byte("::ffff:1.2.3.4, 10.0.0.1"))
	f.Add("10.0.0.0/33", "127.0.0.1", []byte(""))
	f.Add("localhost", "127.0.0.1", []byte(""))
	f.Add("fe80::1%eth0, 0.0.0.0/0", "fe80::1%eth0", []byte("[fe80::2%eth0]:80,1.2.3.4"))
	f.Fuzz(func(t *testing.T, trusted, peerStr string, xff []byte) {
		tp, err := ParseTrustedProxies(trusted)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "cannot parse trusted proxy ") || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("unexpected error for %q; got %q; want one line naming the entry", trusted, msg)
			}
			return
		}
		for _, e := range strings.FieldsFunc(trusted, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			var a netip.Addr
			if p, err := netip.ParsePrefix(e); err == nil {
				a = p.Addr()
			} else {
				a = netip.MustParseAddr(e)
			}
			// A prefix holds no zone: "fe80::1%eth0" trusts fe80::1, as
			// peers come without one (addrOf).
			if !tp.Trusted(a.WithZone("")) {
				t.Fatalf("unexpected untrusted entry %q of %q", e, trusted)
			}
		}
		peer, err := netip.ParseAddr(peerStr)
		if err != nil {
			return
		}
		got := tp.ClientIP(peer, xff)
		if got.Is4In6() {
			t.Fatalf("unexpected IPv4-mapped client IP %v for peer %v xff %q", got, peer, xff)
		}
		if !tp.Trusted(peer) {
			if got != peer.Unmap() {
				t.Fatalf("unexpected client IP %v for untrusted peer %v; want the peer", got, peer)
			}
			return
		}
		if got == peer.Unmap() {
			return
		}
		if !strings.Contains(strings.ToLower(string(xff)), strings.ToLower(got.Unmap().String())) &&
			!strings.Contains(strings.ToLower(string(xff)), strings.ToLower(got.WithZone("").String())) {
			// The entry may spell the address another way ("::ffff:…",
			// leading zeros): it must at least parse to it.
			found := false
			for _, e := range strings.Split(string(xff), ",") {
				if a, ok := parseAddrBytes([]byte(strings.TrimSpace(e))); ok && a == got {
					found = true
				}
			}
			if !found {
				t.Fatalf("unexpected client IP %v for peer %v xff %q: not an entry", got, peer, xff)
			}
		}
	})
}
