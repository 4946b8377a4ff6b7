//go:build !race

package bloom

// raceOn: see race_test.go.
const raceOn = false
