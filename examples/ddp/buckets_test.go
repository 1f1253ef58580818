package main

import (
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestAssignBucketsProperty: every parameter is in exactly one bucket;
// buckets come in backward order and tile the vector; no bucket exceeds the
// cap unless it holds a single parameter; a bucket is closed only when the
// next parameter does not fit.
func TestAssignBucketsProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lens := rapid.SliceOfN(rapid.IntRange(1, 5000), 1, 40).Draw(t, "lens")
		elemSize := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(t, "elemSize")
		capBytes := rapid.Int64Range(1, 40000).Draw(t, "cap")
		var params []Param
		off := 0
		for i, n := range lens {
			params = append(params, Param{Name: "p", Layer: i / 2, Offset: off, Len: n})
			off += n
		}
		bs, err := AssignBuckets(params, elemSize, capBytes)
		if err != nil {
			t.Fatalf("AssignBuckets: %v", err)
		}
		seen := make([]int, len(params))
		hi := off // buckets go backwards from the end of the vector
		for i, b := range bs {
			if b.Hi != hi || b.Lo >= b.Hi {
				t.Fatalf("bucket %d is [%d, %d), want it to end at %d", i, b.Lo, b.Hi, hi)
			}
			hi = b.Lo
			n, layer := 0, b.Params[0]/2
			for _, p := range b.Params {
				seen[p]++
				n += params[p].Len
				layer = min(layer, params[p].Layer)
			}
			if n != b.Len() {
				t.Fatalf("bucket %d holds %d elements of parameters but spans %d", i, n, b.Len())
			}
			if layer != b.Layer {
				t.Fatalf("bucket %d: Layer %d, want the lowest layer %d", i, b.Layer, layer)
			}
			if int64(n*elemSize) > capBytes && len(b.Params) > 1 {
				t.Fatalf(
					"bucket %d holds %d bytes in %d parameters, over the cap %d",
					i,
					n*elemSize,
					len(b.Params),
					capBytes,
				)
			}
			if i+1 < len(bs) {
				nextParam := bs[i+1].Params[len(bs[i+1].Params)-1]
				if int64((n+params[nextParam].Len)*elemSize) <= capBytes {
					t.Fatalf("bucket %d was closed although parameter %d still fit", i, nextParam)
				}
			}
		}
		if hi != 0 {
			t.Fatalf("buckets stop at %d, want them to reach 0", hi)
		}
		for p, n := range seen {
			if n != 1 {
				t.Fatalf("parameter %d is in %d buckets", p, n)
			}
		}
	})
}

func TestAssignBuckets(t *testing.T) {
	ps := []Param{
		{Name: "w0", Layer: 0, Offset: 0, Len: 100},
		{Name: "b0", Layer: 0, Offset: 100, Len: 10},
		{Name: "w1", Layer: 1, Offset: 110, Len: 50},
		{Name: "b1", Layer: 1, Offset: 160, Len: 5},
	}
	tests := []struct {
		name    string
		params  []Param
		cap     int64
		want    [][]int // parameter indices per bucket
		wantErr string
	}{
		{"one bucket holds all", ps, 1 << 20, [][]int{{0, 1, 2, 3}}, ""},
		{"filled up to the cap", ps, 4 * 110, [][]int{{1, 2, 3}, {0}}, ""},
		{"an oversized parameter alone", ps, 4 * 60, [][]int{{2, 3}, {1}, {0}}, ""},
		{"every parameter alone", ps, 4, [][]int{{3}, {2}, {1}, {0}}, ""},
		{"no parameters", nil, 100, nil, ""},
		{"zero cap", ps, 0, nil, "must be positive"},
		{
			"a gap between parameters",
			[]Param{{Name: "a", Len: 3}, {Name: "b", Offset: 4, Len: 3}},
			100,
			nil,
			"consecutive",
		},
		{"an empty parameter", []Param{{Name: "a", Len: 0}}, 100, nil, "non-empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bs, err := AssignBuckets(tc.params, 4, tc.cap)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			var got [][]int
			for _, b := range bs {
				got = append(got, b.Params)
			}
			require.Equal(t, tc.want, got)
		})
	}
}
