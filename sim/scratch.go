package sim

// Temporaries of the data path (a collective's copies of its inputs, its
// result, the add stage's sources) come from newScratch and go back through
// the function it returns once the operation is done with them. Built
// without the race detector they are plain slices; under it, large ones
// are mapped outside the Go heap (scratch_race.go), where the detector
// does not shadow them: the simulated data movement then costs a fraction
// of its instrumented time, with the same bytes moved and the same
// arithmetic. Device memory itself stays on the Go heap, every access to it
// under its allocation's lock.
