package hier

import (
	"time"

	"github.com/fairgo/fairgo/streams"
)

// SkipStageWait drops the wait of stage s on its predecessor's hand-off in
// r's pipeline. It exists only in test builds, so that a test can prove the
// property tests catch a missing dependency. Call it before r's first call.
func SkipStageWait(r *Reducer, s streams.Stage) { r.exec.skipWait = s }

// WithCheckAlone sets how long the checker waits for a call's data before
// it polls the call's check alone (checkAlone by default).
func WithCheckAlone(d time.Duration) Option { return func(c *config) { c.checkAlone = d } }

// InlineCalls is how many calls r enqueued on the caller's goroutine.
func InlineCalls(r *Reducer) uint64 { return r.hooks.inlined.Load() }

// EngineIdle reports whether no call is queued for r's engine or being
// enqueued: the next call that may go inline does.
func EngineIdle(r *Reducer) bool {
	r.calls.mu.Lock()
	defer r.calls.mu.Unlock()
	return !r.calls.busy && len(r.calls.items) == 0
}

// StagesByPairs reports whether r stages its fingerprinted calls by pair
// copies (backend.PairCopier on mapped host memory).
func StagesByPairs(r *Reducer) bool { return r.fps != nil && r.fps.pair != nil }

// GuessedClasses is how many size classes r's calibration failed to
// measure (they took the guess).
func GuessedClasses(r *Reducer) int64 { return r.router.guessed.Load() }

// FingerprintedCalls is how many calls took the fingerprinted collective
// (whether or not its enqueue then succeeded).
func FingerprintedCalls(r *Reducer) uint64 { return r.hooks.fingerprinted.Load() }

// SeparateChecks counts r's calls handed to the separate check.
func SeparateChecks(r *Reducer) uint64 { return r.hooks.checkedApart.Load() }

// WatcherParks is how many times r's watcher blocked for its next call.
func WatcherParks(r *Reducer) uint64 { return r.hooks.watcherParks.Load() }

// HoldWatcher stops r's watcher from taking calls (held) or lets it go on,
// so that a test sees what Waits complete on their own. Release it before
// Close, which waits for the watcher.
func HoldWatcher(r *Reducer, held bool) { r.hooks.watcherHeld.Store(held) }

// HelpedCalls is how many calls a Wait completed in the watcher's place.
func HelpedCalls(r *Reducer) uint64 { return r.hooks.helped.Load() }

// WatcherPolls is how many times r's watcher asked a call's completion
// event (a query; it naps at watchPace between them).
func WatcherPolls(r *Reducer) uint64 { return r.hooks.watcherPolls.Load() }

// HoldRelay makes r's relay hold the messages it receives (the peers'
// images and cursors), or reads them in again.
func HoldRelay(r *Reducer, held bool) { r.hooks.relayHeld.Store(held) }

// HelpQueries is how many completion events helping Waits have queried.
func HelpQueries(r *Reducer) uint64 { return r.hooks.helpQueries.Load() }

// CalibrationCalls is how many allreduces Auto's calibrations enqueued.
func CalibrationCalls(r *Reducer) uint64 { return r.hooks.calibrationCalls.Load() }

// CalibrationBurst is how many calls back to back one calibration sample
// makes at size bytes.
func CalibrationBurst(size int64) int { return calibrationBurst(size) }

// CalibrationRounds is the timed samples of a candidate that is not pruned.
const CalibrationRounds = calibrationRounds

// SharedMemoryCheck reports whether r's calls are checked through shared
// memory (a one-machine job) rather than by a collective. It is settled at
// call SharedMemoryFirstCall; ask after that call's Work completed.
func SharedMemoryCheck(r *Reducer) bool { return r.host != nil }

// RelayedCheck reports whether r's calls are checked through shared
// memory across machines, the other machines' images brought by the relay.
func RelayedCheck(r *Reducer) bool { return r.host != nil && r.host.relay != nil }

// CutRelay closes the connections of r's relay, as a network that failed
// would: r's images reach no peer, and its peers' no longer reach it.
func CutRelay(r *Reducer) {
	rl := r.host.relay
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for _, c := range rl.conns {
		_ = c.Close()
	}
}

// SharedMemorySlots is how many calls the shared memory's slots hold.
const SharedMemorySlots = hostSlots

// RelayMaxMachines is the most machines the check through shared memory
// spans.
const RelayMaxMachines = relayMaxMachines

// RelayMeshMachines is the most machines whose rail peers each send to
// every other; from one more on, a hub relays (a star).
const RelayMeshMachines = relayMeshMachines

// SharedMemoryFirstCall is the first call a one-machine job may check
// through shared memory: the collective checks of the ones before carry
// the ranks' agreement on it.
const SharedMemoryFirstCall = hostFirstCall

// SkipCheck turns off r's cross-rank check, so that a benchmark can measure
// what the check costs. Every rank of the world must do it before its first
// call.
func SkipCheck(r *Reducer) { r.hooks.skipCheck = true }

// SetRoute makes every size class of Auto take algorithm a (its rail
// serial as the options say), as if a calibration had chosen it. Call it
// before r's first call, on every rank alike.
func SetRoute(r *Reducer, a Algorithm) {
	rt := r.router
	rt.table.mu.Lock()
	defer rt.table.mu.Unlock()
	for class := range 64 {
		rt.table.measured[class] = route{algo: a, serial: rt.serialRail()}
		rt.settled[class].Store(nil)
		rt.wholes[class].Store(nil)
	}
}

// The link probe's sizes (bytes per rank) and timed runs per size.
const (
	ProbeSmall = probeSmall
	ProbeLarge = probeLarge
	ProbeRuns  = probeRuns
)

// WatchdogTimeout is the watchdog's time r runs with (0: off).
func WatchdogTimeout(r *Reducer) time.Duration { return r.cfg.timeout }

// BoardTimeoutKey is the Board key under which a rank that timed out
// leaves its note for the peers.
const BoardTimeoutKey = boardTimeout

// HoldChecker stops r's checker goroutine from deciding checks while on
// (a checker slow to wake), or lets it go on.
func HoldChecker(r *Reducer, on bool) { r.hooks.checkerHeld.Store(on) }

// ChecksDecidedEarly is how many checks a helping Wait decided in place of
// r's checker goroutine.
func ChecksDecidedEarly(r *Reducer) uint64 { return r.hooks.checksDecidedEarly.Load() }

// AbortsFinished waits up to d for the communicator aborts r started (true
// at once where it started none).
func AbortsFinished(r *Reducer, d time.Duration) bool { return r.abortsFinished(d) }

// MadePaddingRing reports whether r's pipeline has made its padding slots
// (at the first slice with a tail).
func MadePaddingRing(r *Reducer) bool { return r.exec.paddingR != nil }

// StagedCount is the element count of the fingerprinted copy of count
// elements of elemSize bytes among world ranks.
func StagedCount(count int64, elemSize, world int) int64 { return stagedCount(count, elemSize, world) }

// FingerprintElems is how many elements a fingerprint adds to its call's
// staged copy.
const FingerprintElems = fpElems
