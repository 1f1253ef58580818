package hier

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// drawRequest is a request of a random allreduce shape; the fields drawn
// from small ranges, so that ranks often agree.
func drawRequest(t *rapid.T, label string) *request {
	q := &request{
		kind: kindAllReduce,
		a:    fairgo.Tensor{Count: rapid.Int64Range(1, 3).Draw(t, label+" count"), DType: rapid.SampledFrom([]fairgo.DType{fairgo.Float32, fairgo.Int32}).Draw(t, label+" dtype")},
		op:   rapid.SampledFrom([]fairgo.Op{fairgo.Sum, fairgo.Max}).Draw(t, label+" op"),
		seq:  rapid.Uint64Range(1, 2).Draw(t, label+" seq"),
	}
	if rapid.IntRange(0, 3).Draw(t, label+" refused") == 0 {
		q.rejected = errors.New("refused")
	}
	return q
}

// fpReduce fills every rank's slot as NCCL leaves it after the image's Max
// and the sums' Sum over the ranks' slots.
func fpReduce(slots [][]byte) {
	for w := range imageWords {
		hi := int64(binary.LittleEndian.Uint64(slots[0][8*w:]))
		for _, s := range slots[1:] {
			hi = max(hi, int64(binary.LittleEndian.Uint64(s[8*w:])))
		}
		for _, s := range slots {
			binary.LittleEndian.PutUint64(s[8*w:], uint64(hi))
		}
	}
	for w := imageWords; w < fpWords; w++ {
		var sum uint64
		for _, s := range slots {
			sum += binary.LittleEndian.Uint64(s[8*w:])
		}
		for _, s := range slots {
			binary.LittleEndian.PutUint64(s[8*w:], sum)
		}
	}
}

// fpEncode writes q's fingerprint into a slot, as enqueue does.
func fpEncode(q *request) ([]byte, *fpCall) {
	b := make([]byte, fpBytes)
	image(b[:8*imageWords]).put(q)
	own := sumsOf(q)
	for i, v := range own {
		binary.LittleEndian.PutUint64(b[8*(imageWords+i):], uint64(v))
	}
	return b, &fpCall{slot: &fpSlot{host: b}, own: own}
}

// Every rank decides a match exactly when every rank made the same call: a
// difference in any field is found by all ranks and never taken for a
// match.
func TestFingerprintFindsEveryDifference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.IntRange(2, 9).Draw(t, "ranks")
		qs := make([]*request, w)
		slots := make([][]byte, w)
		calls := make([]*fpCall, w)
		same := true
		for g := range w {
			qs[g] = drawRequest(t, "rank")
			slots[g], calls[g] = fpEncode(qs[g])
			calls[g].w = int64(w)
			same = same && shapeOf(qs[g]) == shapeOf(qs[0]) && qs[g].seq == qs[0].seq
		}
		fpReduce(slots)
		for g := range w {
			err := calls[g].decide(qs[g])
			if same {
				require.NoError(t, err, "rank %d", g)
				continue
			}
			var me *MismatchError
			require.ErrorAs(t, err, &me, "rank %d", g)
			require.ErrorIs(t, err, fairgo.ErrMismatch)
			require.NotEmpty(t, me.Low+me.High, "an aligned difference is named with the ranks' range")
		}
	})
}

// A launch whose steps did not line up leaves foreign bytes in the check
// (another task's data): the sums never pass them for a match, not even
// bytes the image's Max would take (everything negative, or this rank's own
// image with any other words).
func TestFingerprintRefusesForeignBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.IntRange(2, 9).Draw(t, "ranks")
		q := drawRequest(t, "call")
		mine, call := fpEncode(q)
		call.w = int64(w)
		slots := [][]byte{mine}
		for range w - 1 {
			foreign := make([]byte, fpBytes)
			switch rapid.IntRange(0, 2).Draw(t, "foreign") {
			case 0: // negative words: below every field, a match to Max
				for i := range fpWords {
					binary.LittleEndian.PutUint64(foreign[8*i:], uint64(-rapid.Int64Range(1, 1<<62).Draw(t, "negative")))
				}
			case 1: // this rank's image, any sums
				copy(foreign, mine[:8*imageWords])
				for i := imageWords; i < fpWords; i++ {
					binary.LittleEndian.PutUint64(foreign[8*i:], rapid.Uint64().Draw(t, "sum word"))
				}
			default: // zeros
			}
			slots = append(slots, foreign)
		}
		fpReduce(slots)
		require.ErrorIs(t, call.decide(q), fairgo.ErrMismatch)
	})
}

// The sums' words differ for every field, so a difference in any one
// changes them.
func TestSumsCoverEveryField(t *testing.T) {
	q := &request{kind: kindAllReduce, a: fairgo.Tensor{Count: 10, DType: fairgo.Float32}, op: fairgo.Sum, seq: 3}
	base := sumsOf(q)
	for _, change := range []func(*request){
		func(q *request) { q.seq++ },
		func(q *request) { q.kind = kindBroadcast },
		func(q *request) { q.a.DType = fairgo.Int32 },
		func(q *request) { q.op = fairgo.Max },
		func(q *request) { q.a.Count++ },
		func(q *request) { q.rejected = errors.New("refused") },
	} {
		c := *q
		change(&c)
		require.NotEqual(t, base, sumsOf(&c))
	}
}
