package main

import (
	"errors"
	"io"
	"testing"

	"github.com/panjf2000/ants/v2"
)

// run stops the pool ants starts on import: nothing submits to it, and
// its goroutines would wake an idle node three times a second.
func TestRunReleasesAntsDefaultPool(t *testing.T) {
	ants.Reboot() // open again, whatever an earlier test's run did
	if err := ants.Submit(func() {}); err != nil {
		t.Fatalf("cannot submit to the rebooted default pool: %v", err)
	}
	if code := run(nil, env(map[string]string{}), io.Discard); code != 2 {
		t.Fatalf("unexpected exit %d with no configuration; want 2", code)
	}
	if err := ants.Submit(func() {}); !errors.Is(err, ants.ErrPoolClosed) {
		t.Fatalf("unexpected submit to ants' default pool after run; got %v; want ErrPoolClosed", err)
	}
}
