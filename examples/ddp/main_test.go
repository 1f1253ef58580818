package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemo runs the demo's configuration (fewer steps) and a few other
// grids and types: the loss must fall and the replicas must end identical.
func TestDemo(t *testing.T) {
	tests := []struct {
		name              string
		machines, devices int
		dtype             string
		minBuckets        int
		bucketKB          int64
	}{
		{"demo 2x4 float32", 2, 4, "float32", 4, 0},
		{"2x2 bfloat16", 2, 2, "bfloat16", 4, 0},
		{"3x1 small buckets", 3, 1, "float32", 1, 16},
		{"1x3 one bucket", 1, 3, "float32", 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := defaults()
			o.machines, o.devices, o.dtype = tc.machines, tc.devices, tc.dtype
			o.minBuckets, o.bucketKB = tc.minBuckets, tc.bucketKB
			o.epochs, o.steps = 4, 6
			if testing.Short() || raceEnabled {
				// The race detector makes the matrix products ~10× slower:
				// a smaller model, all of it through the two-level path.
				o.hidden, o.flat = 64, -1
			}
			var out bytes.Buffer
			sum, err := run(context.Background(), o, &out)
			require.NoError(t, err, out.String())
			require.True(t, sum.Identical)
			require.Len(t, sum.Epochs, o.epochs)
			first, last := sum.Epochs[0].Loss, sum.Epochs[len(sum.Epochs)-1].Loss
			require.Less(t, last, first*0.8, "the loss must fall\n%s", out.String())
			require.Contains(t, out.String(), "replicas identical")
			if tc.minBuckets > 1 || tc.bucketKB > 0 {
				require.Greater(t, len(sum.Buckets), 1, "buckets to overlap")
			}
		})
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name   string
		change func(*options)
	}{
		{"unknown dtype", func(o *options) { o.dtype = "float8" }},
		{"integer dtype", func(o *options) { o.dtype = "int32" }},
		{"unknown backend", func(o *options) { o.backend = "tpu" }},
		{"zero bucket", func(o *options) { o.bucketMB = 0 }},
		{"no steps", func(o *options) { o.steps = 0 }},
		{"negative lr", func(o *options) { o.lr = -1 }},
		{"no machines", func(o *options) { o.machines = 0 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := defaults()
			tc.change(&o)
			_, err := run(context.Background(), o, &bytes.Buffer{})
			require.Error(t, err)
		})
	}
}
