package capi

// What the external tests (package capi_test) need of the package.

// Handles counts the live handles of each kind (tests).
func (t *Table) Handles() (comms, works, stores int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.comms), len(t.works), len(t.stores)
}

// Codes lists every code in order.
var Codes = []Code{
	OK,
	NotReady,
	InvalidArgument,
	BadHandle,
	Mismatch,
	Timeout,
	Aborted,
	Closed,
	CUDA,
	NCCL,
	System,
	Internal,
	NoDevice,
}
