//go:build !race

package directorytest

const raceEnabled = false
