//go:build race

package raceflag

// Enabled: the binary was built with the race detector.
const Enabled = true
