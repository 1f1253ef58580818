package shm_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/internal/shm"
)

func linuxOnly(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("shared regions are Linux's")
	}
}

func TestTwoMappingsShareTheirWords(t *testing.T) {
	linuxOnly(t)
	path := filepath.Join(t.TempDir(), "region")
	a, err := shm.Create(path, 16)
	require.NoError(t, err)
	defer a.Close()
	b, err := shm.Open(path, 16)
	require.NoError(t, err)
	defer b.Close()
	require.Len(t, a.Words(), 16)
	require.Equal(t, make([]uint64, 16), a.Words(), "a new region is zero")
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	require.Equal(t, int64(16*8), st.Size)
	require.GreaterOrEqual(t, st.Blocks*512, st.Size, "the file's blocks are allocated at its creation")

	// A writer publishes words 1..15 by storing word 0 last; a reader on the
	// other mapping that sees word 0 sees them.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := a.Words()
		for i := 1; i < 16; i++ {
			atomic.StoreUint64(&w[i], uint64(100+i))
		}
		atomic.StoreUint64(&w[0], 1)
	}()
	w := b.Words()
	for atomic.LoadUint64(&w[0]) != 1 {
		runtime.Gosched()
	}
	for i := 1; i < 16; i++ {
		require.Equal(t, uint64(100+i), atomic.LoadUint64(&w[i]), "word %d", i)
	}
	wg.Wait()

	// The file can go once both are mapped: the mappings stay.
	require.NoError(t, a.Remove())
	_, err = os.Stat(path)
	require.ErrorIs(t, err, fs.ErrNotExist)
	atomic.StoreUint64(&a.Words()[3], 7)
	require.Equal(t, uint64(7), atomic.LoadUint64(&b.Words()[3]))
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "a second Close does nothing")
}

func TestCreateRefusesAnExistingFile(t *testing.T) {
	linuxOnly(t)
	path := filepath.Join(t.TempDir(), "region")
	require.NoError(t, os.WriteFile(path, []byte("someone else's"), 0o600))
	_, err := shm.Create(path, 4)
	require.ErrorIs(t, err, fs.ErrExist)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "someone else's", string(got), "the file is left as it was")
}

func TestOpenChecksTheSize(t *testing.T) {
	linuxOnly(t)
	path := filepath.Join(t.TempDir(), "region")
	a, err := shm.Create(path, 8)
	require.NoError(t, err)
	defer a.Close()
	_, err = shm.Open(path, 9)
	require.ErrorIs(t, err, shm.ErrSize)
	_, err = shm.Open(filepath.Join(t.TempDir(), "missing"), 8)
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestRegionsOfNoWordsAreRefused(t *testing.T) {
	for _, words := range []int{0, -1} {
		_, err := shm.Create(filepath.Join(t.TempDir(), "r"), words)
		require.Error(t, err)
		_, err = shm.Open(filepath.Join(t.TempDir(), "r"), words)
		require.Error(t, err)
		require.False(t, errors.Is(err, shm.ErrSize))
	}
}
