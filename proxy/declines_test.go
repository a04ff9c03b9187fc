package proxy

import (
	"slices"
	"testing"
	"time"

	"github.com/pinboard-go/pinboard/directory"
)

// The ranking with decliners: the others in the inner policy's order
// (rendezvous on the key among them, R-PL-4), then the decliners as
// fallbacks; the inner policy alone while nobody declined, when all did,
// or once the memory passed (R-PL-6).
func TestDeclinersRankedLast_RPL6_RPL4(t *testing.T) {
	cands := []directory.Candidate{
		{SessionID: "s0", ClientID: "c0", Headroom: 10},
		{SessionID: "s1", ClientID: "c1", Headroom: 10},
		{SessionID: "s2", ClientID: "c2", Headroom: 10},
		{SessionID: "s3", ClientID: "c3", Headroom: 10},
	}
	inner := &directory.HeadroomPolicy{}
	now := time.Unix(1_700_000_000, 0)
	var d declines
	if d.policy(inner, "/c", now) != directory.Policy(inner) {
		t.Fatalf("unexpected policy while nobody declined; want the inner one")
	}
	for _, key := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"} {
		in := &directory.PickInput{Key: key, HasKey: true}
		first := inner.Rank(nil, cands, in)[0]
		var d declines
		d.note(cands[first].SessionID, "", now)
		got := d.policy(inner, "/c", now).Rank(nil, cands, in)
		if len(got) == 0 || got[0] == first || got[len(got)-1] != first {
			t.Fatalf("unexpected ranking for %s with its first choice s%d declined; got %v; want s%d last", key, first, got, first)
		}
		// The others in the inner order: the rendezvous winner among them.
		rest := slices.Delete(slices.Clone(cands), first, first+1)
		want := inner.Rank(nil, rest, in)[0]
		if cands[got[0]].SessionID != rest[want].SessionID {
			t.Fatalf("unexpected first choice for %s; got %s; want %s, the rendezvous pick among the others", key, cands[got[0]].SessionID, rest[want].SessionID)
		}
		if p := d.policy(inner, "/c", now.Add(declineMemory)); p.Rank(nil, cands, in)[0] != first {
			t.Fatalf("unexpected ranking for %s once the memory passed; want s%d first again", key, first)
		}
	}
	for _, c := range cands {
		d.note(c.SessionID, "", now)
	}
	in := &directory.PickInput{Key: "10.0.0.1", HasKey: true}
	if got, want := d.policy(inner, "/c", now).Rank(nil, cands, in), inner.Rank(nil, cands, in); !slices.Equal(got, want) {
		t.Fatalf("unexpected ranking when every worker declined; got %v; want the inner %v", got, want)
	}
	// Passed entries are forgotten at the next note: the table holds the
	// fleet's decliners, not every session that ever declined.
	d.note("s9", "", now.Add(declineMemory))
	if n := d.n.Load(); n != 1 {
		t.Fatalf("unexpected entries after the memory passed; got %d; want 1", n)
	}
}

// Once every remembered decline has passed, placements use the inner
// policy again without taking the lock or allocating: before, one decline
// left the wrapper in place until the next decline, for the life of the
// process (R-PL-6).
func TestDeclinesPassedLeaveInnerPolicy_RPL6(t *testing.T) {
	inner := &directory.HeadroomPolicy{}
	now := time.Unix(1_700_000_000, 0)
	var d declines
	d.note("s0", "", now)
	d.note("s1", "", now.Add(time.Second))
	if d.policy(inner, "/c", now.Add(declineMemory)) == directory.Policy(inner) {
		t.Fatalf("unexpected inner policy while s1 is remembered; want the wrapper")
	}
	later := now.Add(time.Second + declineMemory)
	if p := d.policy(inner, "/c", later); p != directory.Policy(inner) {
		t.Fatalf("unexpected policy once every decline passed; got %T; want the inner one", p)
	}
	if n := testing.AllocsPerRun(100, func() { _ = d.policy(inner, "/c", later) }); n != 0 {
		t.Fatalf("unexpected allocations once every decline passed; got %v; want 0", n)
	}
}
