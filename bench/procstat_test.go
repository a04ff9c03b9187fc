package bench

import (
	"os"
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
}
