package directory

import (
	"sync"
	"testing"
	"time"
)

// A revoked Owner stays revoked (R-LS-2, R-REG-3): a renewal read from
// Redis before a session ended and stored after it must not bring its
// cached routes back to life.
func TestOwnerRevokeIsFinal_RLS2(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	o := NewOwner("s1", "c1", "http://127.0.0.1:1/", nil, now.Add(time.Second))
	if !o.Live(now) || o.leaseUntil.Load() == revokedLease {
		t.Fatal("a new owner with a future lease is not live")
	}
	o.SetLeaseUntil(now.Add(2 * time.Second))
	if got := o.LeaseUntil(); !got.Equal(now.Add(2 * time.Second)) {
		t.Fatalf("LeaseUntil = %v after a renewal", got)
	}
	o.Revoke()
	o.SetLeaseUntil(now.Add(time.Hour))
	if o.Live(now) || o.leaseUntil.Load() != revokedLease {
		t.Fatal("a renewal after Revoke revived the owner")
	}
	if !o.LeaseUntil().Before(now) {
		t.Fatalf("LeaseUntil of a revoked owner = %v, want the past", o.LeaseUntil())
	}
}

// Renewals racing a revocation: once Revoke has returned, no renewal
// still in flight revives the owner.
func TestOwnerRevokeRacesRenewals_RLS2(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for range 200 {
		o := NewOwner("s1", "c1", "http://127.0.0.1:1/", nil, now.Add(time.Second))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := range 50 {
					o.SetLeaseUntil(now.Add(time.Duration(g*50+i+1) * time.Second))
				}
			}()
		}
		close(start)
		o.Revoke()
		wg.Wait()
		if o.Live(now) {
			t.Fatal("owner live after Revoke and the renewals racing it")
		}
	}
}

// A per-namespace env is the namespace's env even when empty: "" in envs
// binds the namespace to no env, whatever the worker env says — as the
// Redis scripts read it (redis_lib.lua envof) (R-LS-4).
func TestEnvOfEmptyOverride_RLS4(t *testing.T) {
	envs := map[string]string{"/a": "", "/b": "blue"}
	for ns, want := range map[string]string{"/a": "", "/b": "blue", "/c": "prod"} {
		if got := EnvOf("prod", envs, ns); got != want {
			t.Errorf("unexpected EnvOf(prod, %v, %s); got %q; want %q", envs, ns, got, want)
		}
	}
}
