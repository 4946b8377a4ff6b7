package engine

// SetRebuildGate makes every later Bloom rebuild wait for gate to close
// before it starts, so tests can observe the cold state.
func SetRebuildGate(gate chan struct{}) { rebuildGate = gate }
