package directory

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

// RedisOptions.TLSConfig replaces the TLS settings a rediss URL implies —
// for a rediss+sentinel:// URL, those of the sentinel connections too. Only
// the masters' were replaced: with a private CA in TLSConfig, the sentinels
// were still verified against the system roots, and the open failed with an
// unknown-authority error while the same CA worked for rediss:// (R-SRV-3,
// R-SRV-4: the library API).
func TestOpenRedisTLSConfigReachesSentinels_RSRV3(t *testing.T) {
	custom := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: x509.NewCertPool(), ServerName: "redis.internal"}
	o, err := redisClientOptions("rediss+sentinel://s1:26379,s2:26379/m", RedisOptions{TLSConfig: custom})
	if err != nil {
		t.Fatal(err)
	}
	if o.TLSConfig != custom {
		t.Fatalf("unexpected TLS settings of the masters; got %+v; want RedisOptions.TLSConfig", o.TLSConfig)
	}
	if s := o.Sentinel.TLSConfig; s == nil || s.RootCAs != custom.RootCAs || s.ServerName != custom.ServerName || s.MinVersion != custom.MinVersion {
		t.Fatalf("unexpected TLS settings of the sentinels; got %+v; want those of RedisOptions.TLSConfig", s)
	}
	// A plain sentinel URL keeps plain sentinels: TLSConfig reaches the
	// masters only, as before.
	o, err = redisClientOptions("redis+sentinel://s1/m", RedisOptions{TLSConfig: custom})
	if err != nil || o.TLSConfig != custom || o.Sentinel.TLSConfig != nil {
		t.Fatalf("unexpected TLS settings for a plain sentinel URL; got masters %+v, sentinels %+v, %v", o.TLSConfig, o.Sentinel.TLSConfig, err)
	}
}

// A Prefix with a brace would break the keys' one hash tag ("}x" makes
// "{}x}:…", which Redis Cluster hashes whole): refused before connecting.
func TestOpenRedisRefusesBraceInPrefix_RSRV3(t *testing.T) {
	for _, prefix := range []string{"}x", "a{b", "a}b"} {
		_, err := OpenRedis(t.Context(), "redis://127.0.0.1:1", RedisOptions{LeaseTTL: time.Second, Prefix: prefix})
		if err == nil || !strings.Contains(err.Error(), "brace") {
			t.Errorf("unexpected result for Prefix %q; got %v; want the refusal of a brace", prefix, err)
		}
	}
}
