package main

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMinimal runs the program and checks what it prints.
func TestMinimal(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stdout := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = stdout }()
	main()
	require.NoError(t, w.Close())
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, "rank 0 average [1.5 1]\nrank 1 average [1.5 1]\nrank 2 average [1.5 1]\nrank 3 average [1.5 1]\n", string(out))
}
