package shm

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

func mapFile(path string, words int, create bool) (*Region, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	defer f.Close() // the mapping holds the file
	size := int64(words) * 8
	if create {
		// Allocated now, not at the first store: a full tmpfs then fails
		// here with ENOSPC rather than killing the process with SIGBUS at
		// a store into the mapping.
		if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
			return nil, errors.Join(fmt.Errorf("shm: allocating %s: %w", path, err), os.Remove(path))
		}
	} else {
		st, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
		if st.Size() != size {
			return nil, fmt.Errorf("%w: %s holds %d bytes, not %d", ErrSize, path, st.Size(), size)
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		err = fmt.Errorf("shm: mapping %s: %w", path, err)
		if create {
			err = errors.Join(err, os.Remove(path))
		}
		return nil, err
	}
	// The mapping is page-aligned, so its words are aligned for atomics.
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), words)
	return &Region{path: path, mem: mem, words: w}, nil
}

// Close unmaps the region; its words must not be used after.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	mem := r.mem
	r.mem, r.words = nil, nil
	if err := syscall.Munmap(mem); err != nil {
		return fmt.Errorf("shm: unmapping %s: %w", r.path, err)
	}
	return nil
}

// Remove unlinks the region's file; the mappings made before stay valid.
func (r *Region) Remove() error {
	if err := os.Remove(r.path); err != nil {
		return fmt.Errorf("shm: %w", err)
	}
	return nil
}
