package hier

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/streams"
)

// testStream is a stream whose identity alone matters.
type testStream struct {
	streams.Stream
	name string
}

// switchEvent is an event whose work is done once *done is set; it counts
// the queries it answers.
type switchEvent struct {
	doneEvent
	done    *bool
	queries *int
}

func (e switchEvent) Query() (bool, error) {
	*e.queries++
	return *e.done, nil
}

// handedCalls is a Reducer whose engine has handed the watcher calls 1,
// 2, … recorded on the streams on, in that order, none done yet: their
// Works and the switches that make them done, by call number. Their
// events count their queries in queries.
func handedCalls(on []*testStream, queries *int) (*Reducer, map[int]*Work, map[int]*bool) {
	r := &Reducer{}
	r.watch.ch = make(chan pending, len(on))
	works, done := map[int]*Work{}, map[int]*bool{}
	for i, s := range on {
		seq := i + 1
		done[seq] = new(bool)
		works[seq] = &Work{}
		works[seq].r = r
		r.watch.ch <- pending{
			req: &request{seq: uint64(seq), work: works[seq]},
			ev:  switchEvent{done: done[seq], queries: queries},
			on:  s,
		}
	}
	return r, works, done
}

// TestHelpInfersOnlyAlongAStream: a Wait that finds its call done asks
// the newest call queued on the same stream, and completes the calls it
// shows done without asking each, but never a call of another stream,
// which may still run, nor any call behind it (call order).
func TestHelpInfersOnlyAlongAStream(t *testing.T) {
	a, b := &testStream{name: "a"}, &testStream{name: "b"}
	var queries int
	r, works, done := handedCalls([]*testStream{a, b, a, a}, &queries)
	*done[1], *done[3], *done[4] = true, true, true // b's call 2 still runs

	require.True(t, r.help(works[1]))
	require.Equal(t, 2, queries, "call 1, then the newest of its stream, call 4")
	require.True(t, works[1].IsCompleted())
	for _, seq := range []int{2, 3, 4} {
		require.False(t, works[seq].IsCompleted(), "call %d completed behind a call still running on another stream", seq)
	}

	require.False(t, r.help(works[4]), "call 2 still runs")
	require.Equal(t, 3, queries)

	*done[2] = true
	require.True(t, r.help(works[4]))
	require.Equal(t, 4, queries, "call 2 asked; calls 3 and 4 known done since the first Wait")
	for seq, w := range works {
		require.True(t, w.IsCompleted(), "call %d", seq)
		require.NoError(t, w.Err())
	}
}

// TestKnownDone: what helping Waits learnt, per stream, newest first, and
// bounded.
func TestKnownDone(t *testing.T) {
	var k knownDone
	ss := make([]*testStream, 6)
	for i := range ss {
		ss[i] = &testStream{}
	}
	call := func(s *testStream, seq uint64) pending {
		return pending{req: &request{seq: seq, work: &Work{}}, ev: doneEvent{}, on: s}
	}
	k.learn(ss[0], 10)
	require.True(t, k.covers(call(ss[0], 10)))
	require.True(t, k.covers(call(ss[0], 3)))
	require.False(t, k.covers(call(ss[0], 11)))
	require.False(t, k.covers(call(ss[1], 2)), "another stream")
	k.learn(ss[0], 5) // older news changes nothing
	require.True(t, k.covers(call(ss[0], 10)))
	noDevice := call(ss[0], 1)
	noDevice.ev = nil
	require.False(t, k.covers(noDevice), "a call without device work is not the device's to complete")
	for i := 1; i < len(ss); i++ {
		k.learn(ss[i], uint64(20+i))
	}
	require.False(t, k.covers(call(ss[0], 3)), "the oldest stream was pushed out")
	for i := len(ss) - len(k); i < len(ss); i++ {
		require.True(t, k.covers(call(ss[i], uint64(20+i))), "stream %d", i)
	}
	k.learn(ss[2], 40) // pushed out long ago: back in, newest
	require.True(t, k.covers(call(ss[2], 40)))
	require.True(t, k.covers(call(ss[5], 25)))
}

// TestHelpProbesOnlyWhenBehind: a Wait asks ahead only where its call was
// done when first asked (the device ahead of the caller); a call it saw
// running first says the calls behind it are likely running too, and
// asking the newest would be a query wasted each call.
func TestHelpProbesOnlyWhenBehind(t *testing.T) {
	a := &testStream{name: "a"}
	var queries int
	r, works, done := handedCalls([]*testStream{a, a, a}, &queries)
	require.False(t, r.help(works[1]))
	require.Equal(t, 1, queries)
	for _, d := range done {
		*d = true
	}
	require.True(t, r.help(works[1]))
	require.Equal(t, 2, queries, "call 1, seen running before: no question ahead")
	require.False(t, works[2].IsCompleted())
	require.True(t, r.help(works[3]))
	require.Equal(t, 4, queries, "call 2, done when first asked, then the newest, call 3")
	for seq, w := range works {
		require.True(t, w.IsCompleted(), "call %d", seq)
	}
}
