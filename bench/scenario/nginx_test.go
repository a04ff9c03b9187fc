package scenario

import (
	"runtime"
	"testing"
)

// TestNginxWorkersMatchProxyCPUs: nginx runs one worker per CPU the
// proxies may use, as pinboard's runtime does (GOMAXPROCS follows the
// affinity mask taskset sets): with -proxy-cpu 1 on a 2-CPU box, two
// workers would share the one CPU against pinboard's one P.
func TestNginxWorkersMatchProxyCPUs(t *testing.T) {
	for _, c := range []struct {
		list string
		want int
	}{
		{"", runtime.NumCPU()},
		{"1", 1},
		{"0-1", 2},
		{"0,2", 2},
		{"0-3,6", 5},
		{"0-7:2", 4},
		{"nonsense", runtime.NumCPU()},
		{"3-1", runtime.NumCPU()},
	} {
		if got := nginxWorkers(c.list); got != c.want {
			t.Fatalf("unexpected nginx workers for proxy CPUs %q; got %d; want %d", c.list, got, c.want)
		}
	}
}
