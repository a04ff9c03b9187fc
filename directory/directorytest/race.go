//go:build race

package directorytest

// raceEnabled: under the race detector sync.Pool drops a share of Put
// items on purpose, so what a pool makes allocation-free allocates now
// and then; the allocation checks that rest on one skip there (the
// Makefile runs them once more without -race).
const raceEnabled = true
