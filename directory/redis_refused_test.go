package directory_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// A Redis that answers the connection's set-up with an error no retry
// mends — a wrong password, none given where one is required, a user whose
// ACL denies a command the directory needs, a database index out of range
// — is ErrRefused, not ErrUnavailable: the binary waited 10 s for it as
// for a Redis that is down, logged "cannot reach the directory" for a
// Redis that answered, and exited 1, restarted for ever where a
// configuration error exits 2 (R-SRV-3). A Redis that is down stays
// ErrUnavailable.
func TestOpenRedisRefused_RSRV3(t *testing.T) {
	srv := redistest.StartServer(t)
	host := strings.TrimPrefix(srv.URL(), "redis://")
	opts := directory.RedisOptions{LeaseTTL: time.Second}
	if _, err := srv.Do("ACL", "SETUSER", "narrow", "on", ">narrow-pass", "~*", "+ping"); err != nil {
		t.Fatal(err)
	}
	// reader may read but never write (used once the era exists, below).
	if _, err := srv.Do("ACL", "SETUSER", "reader", "on", ">reader-pass", "~*", "+@all", "-@write"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("CONFIG", "SET", "requirepass", "right-pass"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, url, want string }{
		{"wrong password", "redis://:wrong-pass@" + host, "WRONGPASS"},
		{"no password", "redis://" + host, "NOAUTH"},
		{"ACL without the directory's commands", "redis://narrow:narrow-pass@" + host, "NOPERM"},
		{"database out of range", "redis://:right-pass@" + host + "/99", "DB index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			s, err := directory.OpenRedis(t.Context(), tc.url, opts)
			if err == nil {
				s.Close()
				t.Fatalf("unexpected open of %s; want ErrRefused", tc.url)
			}
			if !errors.Is(err, directory.ErrRefused) || errors.Is(err, directory.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("unexpected error; got %v; want ErrRefused (not ErrUnavailable) naming %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "pass@") {
				t.Fatalf("unexpected password in the error; got %v; want the URL redacted", err)
			}
			t.Logf("refused after %v: %v", time.Since(began).Round(time.Millisecond), err)
		})
	}
	s, err := directory.OpenRedis(t.Context(), "redis://:right-pass@"+host, opts)
	if err != nil {
		t.Fatalf("cannot open with the right password: %v", err)
	}
	s.Close()
	// With the era in place, a user that may read but never write: the
	// era's SET NX is refused (NOPERM) while its GET answers. Only a
	// refusal that passes (OOM) lets the era check go on; this one is a
	// configuration error, as when no era exists.
	if s, err := directory.OpenRedis(t.Context(), "redis://reader:reader-pass@"+host, opts); !errors.Is(err, directory.ErrRefused) || !strings.Contains(err.Error(), "NOPERM") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("unexpected open by a user without writes; got %v; want ErrRefused naming NOPERM", err)
	}
	srv.Stop()
	if _, err := directory.OpenRedis(t.Context(), "redis://:right-pass@"+host, opts); !errors.Is(err, directory.ErrUnavailable) || errors.Is(err, directory.ErrRefused) {
		t.Fatalf("unexpected error for a Redis that is down; got %v; want ErrUnavailable", err)
	}
}

// Every heartbeat of a session the node does not know yet, the workers
// listing and the placement lookup run a read-only script (EVALSHA_RO,
// EVAL_RO: Redis 7.0). A server without them (Redis 6.2, a compatible
// server that lacks them, an ACL denying them) opened fine and then failed
// each of those with 503: every worker's first heartbeat through each node,
// so the whole fleet's leases lapsed while health said ready. The open
// now runs one and refuses such a server as a configuration error (exit
// 2), saying what the directory needs (R-SRV-3, R-REG-2).
func TestOpenRedisRefusesServerWithoutReadOnlyScripts_RSRV3(t *testing.T) {
	old := redistest.StartServerArgs(t, "--rename-command", "EVALSHA_RO", "", "--rename-command", "EVAL_RO", "")
	srv := redistest.StartServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "nosro", "on", ">p", "~*", "&*", "+@all", "-evalsha_ro", "-eval_ro"); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(srv.URL(), "redis://")
	opts := directory.RedisOptions{LeaseTTL: time.Second}
	for _, tc := range []struct{ name, url, want string }{
		{"server without EVALSHA_RO", old.URL(), "Redis 7.0"},
		{"ACL denying EVALSHA_RO", "redis://nosro:p@" + host, "NOPERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := directory.OpenRedis(t.Context(), tc.url, opts)
			if err == nil {
				s.Close()
				t.Fatalf("unexpected open of %s; want ErrRefused (its read-only scripts fail)", tc.url)
			}
			if !errors.Is(err, directory.ErrRefused) || errors.Is(err, directory.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("unexpected error; got %v; want ErrRefused (not ErrUnavailable) naming %s", err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}
