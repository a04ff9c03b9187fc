package directory_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
	"github.com/pinboard-go/pinboard/tools/redistest"
)

// slowEntry is one SLOWLOG entry: Redis's own record of a command.
type slowEntry struct {
	id     int64
	argc   int // the command's arguments, its name included
	args   []string
	client string        // the connection's name
	took   time.Duration // how long Redis ran it
}

// slowlog reads the SLOWLOG, oldest first. Redis keeps the first 31
// arguments of a command and then "... (N more arguments)", which argc
// accounts for.
func slowlog(t testing.TB, c rueidis.Client) []slowEntry {
	t.Helper()
	entries, err := c.Do(context.Background(), c.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		t.Fatalf("cannot read the SLOWLOG: %v", err)
	}
	out := make([]slowEntry, len(entries))
	for i, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 6 {
			t.Fatalf("unexpected SLOWLOG entry: %v", err)
		}
		se := slowEntry{}
		se.id, _ = f[0].AsInt64()
		us, _ := f[2].AsInt64()
		se.took = time.Duration(us) * time.Microsecond
		se.args, _ = f[3].AsStrSlice()
		se.client, _ = f[5].ToString()
		se.argc = len(se.args)
		if last := se.args[len(se.args)-1]; strings.HasPrefix(last, "... (") {
			more, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(last, "... ("), " more arguments)"))
			se.argc = len(se.args) - 1 + more
		}
		out[len(out)-1-i] = se
	}
	return out
}

func isScript(e slowEntry) bool {
	return strings.EqualFold(e.args[0], "evalsha") || strings.EqualFold(e.args[0], "eval")
}

// TestRedisRegisterHoldsOneBatch_RREG1: a re-registration listing many
// instances never holds Redis for more than one batch. Redis's SLOWLOG,
// set to log every command, shows each of its script calls carrying at
// most RegisterBatch rows, and other clients' commands — a PING, and a
// new placement claimed through another node — executed between them.
// One script for the whole list, as before, fails both.
func TestRedisRegisterHoldsOneBatch_RREG1(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openNode(t, srv.URL()+"?client_name=registering", "holds", time.Hour)
	other := openNode(t, srv.URL()+"?client_name=other", "holds", time.Hour)
	c := rawClient(t, srv.Addr)
	const n = 8 * directory.RegisterBatch
	reg, now := ownInstances(t, s, n)
	between := 0
	directory.SetAfterRegisterBatch(s, func() {
		between++
		if between%3 != 1 {
			return
		}
		mark := "between-" + strconv.Itoa(between)
		if err := c.Do(context.Background(), c.B().Ping().Message(mark).Build()).Error(); err != nil {
			t.Errorf("cannot PING between batches: %v", err)
		}
		if _, err := other.Place(context.Background(), &directory.PlaceRequest{NS: "/c", ID: mark, Now: now}); err != nil {
			t.Errorf("cannot place through another node between batches: %v", err)
		}
	})
	slowlogAll(t, c)
	res, err := s.Register(context.Background(), reg, now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot re-register; got %+v, %v", res, err)
	}

	var first, last int64 = -1, -1
	calls := 0
	for _, e := range slowlog(t, c) {
		if e.client != "registering" || !isScript(e) {
			continue
		}
		calls++
		if first < 0 {
			first = e.id
		}
		last = e.id
		// EVALSHA sha 1 key, then at most 18 arguments besides the rows.
		if limit := 4 + 18 + directory.RegisterBatch; e.argc > limit {
			t.Fatalf("unexpected script call with %d arguments; want at most %d (one batch of rows)", e.argc, limit)
		}
	}
	if want := n / directory.RegisterBatch; calls < want {
		t.Fatalf("unexpected script calls of the registration; got %d; want at least %d", calls, want)
	}
	pings, claims := 0, 0
	for _, e := range slowlog(t, c) {
		if e.id <= first || e.id >= last {
			continue
		}
		switch {
		case strings.EqualFold(e.args[0], "ping") && len(e.args) == 2 && strings.HasPrefix(e.args[1], "between-"):
			pings++
		case e.client == "other" && isScript(e):
			claims++
		}
	}
	if pings != 3 || claims < 3 {
		t.Fatalf("unexpected commands of other clients between the registration's script calls; got %d PINGs, %d claims; want 3 and at least 3", pings, claims)
	}
}

// TestRedisRegisterFailsBetweenBatches_RREG1: a round trip failing
// between two batches (here the caller's context ends) fails the
// registration with ErrUnavailable, and what it reclaimed stays
// consistent: those rows point at the session it opened, a live session
// the worker never learnt. The worker's next registration takes that
// session over, every id its own; without one, the sweep frees its rows
// and records one lease after its lease, leaving no key behind.
func TestRedisRegisterFailsBetweenBatches_RREG1(t *testing.T) {
	srv := redistest.StartServer(t)
	c := rawClient(t, srv.Addr)
	const n = 3 * directory.RegisterBatch
	ttl := directorytest.TTL
	for _, tc := range []string{"retry", "sweep"} {
		t.Run(tc, func(t *testing.T) {
			prefix := "fails-" + tc
			s := openNode(t, srv.URL(), prefix, ttl)
			now := warmRedis(t, s, time.Now())
			list := make([]string, n)
			for i := range list {
				list[i] = "i" + strconv.Itoa(i)
			}
			reg := &directory.Registration{ClientID: "a", Sub: "sub", Secret: "k", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:9/a", Headroom: 10, Instances: map[string][]string{"/c": list}}
			first, err := s.Register(context.Background(), reg, now)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			directory.SetAfterRegisterBatch(s, cancel)
			reg.PrevSessionID = first.SessionID
			if _, err := s.Register(ctx, reg, now); !errors.Is(err, directory.ErrUnavailable) || !errors.Is(err, context.Canceled) {
				t.Fatalf("unexpected result of a registration whose context ended; got %v; want ErrUnavailable", err)
			}
			held := placementsOf(t, s, "a", now)
			if len(held) != 2 || held[first.SessionID] != n-directory.RegisterBatch {
				t.Fatalf("unexpected sessions of a after the failure; got %v; want the first with %d rows and the opened one with %d",
					held, n-directory.RegisterBatch, directory.RegisterBatch)
			}

			if tc == "retry" {
				res, err := s.Register(context.Background(), reg, now)
				if err != nil || len(res.Duplicates) != 0 {
					t.Fatalf("unexpected retry; got %+v, %v; want every id its own", res, err)
				}
				if held := placementsOf(t, s, "a", now); len(held) != 1 || held[res.SessionID] != n {
					t.Fatalf("unexpected sessions of a after the retry; got %v; want only %s with %d rows", held, res.SessionID, n)
				}
				return
			}
			if rows := sessionKeys(t, c, prefix); len(rows) < n {
				t.Fatalf("unexpected keys before the sweep; got %d; want the %d rows and their sessions", len(rows), n)
			}
			now = now.Add(2*ttl + time.Millisecond)
			if err := s.Sweep(context.Background(), now); err != nil {
				t.Fatal(err)
			}
			if left := sessionKeys(t, c, prefix); len(left) != 0 {
				t.Fatalf("unexpected keys left after the sweep; got %q", left[:min(len(left), 4)])
			}
		})
	}
}

// sessionKeys returns the directory's rows, session records and indexes:
// every key but the epoch counter, the cold-start stamp and the era.
func sessionKeys(t *testing.T, c rueidis.Client, prefix string) []string {
	t.Helper()
	keys, err := c.Do(context.Background(), c.B().Keys().Pattern("{"+prefix+"}:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("cannot list keys: %v", err)
	}
	var out []string
	for _, k := range keys {
		switch strings.TrimPrefix(k, "{"+prefix+"}:") {
		case "epoch", "stamp", "era":
		default:
			out = append(out, k)
		}
	}
	return out
}

// placementsOf returns the live sessions of a client with their row counts.
func placementsOf(t *testing.T, s directory.Store, client string, now time.Time) map[string]int {
	t.Helper()
	ws, err := s.Workers(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int)
	for _, w := range ws {
		if w.ClientID == client {
			out[w.SessionID] = w.Placements
		}
	}
	return out
}

// TestRedisRegisterScriptCacheLost_RREG1: Redis lost its script cache
// (SCRIPT FLUSH, as after a failover) before a re-registration and
// between its batches: every script of it — the opening call, each batch,
// the hand-over — answers NOSCRIPT once and runs with EVAL, and the
// registration completes with every id its own.
func TestRedisRegisterScriptCacheLost_RREG1(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openNode(t, srv.URL(), "noscript", time.Hour)
	reg, now := ownInstances(t, s, 3*directory.RegisterBatch)
	flush := func() {
		if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
			t.Error(err)
		}
	}
	directory.SetAfterRegisterBatch(s, flush)
	flush()
	res, err := s.Register(context.Background(), reg, now)
	if err != nil || len(res.Duplicates) != 0 {
		t.Fatalf("cannot re-register after SCRIPT FLUSH; got %+v, %v", res, err)
	}
	if held := placementsOf(t, s, "w", now); len(held) != 1 || held[res.SessionID] != 3*directory.RegisterBatch {
		t.Fatalf("unexpected sessions of w; got %v; want only %s with every id", held, res.SessionID)
	}
}
