package directory

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// TestWindDueHeapOrder: the heap hands back deadlines soonest first.
func TestWindDueHeapOrder(t *testing.T) {
	base := time.Unix(1_800_000_000, 0)
	var h windDueHeap
	for range 1000 {
		h.push(windDue{at: base.Add(time.Duration(rand.IntN(1e6)) * time.Millisecond)})
	}
	prev := time.Time{}
	for len(h) > 0 {
		e := h.pop()
		if e.at.Before(prev) {
			t.Fatalf("unexpected order; got %v after %v", e.at, prev)
		}
		prev = e.at
	}
}

// TestWindDueStaysBounded_RCM1: timed wind-downs revoked or set again
// leave stale heap entries; the heap is rebuilt before they pile up, and
// the wind-down left still frees its placement at its deadline.
func TestWindDueStaysBounded_RCM1(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	m := NewMemory(time.Minute, now)
	_, _ = m.Place(ctx, &PlaceRequest{NS: "/warm", ID: "x", Now: now}) // starts the cold-start quarantine
	now = now.Add(time.Minute)
	if _, err := m.Register(ctx, &Registration{ClientID: "a", Sub: "s", Secret: "k", Namespaces: []string{"/c"},
		AdvertiseURL: "http://127.0.0.1:1/a", Headroom: 1e6}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Place(ctx, &PlaceRequest{NS: "/c", ID: "x", Now: now}); err != nil {
		t.Fatal(err)
	}
	far := now.Add(24 * time.Hour)
	for range 10_000 {
		if _, _, err := m.WindDown(ctx, "/c", "x", "", &far, now); err != nil {
			t.Fatal(err)
		}
		if _, _, err := m.WindDown(ctx, "/c", "x", "", nil, now); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(m.windDue); n > 2*len(m.windDowns)+1025 {
		t.Fatalf("unexpected heap size; got %d; want at most %d", n, 2*len(m.windDowns)+1025)
	}
	soon := now.Add(time.Second)
	if _, _, err := m.WindDown(ctx, "/c", "x", "", &soon, now); err != nil {
		t.Fatal(err)
	}
	_ = m.Sweep(ctx, now)
	if _, err := m.Placement(ctx, "/c", "x", now); err != nil {
		t.Fatalf("unexpected free before the deadline: %v", err)
	}
	_ = m.Sweep(ctx, soon)
	if _, err := m.Placement(ctx, "/c", "x", soon); !errors.Is(err, ErrNoPlacement) {
		t.Fatalf("unexpected placement after the deadline; got %v; want %v", err, ErrNoPlacement)
	}
}
