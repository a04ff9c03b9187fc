package main

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzLoadConfig_RSRV2_RSRV3 checks the environment parsing (R-SRV-2, R-SRV-3). The
// input is lines "NAME=value" set over a working environment ("NAME" alone
// unsets it). A refusal is a configError naming a variable, one line, that
// never repeats a token; an accepted configuration keeps every documented
// bound, and loading it again gives the same configuration.
func FuzzLoadConfig_RSRV2_RSRV3(f *testing.F) {
	for _, s := range []string{
		"",
		"PORT=9000\nHOST=127.0.0.1\nPINBOARD_LEASE_TTL_MS=3000\nPINBOARD_TRUSTED_PROXIES=10.0.0.0/8, 127.0.0.1\nPINBOARD_AFFINITY_BALANCE_FACTOR=1.5",
		"PINBOARD_PASSPORT",
		"PINBOARD_PASSPORT=  ",
		"PINBOARD_PASSPORT={nope",
		"PINBOARD_TOKEN",
		"REDIS_URL=postgres://db",
		"REDIS_URL=localhost:6379",
		"REDIS_URL=redis+sentinel://u:pw@s1,s2:5000/mymaster?db=1",
		"PINBOARD_LEASE_TTL_MS=15s",
		"PINBOARD_LEASE_TTL_MS=2592000001",
		"PINBOARD_AFFINITY_BALANCE_FACTOR=0.5",
		"PINBOARD_AFFINITY_BALANCE_FACTOR=NaN",
		"PINBOARD_TRUSTED_PROXIES=10.0.0.0/33",
		"PORT=http",
		"PINBOARD_BASE_PATH=pb",
		"PINBOARD_BASE_PATH=/pinboard",
		"PINBOARD_LOG_LEVEL=loud",
		"PINBOARD_LOG_FORMAT=JSON",
		"PINBOARD_METRICS_ADDR=9090",
		"PINBOARD_METRICS_ADDR=127.0.0.1:metrics",
		"PINBOARD_METRICS_ADDR=:99999",
		"PINBOARD_METRICS_ADDR=127.0.0.1:9090\nPINBOARD_PPROF=1",
		"PINBOARD_PPROF=1",
		"PINBOARD_SHUTDOWN_GRACE_MS=-1",
		"PINBOARD_SHUTDOWN_DELAY_MS=5000",
		"PINBOARD_ACCESS_LOG_SAMPLE=1.5",
		"PINBOARD_ACCESS_LOG_SAMPLE=0.25",
		"PINBOARD_REGISTRY_WORKERS=8\nPINBOARD_REGISTRY_MIN_WORKERS=9",
		"PINBOARD_STALL_TIMEOUT_MS=0",
		"HOST=[::1]",
		"HOST=local host",
		"HOST=::1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lines string) {
		kv := base()
		for _, line := range strings.Split(lines, "\n") {
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				delete(kv, k)
				continue
			}
			kv[k] = v
		}
		c, err := loadConfig(env(kv))
		if err != nil {
			var ce *configError
			msg := err.Error()
			if !errors.As(err, &ce) || ce.Var == "" || !strings.HasPrefix(msg, ce.Var+": ") || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("unexpected error for %q; got %q; want one line naming the variable", lines, msg)
			}
			if tok := kv["PINBOARD_TOKEN"]; len(tok) >= 4 && strings.Contains(msg, tok) && !strings.Contains(lines, tok) {
				t.Fatalf("unexpected token in the error for %q: %q", lines, msg)
			}
			return
		}
		host, port, err := net.SplitHostPort(c.Addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 0 || n > 65535 || checkListenHost(host) != nil {
			t.Fatalf("unexpected address %q from %q", c.Addr, lines)
		}
		if c.LeaseTTL < 100*time.Millisecond || (c.BalanceFactor != 0 && !(c.BalanceFactor >= 1)) ||
			c.RegWorkers < 1 || c.RegMinWorkers < 0 || c.RegMinWorkers > c.RegWorkers || c.RegQueue < 1 ||
			!(c.AccessSample >= 0 && c.AccessSample <= 1) || c.Grace < 0 || c.Delay < 0 || c.ProbeTimeout < 10*time.Millisecond {
			t.Fatalf("unexpected configuration from %q: %+v", lines, c)
		}
		if c.BasePath != "" && (c.BasePath[0] != '/' || strings.ContainsAny(c.BasePath, "?# ")) {
			t.Fatalf("unexpected base path %q from %q", c.BasePath, lines)
		}
		switch c.LogLevel {
		case "debug", "info", "warn", "error":
		default:
			t.Fatalf("unexpected log level %q from %q", c.LogLevel, lines)
		}
		if c.LogFormat != "text" && c.LogFormat != "json" {
			t.Fatalf("unexpected log format %q from %q", c.LogFormat, lines)
		}
		if c.Pprof && c.MetricsAddr == "" {
			t.Fatalf("unexpected pprof without an admin listener from %q", lines)
		}
		if err := checkStoreURL(c.RedisURL); err != nil || c.Passport == nil {
			t.Fatalf("unexpected store URL %q or passport from %q", c.RedisURL, lines)
		}
		c2, err := loadConfig(env(kv))
		if err != nil || c2.Addr != c.Addr || c2.LeaseTTL != c.LeaseTTL || c2.Upstream != c.Upstream {
			t.Fatalf("unexpected second load of %q: %v", lines, err)
		}
	})
}
