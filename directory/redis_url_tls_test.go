package directory_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// tlsNode listens on 127.0.0.1 with a certificate for name only (a DNS
// name or an IP address), signed by a CA added to pool, and completes a
// TLS handshake with every connection.
func tlsNode(t *testing.T, name string, pool *x509.CertPool) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool.AddCert(cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// loopbackOnly is a net.Dialer's Control refusing every address outside
// 127.0.0.0/8: "localhost" may resolve to ::1 as well, and the dialer
// then goes on to the next address (tests touch 127.0.0.0/8 only).
func loopbackOnly(network, address string, _ syscall.RawConn) error {
	if ap, err := netip.ParseAddrPort(address); err != nil || !ap.Addr().Is4() || !ap.Addr().IsLoopback() {
		return fmt.Errorf("test dials 127.0.0.0/8 only, not %s", address)
	}
	return nil
}

// A rediss cluster or sentinel URL names several hosts, and the client
// dials others still (the nodes a cluster announces, the master sentinels
// name): each connection verifies the certificate of the host it dials.
// The TLS options named the first host of the URL for every connection,
// and every node with a certificate of its own failed its handshake — an
// outage at start-up (R-SRV-3).
func TestRedissVerifiesEachNodeByItsOwnName_RSRV3(t *testing.T) {
	pool := x509.NewCertPool()
	a := tlsNode(t, "127.0.0.1", pool)
	b := tlsNode(t, "localhost", pool)
	_, portB, _ := net.SplitHostPort(b)
	b = net.JoinHostPort("localhost", portB)
	for _, raw := range []string{
		"rediss+cluster://" + a + "," + b,
		"rediss+sentinel://" + a + "," + b + "/mymaster",
		"rediss://" + b,
	} {
		o, err := directory.ParseRedisURL(raw)
		if err != nil {
			t.Fatalf("cannot parse %q: %v", raw, err)
		}
		cfg := o.TLSConfig.Clone()
		cfg.RootCAs = pool
		for _, addr := range []string{a, b} {
			d := tls.Dialer{NetDialer: &net.Dialer{Control: loopbackOnly}, Config: cfg}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, err := d.DialContext(ctx, "tcp", addr)
			cancel()
			if err != nil {
				t.Errorf("unexpected handshake failure with %s for %q; got %v", addr, raw, err)
				continue
			}
			c.Close()
		}
	}
}
