//go:build race

package bloom

// raceOn: the race detector slows a run several times; the largest
// concurrent tests scale down under it.
const raceOn = true
