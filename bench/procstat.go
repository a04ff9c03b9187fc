package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

// ProcStat is one reading of a process from /proc.
type ProcStat struct {
	PID int
	// CPU is utime+stime: every thread's CPU time so far, including
	// threads that already exited (10 ms resolution).
	CPU time.Duration
	// RSS is the resident set size in bytes.
	RSS int64
	// PPID is the parent process id.
	PPID int
}

// ReadProc reads /proc/<pid>/stat.
func ReadProc(pid int) (ProcStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ProcStat{}, fmt.Errorf("cannot read the stat of pid %d: %w", pid, err)
	}
	return parseProcStat(pid, b)
}

// parseProcStat parses a /proc/<pid>/stat line. The command name is in
// parentheses and may itself hold spaces and parentheses, so fields are
// counted from the last ')'.
func parseProcStat(pid int, b []byte) (ProcStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ProcStat{}, fmt.Errorf("cannot parse the stat of pid %d: no command name", pid)
	}
	// Fields after the name start at field 3 (state).
	f := bytes.Fields(b[i+1:])
	const (
		ppid  = 4 - 3
		utime = 14 - 3
		stime = 15 - 3
		rss   = 24 - 3
	)
	if len(f) <= rss {
		return ProcStat{}, fmt.Errorf("cannot parse the stat of pid %d: %d fields", pid, len(f)+2)
	}
	num := func(k int) int64 {
		n, _ := strconv.ParseInt(string(f[k]), 10, 64)
		return n
	}
	return ProcStat{
		PID:  pid,
		PPID: int(num(ppid)),
		CPU:  time.Duration(num(utime)+num(stime)) * clockTick,
		RSS:  num(rss) * int64(os.Getpagesize()),
	}, nil
}

// ProcTree reads pid and its direct children (nginx: the master and its
// workers); CPU is summed. With children, RSS is the sum of their
// proportional set sizes (smaps_rollup's Pss): RSS summed counted the
// pages the processes share once per process, nginx's master and two
// workers about 11 MiB over the 20 they hold. Without children (or
// without smaps_rollup), it is the process's RSS.
func ProcTree(pid int) (ProcStat, error) {
	root, err := ReadProc(pid)
	if err != nil {
		return root, err
	}
	children := Children(pid)
	pss, pssOK := readPSS(pid)
	for _, c := range children {
		if st, err := ReadProc(c); err == nil {
			root.CPU += st.CPU
			root.RSS += st.RSS
			p, ok := readPSS(c)
			pss, pssOK = pss+p, pssOK && ok
		}
	}
	if len(children) > 0 && pssOK {
		root.RSS = pss
	}
	return root, nil
}

// readPSS reads a process's proportional set size in bytes.
func readPSS(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// Children lists the direct children of pid.
func Children(pid int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, d := range dirs {
		n, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil || n == pid {
			continue
		}
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		if st, err := parseProcStat(n, b); err == nil && st.PPID == pid {
			out = append(out, n)
		}
	}
	return out
}

// BusyCPU is the machine's busy CPU time so far (/proc/stat: user, nice,
// system, irq, softirq and steal over every CPU; not idle or iowait).
func BusyCPU() (time.Duration, error) { return readStat(busyCols...) }

// StealCPU is the CPU time the hypervisor has given other machines on
// this one's CPUs so far (/proc/stat's steal over every CPU). Unlike the
// rest of what is not ours, it needs no subtraction of this run's own
// processes, whose per-process times drift from /proc/stat's over a
// fraction of a second (and the kernel's softirq threads serve their
// loopback traffic without being theirs), so it is exact over short
// intervals.
func StealCPU() (time.Duration, error) { return readStat(stealCol) }

// /proc/stat's columns: busyCols are user, nice, system, irq, softirq and
// steal; stealCol is steal.
var busyCols = []int{1, 2, 3, 6, 7, 8}

const stealCol = 8

// readStat reads /proc/stat and sums its columns cols (parseStat).
func readStat(cols ...int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read /proc/stat: %w", err)
	}
	return parseStat(b, cols...)
}

func parseBusy(b []byte) (time.Duration, error) { return parseStat(b, busyCols...) }

// parseStat sums the columns cols of /proc/stat's first line (the CPUs
// together).
func parseStat(b []byte, cols ...int) (time.Duration, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, fmt.Errorf("cannot parse /proc/stat: %q", line)
	}
	var ticks int64
	for _, i := range cols {
		n, err := strconv.ParseInt(string(f[i]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse /proc/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
