package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/elem"
	"github.com/fairgo/fairgo/internal/refdata"
)

func TestRunOnSim(t *testing.T) {
	for _, tc := range []flags{
		{backend: "sim", machines: 3, devices: 5, count: 10007, dtype: "bfloat16", op: "avg", seed: 1, iters: 1},
		{backend: "sim", machines: 2, devices: 1, count: 4099, dtype: "int32", op: "max", seed: 2, iters: 2, flat: -1},
		{backend: "sim", machines: 1, devices: 3, count: 7, dtype: "float64", op: "prod", seed: 3, iters: 1},
	} {
		require.NoError(t, run(tc), "%+v", tc)
	}
	require.Error(t, run(flags{backend: "cuda-not-built", machines: 1, devices: 1, dtype: "float32", op: "sum"}))
}

// check accepts the reference and rejects one wrong element.
func TestCheckCatchesAWrongElement(t *testing.T) {
	const world, n = 4, 300
	dt, op := fairgo.Float32, fairgo.Sum
	out := make([]byte, n*dt.Size())
	for i := int64(0); i < n; i++ {
		want, _ := refdata.Expected(dt, op, 9, world, i)
		elem.Set(dt, out, int(i), want)
	}
	_, _, err := check(dt, op, 9, world, out)
	require.NoError(t, err)
	elem.Set(dt, out, 123, elem.Get(dt, out, 123)+1e-3)
	_, _, err = check(dt, op, 9, world, out)
	require.True(t, errors.Is(err, errMismatch), "got %v", err)
}
