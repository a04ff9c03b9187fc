package directory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
	"github.com/pinboard-go/pinboard/directory/directorytest"
)

// A higher epoch supersedes the live holders of a hostname's binding; a
// session of that hostname whose lease had already lapsed is not one of
// them: it stays an unknown session (R-LS-2: reregister), not a
// superseded one (R-LS-4), on both stores.
func TestLapsedSessionNotSuperseded_RLS2_RLS4(t *testing.T) {
	onBothStores(t, func(t *testing.T, store directorytest.Factory) {
		const ttl = 15 * time.Second
		now := time.Unix(1_800_000_000, 0)
		s := store(t, ttl, now)
		ctx := context.Background()
		reg := func(client string, epoch int64) string {
			t.Helper()
			res, err := s.Register(ctx, &directory.Registration{ClientID: client, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:1/" + client, Headroom: 1, Hostname: "app.example", Env: "green", Epoch: epoch}, now)
			if err != nil {
				t.Fatal(err)
			}
			return res.SessionID
		}
		lapsed := reg("old-1", 1)
		now = now.Add(ttl / 2)
		live := reg("old-2", 1) // a replica: the binding stays live
		now = now.Add(ttl/2 + time.Second)
		reg("new", 2)
		var se *directory.SupersededError
		if _, err := s.Heartbeat(ctx, &directory.Beat{SessionID: live, Sub: "s"}, now); !errors.As(err, &se) {
			t.Fatalf("unexpected heartbeat of the live replica; got %v; want superseded", err)
		}
		if _, err := s.Heartbeat(ctx, &directory.Beat{SessionID: lapsed, Sub: "s"}, now); !errors.Is(err, directory.ErrUnknownSession) {
			t.Fatalf("unexpected heartbeat of the replica whose lease had lapsed; got %v; want unknown session", err)
		}
	})
}

// A registration at the advertise URL of another client's session voids
// that session (R-LS-3); the ids it still held are not the newcomer's to
// take: every one it lists comes back as a duplicate, whether the void
// freed them yet or not (it frees a batch at a time), on both stores
// (R-REG-1).
func TestVoidedSessionRowsAreDuplicates_RREG1_RLS3(t *testing.T) {
	onBothStores(t, func(t *testing.T, store directorytest.Factory) {
		const ttl = time.Hour
		now := time.Unix(1_800_000_000, 0)
		s := store(t, ttl, now)
		ctx := context.Background()
		ids := make([]string, directory.RegisterBatch+44)
		for i := range ids {
			ids[i] = fmt.Sprintf("i%d", i)
		}
		reg := func(client, url string, ids []string) *directory.RegisterResult {
			t.Helper()
			res, err := s.Register(ctx, &directory.Registration{ClientID: client, Sub: "s", Secret: "k", Namespaces: []string{"/c"},
				AdvertiseURL: "http://127.0.0.1:1/" + url, Headroom: 1, Instances: map[string][]string{"/c": ids}}, now)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		// The voiding registration lists one batch of the holder's ids
		// (one script call, which frees a batch of the holder's rows, not
		// all of them), or all of them (batches).
		for i, n := range []int{directory.RegisterBatch, len(ids)} {
			url := fmt.Sprintf("shared%d", i)
			held := reg(fmt.Sprintf("holder%d", i), url, ids)
			if len(held.Duplicates) != 0 {
				t.Fatalf("unexpected duplicates of the holder's registration: %d", len(held.Duplicates))
			}
			res := reg(fmt.Sprintf("voider%d", i), url, ids[:n])
			if len(res.Voided) != 1 || res.Voided[0].SessionID != held.SessionID {
				t.Fatalf("unexpected sessions voided; got %+v; want %s", res.Voided, held.SessionID)
			}
			if len(res.Duplicates) != n {
				t.Fatalf("unexpected duplicates of a voiding registration listing %d ids; got %d; want all", n, len(res.Duplicates))
			}
		}
	})
}
