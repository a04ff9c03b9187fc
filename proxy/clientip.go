package proxy

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// TrustedProxies is the parsed PINBOARD_TRUSTED_PROXIES: the peers whose
// X-Forwarded-For is believed (R-PL-4). The zero value trusts nobody, so a
// client cannot pick its own affinity by sending X-Forwarded-For.
type TrustedProxies struct {
	prefixes []netip.Prefix
}

// ParseTrustedProxies parses a comma- or space-separated list of IPs and
// CIDRs ("10.0.0.0/8, 127.0.0.1, ::1").
func ParseTrustedProxies(s string) (*TrustedProxies, error) {
	tp := &TrustedProxies{}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("cannot parse trusted proxy %q: %w", f, err)
			}
			// Trusted unmaps the peer, so an IPv4-mapped entry
			// ("::ffff:10.0.0.0/104") must be unmapped too or it never
			// matches.
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
			}
			tp.prefixes = append(tp.prefixes, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("cannot parse trusted proxy %q: %w", f, err)
		}
		if a.Zone() != "" {
			// A peer's zone is not compared (addrOf drops it): "fe80::1%eth0"
			// would trust fe80::1 on every interface, not the one named.
			return nil, fmt.Errorf("cannot parse trusted proxy %q: an IPv6 zone cannot be trusted (a peer's zone is not compared); give the address alone", f)
		}
		a = a.Unmap()
		tp.prefixes = append(tp.prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return tp, nil
}

// Trusted reports whether a is a trusted proxy.
func (tp *TrustedProxies) Trusted(a netip.Addr) bool {
	if tp == nil {
		return false
	}
	a = a.Unmap()
	for _, p := range tp.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Empty reports whether no proxy is trusted.
func (tp *TrustedProxies) Empty() bool { return tp == nil || len(tp.prefixes) == 0 }

// ClientIP returns the client address for affinity: the peer, or — when
// the peer is a trusted proxy — the right-most X-Forwarded-For entry that is
// not itself a trusted proxy. Malformed entries stop the walk at the last
// trusted hop, so garbage cannot be used to pick a worker.
func (tp *TrustedProxies) ClientIP(peer netip.Addr, xff []byte) netip.Addr {
	peer = peer.Unmap()
	if !tp.Trusted(peer) || len(xff) == 0 {
		return peer
	}
	client := peer
	for len(xff) > 0 {
		var entry []byte
		if i := bytes.LastIndexByte(xff, ','); i >= 0 {
			entry, xff = xff[i+1:], xff[:i]
		} else {
			entry, xff = xff, nil
		}
		a, ok := parseAddrBytes(bytes.TrimSpace(entry))
		if !ok {
			return client
		}
		client = a
		if !tp.Trusted(a) {
			return a
		}
	}
	return client
}

func parseAddrBytes(b []byte) (netip.Addr, bool) {
	// netip.ParseAddr takes a string; an on-stack copy keeps it
	// allocation-free for the lengths an address can have.
	if len(b) == 0 || len(b) > 64 {
		return netip.Addr{}, false
	}
	if b[0] == '[' { // "[::1]:port" or "[::1]"
		if i := bytes.IndexByte(b, ']'); i > 0 {
			b = b[1:i]
		}
	} else if bytes.Count(b, []byte{':'}) == 1 { // "1.2.3.4:port"
		b = b[:bytes.IndexByte(b, ':')]
	}
	var buf [64]byte
	n := copy(buf[:], b)
	a, err := netip.ParseAddr(string(buf[:n]))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// addrOf converts a net.Addr from fasthttp into a netip.Addr.
func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
