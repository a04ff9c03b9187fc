//go:build !race

// Package raceflag says whether the binary was built with the race
// detector. Under it sync.Pool drops a share of Put items on purpose, so
// what a pool makes allocation-free allocates now and then: the
// allocation checks of pooled code skip there (the Makefile runs them
// once more without -race).
package raceflag

// Enabled: the binary was built with the race detector.
const Enabled = false
