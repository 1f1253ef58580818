package hier

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/staging"
)

// reduceFingerprints reduces the ranks' encoded fingerprints as NCCL would:
// a chain of combines (float Avg premultiplied by 1/W, integer Avg a
// truncated sum), or the add stage's ReduceShards when shards is set.
func reduceFingerprints(t *rapid.T, dt fairgo.DType, op fairgo.Op, in [][]byte, shards bool) []byte {
	w := len(in)
	if shards {
		out := make([]byte, len(in[0]))
		require.NoError(t, elem.ReduceShards(dt, op, out, in, w))
		return out
	}
	ins := make([][]byte, w)
	for g := range in {
		ins[g] = slices.Clone(in[g])
		if op == fairgo.Avg && dt.IsFloat() {
			require.NoError(t, elem.PreMulInverse(dt, ins[g], w))
		}
	}
	cop := op
	if op == fairgo.Avg {
		cop = fairgo.Sum
	}
	acc := ins[0]
	for _, x := range ins[1:] {
		require.NoError(t, elem.Combine(dt, cop, acc, x))
	}
	if op == fairgo.Avg && !dt.IsFloat() {
		require.NoError(t, elem.Scale(dt, acc, w))
	}
	return acc
}

// Every rank decides a match exactly when every rank encoded the same call,
// for every element type and operator: a difference in any field is found
// by all ranks, never taken for a match, and named when its field's hash
// differs.
func TestFingerprintFindsEveryDifference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.IntRange(2, 12).Draw(t, "ranks")
		if rapid.Bool().Draw(t, "many ranks") {
			w = rapid.SampledFrom([]int{127, 255}).Draw(t, "ranks")
		}
		dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dtype")
		op := rapid.SampledFrom([]fairgo.Op{fairgo.Sum, fairgo.Avg}).Draw(t, "op")
		if !fingerprintFits(dt, op, w) {
			op = fairgo.Sum // every type fingerprints a sum among 127 ranks
			w = min(w, 127)
		}
		require.True(t, fingerprintFits(dt, op, w))
		seq := rapid.Uint64Range(1, 1<<40).Draw(t, "seq")
		count := rapid.Int64Range(1, 1<<20).Draw(t, "count")
		qs := make([]request, w)
		for g := range qs {
			qs[g] = request{kind: kindAllReduce, op: op, seq: seq, a: fairgo.Tensor{DType: dt, Count: count}}
		}
		field := rapid.SampledFrom([]string{"", "call number", "operator", "count", "acceptance"}).Draw(t, "differs")
		odd := rapid.IntRange(0, w-1).Draw(t, "odd rank")
		q := &qs[odd]
		switch field {
		case "call number":
			q.seq += rapid.Uint64Range(1, 100).Draw(t, "seq delta")
		case "operator":
			q.op = fairgo.Ops[(int(q.op)-1+rapid.IntRange(1, len(fairgo.Ops)-1).Draw(t, "op delta"))%len(fairgo.Ops)]
		case "count":
			q.a.Count += rapid.Int64Range(1, 100).Draw(t, "count delta")
		case "acceptance":
			q.rejected = errors.New("refused")
		}
		in := make([][]byte, w)
		fps := make([]fingerprint, w)
		for g := range qs {
			fps[g] = fingerprintOf(&qs[g])
			in[g] = make([]byte, fpElems*dt.Size())
			fps[g].encode(dt, in[g])
		}
		out := reduceFingerprints(t, dt, op, in, rapid.Bool().Draw(t, "add stage"))
		for g := range qs {
			err := fps[g].decide(&qs[g], dt, w, out)
			if field == "" {
				require.NoError(t, err, "rank %d", g)
				continue
			}
			require.ErrorIs(t, err, fairgo.ErrMismatch, "rank %d missed the %s", g, field)
			var me *MismatchError
			require.ErrorAs(t, err, &me)
			require.Contains(t, []string{field, "shape"}, me.Field, "rank %d", g) // "shape": the field's 8-bit hash collided
			require.Empty(t, me.Low+me.High)
		}
	})
}

// A call's fingerprint names the field that differs, and its hash covers
// every field.
func TestFingerprintNamesTheField(t *testing.T) {
	base := request{kind: kindAllReduce, op: fairgo.Sum, seq: 9, a: fairgo.Tensor{DType: fairgo.Float32, Count: 1000}}
	other := request{kind: kindAllReduce, op: fairgo.Sum, seq: 9, a: fairgo.Tensor{DType: fairgo.Float32, Count: 1001}}
	fa, fb := fingerprintOf(&base), fingerprintOf(&other)
	require.NotEqual(t, fa, fb)
	in := [][]byte{make([]byte, fpElems*4), make([]byte, fpElems*4)}
	fa.encode(fairgo.Float32, in[0])
	fb.encode(fairgo.Float32, in[1])
	out := slices.Clone(in[0])
	require.NoError(t, elem.Combine(fairgo.Float32, fairgo.Sum, out, in[1]))
	err := fa.decide(&base, fairgo.Float32, 2, out)
	var me *MismatchError
	require.ErrorAs(t, err, &me)
	require.Equal(t, "count", me.Field)
	require.Equal(t, "1000", me.This)
	require.Contains(t, err.Error(), "fingerprint")
	// Garbage (a collective whose sizes differed) is never a match.
	junk := make([]byte, fpElems*4)
	for i := range fpElems {
		elem.Set(fairgo.Float32, junk, i, 0.5)
	}
	require.ErrorIs(t, fa.decide(&base, fairgo.Float32, 2, junk), fairgo.ErrMismatch)
}

// The fingerprint's 1 and its zero test agree with the element codecs for
// every type: 1, 0, -0 (zero), NaN (not zero), and arbitrary values; an
// element stored is the element loaded, its neighbours untouched.
func TestFingerprintElements(t *testing.T) {
	for _, dt := range fairgo.DTypes {
		l := layoutOf(dt)
		want := make([]byte, dt.Size())
		elem.Set(dt, want, 0, 1)
		one := make([]byte, dt.Size())
		l.store(one, 0, l.one)
		require.Equal(t, want, one, "%s", dt)
		vals := []float64{0, 1, -1, 3, 0.5}
		if dt.IsFloat() {
			vals = append(vals, math.Copysign(0, -1), math.NaN(), math.Inf(1))
		}
		for _, v := range vals {
			b := make([]byte, 3*dt.Size())
			elem.Set(dt, b, 1, v)
			require.Equal(t, elem.Get(dt, b, 1) == 0, l.isZero(b, 1), "%s %v", dt, v)
			require.True(t, l.isZero(b, 0))
			require.True(t, l.isZero(b, 2))
			x := l.load(b, 1)
			c := make([]byte, len(b))
			l.store(c, 1, x)
			require.Equal(t, b, c, "%s %v", dt, v)
		}
	}
}

// BenchmarkFingerprint: the host's work on a fingerprinted call's way, a
// float32 sum: hashing the call and encoding its fingerprint before the
// data's launch, deciding the reduced one in the Wait.
func BenchmarkFingerprint(b *testing.B) {
	q := &request{kind: kindAllReduce, op: fairgo.Sum, seq: 12345,
		a: fairgo.Tensor{DType: fairgo.Float32, Count: 16384, Bytes: 65536}}
	buf := make([]byte, fpElems*4)
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			fp := fingerprintOf(q)
			fp.encode(fairgo.Float32, buf)
			encodeRefuser(fairgo.Float32, fairgo.Sum, -1, buf)
		}
	})
	fp := fingerprintOf(q)
	fp.encode(fairgo.Float32, buf)
	encodeRefuser(fairgo.Float32, fairgo.Sum, -1, buf)
	b.Run("decide", func(b *testing.B) {
		for b.Loop() {
			if err := fp.decide(q, fairgo.Float32, 1, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The refusing rank's number rides after the fingerprint: every rank reads
// the rank when one refused, "several" (-1) when ranks with different
// numbers did, and nothing when all accepted, for every element type and
// operator.
func TestFingerprintNamesTheRefusingRank(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dtype")
		w := rapid.IntRange(2, 64).Draw(t, "ranks")
		op := rapid.SampledFrom(fairgo.Ops).Draw(t, "op")
		refusers := rapid.SliceOfNDistinct(rapid.IntRange(0, w-1), 0, 3, rapid.ID[int]).Draw(t, "refusers")
		base := request{kind: kindAllReduce, op: op, seq: 3, a: fairgo.Tensor{DType: dt, Count: 100}}
		fp := fingerprintOf(&base)
		in := make([][]byte, w)
		for g := range in {
			in[g] = make([]byte, fpElems*dt.Size())
			fp.encode(dt, in[g])
			rank := -1
			if slices.Contains(refusers, g) {
				rank = g
			}
			encodeRefuser(dt, op, rank, in[g])
		}
		out := reduceFingerprints(t, dt, op, in, rapid.Bool().Draw(t, "add stage"))
		rank, ok := refuserOf(dt, op, out)
		switch len(refusers) {
		case 0:
			require.False(t, ok)
		case 1:
			require.True(t, ok)
			require.Equal(t, refusers[0], rank)
		default:
			require.True(t, ok)
			require.Equal(t, -1, rank)
		}
	})
}

// A rank whose collective ran misaligned with a peer's (the ranks disagreed
// on the count or the element type) reduces the peer's data where the
// peer's fingerprint should be. Whatever that data is (zeros, ones, any
// values, or the peer's own fingerprint shifted by the difference), the
// rank never decides a match: nonzero data marks both elements of a pair,
// and zeros leave the presence element short of every rank's 1.
func TestFingerprintOfAMissingPeerIsNeverAMatch(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := rapid.IntRange(2, 12).Draw(t, "ranks")
		dt := rapid.SampledFrom(fairgo.DTypes).Draw(t, "dtype")
		op := rapid.SampledFrom([]fairgo.Op{fairgo.Sum, fairgo.Avg}).Draw(t, "op")
		if !fingerprintFits(dt, op, w) {
			op = fairgo.Sum
		}
		q := request{kind: kindAllReduce, op: op, seq: rapid.Uint64Range(1, 1<<40).Draw(t, "seq"),
			a: fairgo.Tensor{DType: dt, Count: rapid.Int64Range(1, 1<<20).Draw(t, "count")}}
		fp := fingerprintOf(&q)
		in := encodedBy(dt, fp, w)
		for g := range in {
			encodeRefuser(dt, op, -1, in[g])
		}
		odd := rapid.IntRange(0, w-1).Draw(t, "misaligned peer")
		peer := in[odd]
		data := rapid.SampledFrom([]string{"zeros", "ones", "values", "shifted"}).Draw(t, "in its place")
		switch data {
		case "zeros":
			clear(peer)
		case "ones":
			for i := range fpElems {
				elem.Set(dt, peer, i, 1)
			}
		case "values":
			for i := range fpElems {
				elem.Set(dt, peer, i, float64(rapid.IntRange(-3, 100).Draw(t, "value")))
			}
		case "shifted": // its fingerprint k elements later, zeros before
			k := rapid.IntRange(1, fpElems-1).Draw(t, "shift")
			es := dt.Size()
			copy(peer[k*es:], slices.Clone(peer[:(fpElems-k)*es]))
			clear(peer[:k*es])
		}
		out := reduceFingerprints(t, dt, op, in, rapid.Bool().Draw(t, "add stage"))
		for g := range in {
			if g == odd {
				continue
			}
			require.ErrorIs(t, fp.decide(&q, dt, w, out), fairgo.ErrMismatch, "rank %d saw a match", g)
		}
	})
}

// A fingerprint whose pairs and presence agree but whose refusing rank's
// pairs carry a mark, in a call this rank accepted (so every rank did,
// since the acceptance is in the pairs), holds a peer's fingerprint out of
// place: a mismatch on the size, never a match.
func TestFingerprintMarkedRefuserOfAnAcceptedCall(t *testing.T) {
	q := request{kind: kindAllReduce, op: fairgo.Sum, seq: 5, a: fairgo.Tensor{DType: fairgo.Float32, Count: 10}}
	fp := fingerprintOf(&q)
	in := [][]byte{make([]byte, fpElems*4), make([]byte, fpElems*4)}
	for g := range in {
		fp.encode(fairgo.Float32, in[g])
		encodeRefuser(fairgo.Float32, fairgo.Sum, -1, in[g])
	}
	out := slices.Clone(in[0])
	require.NoError(t, elem.Combine(fairgo.Float32, fairgo.Sum, out, in[1]))
	require.NoError(t, fp.decide(&q, fairgo.Float32, 2, out))
	elem.Set(fairgo.Float32, out, pairAt(fpBits+3), 1)
	var me *MismatchError
	require.ErrorAs(t, fp.decide(&q, fairgo.Float32, 2, out), &me)
	require.Equal(t, "size", me.Field)
	require.Equal(t, "40 bytes", me.This)
}

// A fingerprinted copy holds the data and the fingerprint, ends within one
// alignment unit of them, fits its staging buffer, and a pipelined route
// cuts it into one slice with no tail: no padding slot, no second part.
func TestStagedCountCutsWithoutTail(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		es := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "elemSize")
		world := rapid.IntRange(1, 4096).Draw(t, "world")
		limit := rapid.Int64Range(int64(es), 64<<20).Draw(t, "limit")
		count := rapid.Int64Range(1, limit/int64(es)).Draw(t, "count")
		c := stagedCount(count, es, world)
		unit := int64(world) * max(1, staging.Align/int64(es))
		require.GreaterOrEqual(t, c, count+int64(fpElems))
		require.Less(t, c-(count+int64(fpElems)), unit)
		require.Zero(t, c%unit)
		room := stageRoom(limit, world)
		require.LessOrEqual(t, c*int64(es), room)
		require.Zero(t, room%stageAlign)
		var cuts []staging.Slice
		for sl := range staging.Slices(c, es, world, c*int64(es)) {
			cuts = append(cuts, sl)
		}
		require.Len(t, cuts, 1)
		require.Zero(t, cuts[0].Tail)
		require.Zero(t, cuts[0].PadShard)
		require.Equal(t, c, int64(world)*cuts[0].Shard)
	})
}

// A float average among more ranks than fingerprintFits allows for it is
// still fingerprinted (a sum of that many ones fits), with the separate
// check beside (fingerprintVouches): where every rank made the same call,
// its fingerprint must read as a match, though the presence element's
// rounding may then stray past half a share of 1 (bfloat16 among 27 ranks
// did).
func TestFingerprintOfAnAverageBeyondItsFitMatches(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		dt := rapid.SampledFrom([]fairgo.DType{fairgo.BFloat16, fairgo.Float16, fairgo.Float32}).Draw(t, "dtype")
		w := rapid.IntRange(2, 127).Draw(t, "ranks")
		if dt == fairgo.Float32 {
			w = rapid.IntRange(2040, 2200).Draw(t, "ranks") // around its fit, 2048
		}
		require.True(t, fingerprintFits(dt, fairgo.Sum, w))
		q := request{kind: kindAllReduce, op: fairgo.Avg, seq: rapid.Uint64Range(1, 1<<40).Draw(t, "seq"),
			a: fairgo.Tensor{DType: dt, Count: rapid.Int64Range(1, 1<<20).Draw(t, "count")}}
		fp := fingerprintOf(&q)
		out := reduceFingerprints(t, dt, fairgo.Avg, encodedBy(dt, fp, w), rapid.Bool().Draw(t, "add stage"))
		require.NoError(t, fp.decide(&q, dt, w, out))
	})
}

// encodedBy is fp encoded in dt by each of w ranks.
func encodedBy(dt fairgo.DType, fp fingerprint, w int) [][]byte {
	in := make([][]byte, w)
	for g := range in {
		in[g] = make([]byte, fpElems*dt.Size())
		fp.encode(dt, in[g])
	}
	return in
}
