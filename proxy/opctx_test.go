package proxy

import (
	"testing"
	"time"
)

// TestOpContextsBound: every operation gets at least d and at most d+1s;
// operations within one second share a context; old contexts are
// cancelled once expired.
func TestOpContextsBound(t *testing.T) {
	o := &opContexts{d: 5 * time.Second}
	t0 := time.Now()
	var first, prev any
	for i := 0; i < 40; i++ {
		now := t0.Add(time.Duration(i) * 250 * time.Millisecond)
		ctx := o.at(now)
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("unexpected context without a deadline")
		}
		if left := dl.Sub(now); left < 5*time.Second || left > 6*time.Second {
			t.Fatalf("unexpected bound at step %d; got %v; want 5s..6s", i, left)
		}
		if i == 0 {
			first = ctx
		}
		if i%4 != 0 && ctx != prev {
			t.Fatalf("unexpected new context within the same second at step %d", i)
		}
		prev = ctx
	}
	// 40 steps of 250 ms: 10 rotations, so the first context left the ring
	// of 8 and was cancelled.
	select {
	case <-first.(interface{ Done() <-chan struct{} }).Done():
	default:
		t.Fatal("unexpected live context after it left the ring")
	}
}

func TestOpContextsConcurrent(t *testing.T) {
	o := &opContexts{d: time.Second}
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 1000; i++ {
				if _, ok := o.get().Deadline(); !ok {
					t.Error("unexpected context without a deadline")
					return
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
}
