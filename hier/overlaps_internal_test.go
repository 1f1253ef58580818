package hier

import (
	"context"
	"maps"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// orderStream and orderEvent record what waitOverlaps asks of a device:
// which calls' events a stream waited for.
type orderStream struct {
	id    int
	waits *[]int
}

func (s orderStream) WaitEvent(e streams.Event) error {
	*s.waits = append(*s.waits, e.(*orderEvent).call)
	return nil
}

type orderEvent struct{ call int }

func (*orderEvent) Record(streams.Stream) error { return nil }
func (*orderEvent) Query() (bool, error)        { return true, nil }
func (*orderEvent) Wait(context.Context) error  { return nil }

// The property: whatever the calls' memory and streams, and whichever
// calls complete in between, each call is ordered on the device (by the
// events it waited for, by its stream, and by what those were ordered
// after in turn) after every call still in flight whose memory overlaps
// its own. The scan's early stop (a newer call whose memory contains this
// one's) must not lose any of them.
func TestWaitOverlapsOrdersEveryOverlappingCall(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		r := &Reducer{}
		var waits []int
		stream := func(id int) orderStream { return orderStream{id: id, waits: &waits} }
		n := rapid.IntRange(1, 40).Draw(rt, "calls")
		// done[j] is the calls complete once call j's event is: j, what
		// it was ordered after, and what its stream ran before the event.
		done := make([]map[int]bool, n)
		lastOf := make([]int, n)
		for k := range n {
			// Calls complete in any order the watcher sees them.
			for i := r.flight.list.Len() - 1; i >= 0; i-- {
				if rapid.IntRange(0, 3).Draw(rt, "complete") == 0 {
					r.flight.list.Remove(i)
				}
			}
			lo := rapid.IntRange(0, 15).Draw(rt, "lo")
			size := rapid.IntRange(1, 16-lo).Draw(rt, "size")
			first := rapid.IntRange(0, 2).Draw(rt, "first")
			last := first
			if rapid.Bool().Draw(rt, "pipelined") {
				last = rapid.IntRange(0, 2).Draw(rt, "last")
			}
			lastOf[k] = last
			q := &request{a: fairgo.Tensor{Ptr: uintptr(1024 + 64*lo), Bytes: int64(64 * size), Count: int64(16 * size),
				DType: fairgo.Float32}, work: &Work{}}
			waits = waits[:0]
			_, err := r.waitOverlaps(q, stream(first))
			require.NoError(rt, err)
			before := map[int]bool{} // the calls complete before this one starts
			for _, j := range waits {
				maps.Copy(before, done[j])
			}
			for j := range k {
				if lastOf[j] == first { // its event was recorded on this call's stream before it
					maps.Copy(before, done[j])
				}
			}
			done[k] = maps.Clone(before)
			done[k][k] = true
			for j := range k {
				if lastOf[j] == last { // ahead of this call's event on its stream
					maps.Copy(done[k], done[j])
				}
			}
			qlo, qhi := q.span()
			for i := range r.flight.list.Len() {
				f := r.flight.list.At(i)
				if f.hi > qlo && qhi > f.lo {
					j := f.ev.(*orderEvent).call
					require.True(rt, before[j], "call %d is not ordered after call %d, in flight on its memory", k, j)
				}
			}
			r.flight.add(inflight{lo: qlo, hi: qhi, ev: &orderEvent{call: k}, last: stream(last), work: q.work})
		}
	})
}
