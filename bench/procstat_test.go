package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a parenthesis must not shift fields.
	line := []byte("4242 (ngi nx) w) S 17 4242 4242 0 -1 4194560 1200 0 0 0 250 130 0 0 20 0 1 0 999 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")
	st, err := parseProcStat(4242, line)
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != 17 {
		t.Fatalf("unexpected ppid; got %d; want 17", st.PPID)
	}
	if st.CPU != 3800*time.Millisecond {
		t.Fatalf("unexpected cpu; got %v; want 3.8s (380 ticks)", st.CPU)
	}
	if want := int64(2048 * os.Getpagesize()); st.RSS != want {
		t.Fatalf("unexpected rss; got %d; want %d", st.RSS, want)
	}
	if _, err := parseProcStat(1, []byte("1 (x) S 0")); err == nil {
		t.Fatal("unexpected success on a short stat line")
	}
}

func TestReadProcSelf(t *testing.T) {
	st, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.RSS <= 0 || st.PPID != os.Getppid() {
		t.Fatalf("unexpected reading of this process; got %+v", st)
	}
}

func TestParseBusy(t *testing.T) {
	stat := []byte("cpu  100 5 50 9000 40 3 2 1 0 0\ncpu0 50 2 25 4500 20 1 1 0 0 0\n")
	got, err := parseBusy(stat)
	if err != nil {
		t.Fatal(err)
	}
	// user 100 + nice 5 + system 50 + irq 3 + softirq 2 + steal 1 = 161 ticks.
	if got != 1610*time.Millisecond {
		t.Fatalf("unexpected busy time; got %v; want 1.61s", got)
	}
	if _, err := BusyCPU(); err != nil {
		t.Fatal(err)
	}
	if got, err := parseStat(stat, stealCol); err != nil || got != 10*time.Millisecond {
		t.Fatalf("unexpected steal; got %v, %v; want 10ms (1 tick)", got, err)
	}
	if _, err := StealCPU(); err != nil {
		t.Fatal(err)
	}
}

// A process tree's memory counts the pages its processes share once: RSS
// summed counted a shared library's pages once per process (nginx's
// master and workers about 11 MiB over the 20 they hold). The nginx test
// (bench/scenario) skips where nginx is not installed — under make test
// it never ran — so this one runs on any Linux: a shell and two sleeps,
// whose pages are nearly all shared (their RSS summed is several times
// their PSS summed).
func TestProcTreeCountsSharedPagesOnce(t *testing.T) {
	if _, err := os.Stat("/proc/self/smaps_rollup"); err != nil {
		t.Skip("no /proc/self/smaps_rollup")
	}
	cmd := exec.Command("sh", "-c", "sleep 60 & sleep 60 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		for _, c := range Children(pid) {
			if p, err := os.FindProcess(c); err == nil {
				_ = p.Kill()
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); len(Children(pid)) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the shell has %d children after 10s; want its 2 sleeps", len(Children(pid)))
		}
	}
	procs := append([]int{pid}, Children(pid)...)
	var pss, rss int64
	for _, p := range procs {
		v, ok := readPSS(p)
		st, err := ReadProc(p)
		if !ok || err != nil {
			t.Fatalf("cannot read process %d: %v", p, err)
		}
		pss, rss = pss+v, rss+st.RSS
	}
	if rss < 2*pss {
		t.Fatalf("BUG: the tree shares too little to tell RSS from PSS; RSS summed %d, PSS summed %d", rss, pss)
	}
	st, err := ProcTree(pid)
	if err != nil {
		t.Fatal(err)
	}
	if float64(st.RSS) > 1.1*float64(pss) || float64(st.RSS) < 0.9*float64(pss) {
		t.Fatalf("unexpected memory of the tree; got %d bytes; want about %d (PSS summed over the shell and its sleeps; RSS summed is %d)", st.RSS, pss, rss)
	}
}
