//go:build race

package testmem

const raceEnabled = true
