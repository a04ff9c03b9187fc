//go:build race

package proxy

// raceEnabled: under the race detector sync.Pool drops a share of Put items
// on purpose, so allocation counts of pooled code are meaningless.
const raceEnabled = true
