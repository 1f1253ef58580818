//go:build cgo

// Command libfairgo is fairgo's C ABI, built as a shared library:
//
//	make libfairgo   # go build -buildmode=c-shared -o lib/libfairgo.so ./cmd/libfairgo
//
// fairgo.h (copied next to the library) is its documented interface. The
// functions here are thin shims: they convert C values, call the handle
// table of package capi inside capi.Guard (no Go panic reaches the
// caller), and report errors as a result code plus per-thread text. The
// default build is the GPU library, which loads the CUDA driver and NCCL
// at run time (it loads and reports FAIRGO_ERR_NO_DEVICE on a host without
// a GPU); the fairgo_sim build tag gives one on the simulated cluster, to
// test callers of the ABI on a host without a GPU (only a world of one
// rank, and no device memory to reduce).
package main

/*
#include <stdlib.h>
#include "fairgo.h"

// Declared const-qualified types, so that the prototypes cgo generates for
// the exported functions match fairgo.h exactly (the generated header
// includes this preamble and fairgo.h: a mismatch fails the build).
typedef const char fg_cchar;
typedef const fairgo_config_t fg_cconfig;

void fg_set_last_error(const char* msg, size_t n);
const char* fg_environ(size_t i);
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"
	"unsafe"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cmd/libfairgo/internal/capi"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/rendezvous"
)

// table holds every handle of the process; backendConfig comes from the
// build's backend file.
var table = capi.NewTable(backendConfig())

// main runs only when the package is built as a program (go build,
// go install ./cmd/...), never in the shared library: it says what this
// is and how to build the library, and exits 2, as a bad command line.
func main() { os.Exit(runAsProgram(os.Stderr)) }

// result runs fn guarded and turns its error into a result code, setting
// the calling thread's error text (not for FAIRGO_NOT_READY).
func result(fn func() error) (code C.int) {
	defer func() {
		if p := recover(); p != nil { // in the error reporting itself
			code = C.int(capi.Internal)
		}
	}()
	err := capi.Guard(fn)
	if err == nil {
		return C.int(capi.OK)
	}
	c := table.Classify(err)
	if c != capi.NotReady {
		setLastError(err.Error())
	}
	return C.int(c)
}

func setLastError(s string) {
	if s == "" {
		s = "fairgo: error without text"
	}
	C.fg_set_last_error((*C.char)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s)))
}

func nilArg(name string) error {
	return &fairgo.ArgError{Arg: name, Value: "NULL", Reason: "must point to where the result goes"}
}

// millis converts milliseconds, saturating instead of overflowing.
func millis(ms C.int64_t) time.Duration {
	v := int64(ms)
	switch {
	case v > math.MaxInt64/int64(time.Millisecond):
		return math.MaxInt64
	case v < math.MinInt64/int64(time.Millisecond):
		return math.MinInt64
	}
	return time.Duration(v) * time.Millisecond
}

// syncEnv makes the Go runtime's copy of the environment, taken when the
// library was loaded, equal to the process's C environment now: a caller
// (Python's os.environ, C's setenv) may have changed it since, and
// everything the library reads (settings, the launch environment, the
// driver and NCCL paths) should see what the caller sees.
func syncEnv() error {
	c := map[string]string{}
	for i := 0; ; i++ {
		p := C.fg_environ(C.size_t(i))
		if p == nil {
			break
		}
		if k, v, ok := strings.Cut(C.GoString(p), "="); ok && k != "" {
			c[k] = v
		}
	}
	var errs []error
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "" {
			if _, ok := c[k]; !ok {
				errs = append(errs, os.Unsetenv(k))
			}
		}
	}
	for k, v := range c {
		if cur, ok := os.LookupEnv(k); !ok || cur != v {
			errs = append(errs, os.Setenv(k, v))
		}
	}
	return errors.Join(errs...)
}

// configV1Size is the size of fairgo_config_t in ABI version 1, which
// ended before algorithm; callers built against it are still served.
const configV1Size = uint32(unsafe.Offsetof(C.fairgo_config_t{}.algorithm))

// hasAlgorithm reports whether a caller's config is large enough to hold
// the algorithm field.
func hasAlgorithm(size C.uint32_t) bool {
	return uint32(size) >= configV1Size+uint32(unsafe.Sizeof(C.fairgo_config_t{}.algorithm))
}

// options reads a fairgo_config_t (NULL: the defaults, then the
// environment's settings).
func options(cfg *C.fg_cconfig) (capi.Options, error) {
	o := capi.DefaultOptions()
	if cfg == nil {
		return o.FromEnv(os.LookupEnv)
	}
	if size := uint32(cfg.struct_size); size < configV1Size {
		return o, &fairgo.ArgError{Arg: "config struct_size", Value: size,
			Reason: fmt.Sprintf(
				"smaller than any fairgo_config_t (%d bytes): call fairgo_config_init first",
				configV1Size,
			)}
	}
	o.Device = int(cfg.device)
	o.InitTimeout = millis(cfg.init_timeout_ms)
	o.OpTimeout = millis(cfg.op_timeout_ms)
	o.SliceBytes = int64(cfg.slice_bytes)
	o.FlatThreshold = int64(cfg.flat_threshold_bytes)
	if hasAlgorithm(cfg.struct_size) {
		o.Algorithm = hier.Algorithm(cfg.algorithm)
	}
	return o, nil
}

// toMillis converts a duration, rounding up (a positive timeout never
// becomes 0, which means off).
func toMillis(d time.Duration) C.int64_t {
	return C.int64_t((d + time.Millisecond - 1) / time.Millisecond)
}

//export fairgo_config_from_env
func fairgo_config_from_env(cfg *C.fairgo_config_t) C.int {
	return result(func() error {
		if cfg == nil {
			return nilArg("cfg")
		}
		if err := syncEnv(); err != nil {
			return err
		}
		o, err := options((*C.fg_cconfig)(cfg))
		if err != nil {
			return err
		}
		if o, err = o.FromEnv(os.LookupEnv); err != nil {
			return err
		}
		cfg.device = C.int32_t(o.Device)
		cfg.init_timeout_ms = toMillis(o.InitTimeout)
		cfg.op_timeout_ms = toMillis(o.OpTimeout)
		cfg.slice_bytes = C.int64_t(o.SliceBytes)
		cfg.flat_threshold_bytes = C.int64_t(o.FlatThreshold)
		if hasAlgorithm(cfg.struct_size) {
			cfg.algorithm = C.int32_t(o.Algorithm)
		} else if o.Algorithm != hier.Auto {
			return &fairgo.ArgError{Arg: "environment variable FAIRGO_ALGORITHM", Value: o.Algorithm,
				Reason: "this caller's fairgo_config_t (ABI version 1) has no algorithm field"}
		}
		return nil
	})
}

//export fairgo_init
func fairgo_init(cfg *C.fg_cconfig, comm *C.fairgo_comm_t) C.int {
	return result(func() error {
		if comm == nil {
			return nilArg("comm")
		}
		if err := syncEnv(); err != nil {
			return err
		}
		o, err := options(cfg)
		if err != nil {
			return err
		}
		id, err := table.Init(o)
		if err != nil {
			return err
		}
		*comm = C.fairgo_comm_t(id)
		return nil
	})
}

//
//export fairgo_init_rank
func fairgo_init_rank(
	rank, worldSize, localRank, localWorldSize C.int,
	storeAddr *C.fg_cchar,
	cfg *C.fg_cconfig,
	comm *C.fairgo_comm_t,
) C.int {
	return result(func() error {
		if comm == nil {
			return nilArg("comm")
		}
		if err := syncEnv(); err != nil {
			return err
		}
		o, err := options(cfg)
		if err != nil {
			return err
		}
		l := rendezvous.Launch{
			Rank:           int(rank),
			WorldSize:      int(worldSize),
			LocalRank:      int(localRank),
			LocalWorldSize: int(localWorldSize),
		}
		if storeAddr != nil {
			l.StoreAddr = C.GoString((*C.char)(unsafe.Pointer(storeAddr)))
		}
		id, err := table.InitRank(l, o)
		if err != nil {
			return err
		}
		*comm = C.fairgo_comm_t(id)
		return nil
	})
}

//export fairgo_comm_info
func fairgo_comm_info(comm C.fairgo_comm_t, info *C.fairgo_comm_info_t) C.int {
	return result(func() error {
		if info == nil {
			return nilArg("info")
		}
		in, err := table.Info(int64(comm))
		if err != nil {
			return err
		}
		*info = C.fairgo_comm_info_t{
			rank: C.int32_t(in.Rank), world_size: C.int32_t(in.WorldSize),
			machines: C.int32_t(in.Machines), devices: C.int32_t(in.Devices),
			machine: C.int32_t(in.Machine), local: C.int32_t(in.Local), device: C.int32_t(in.Device),
		}
		return nil
	})
}

//export fairgo_comm_algorithm
func fairgo_comm_algorithm(comm C.fairgo_comm_t, bytes C.int64_t, algorithm, settled *C.int32_t) C.int {
	return result(func() error {
		a, final, err := table.Algorithm(int64(comm), int64(bytes))
		if err != nil {
			return err
		}
		if algorithm != nil {
			*algorithm = C.int32_t(a)
		}
		if settled != nil {
			*settled = 0
			if final {
				*settled = 1
			}
		}
		return nil
	})
}

//export fairgo_comm_close
func fairgo_comm_close(comm C.fairgo_comm_t) C.int {
	return result(func() error { return table.Close(int64(comm)) })
}

//
//export fairgo_allreduce
func fairgo_allreduce(
	comm C.fairgo_comm_t,
	data unsafe.Pointer,
	count C.int64_t,
	dtype C.fairgo_dtype_t,
	op C.fairgo_op_t,
	stream unsafe.Pointer,
	work *C.fairgo_work_t,
) C.int {
	return allreduce(table.AllReduce, comm, data, count, dtype, op, stream, work)
}

//export fairgo_allreduce_async
func fairgo_allreduce_async(
	comm C.fairgo_comm_t,
	data unsafe.Pointer,
	count C.int64_t,
	dtype C.fairgo_dtype_t,
	op C.fairgo_op_t,
	stream unsafe.Pointer,
	work *C.fairgo_work_t,
) C.int {
	return allreduce(table.AllReduceAsync, comm, data, count, dtype, op, stream, work)
}

// allreduce is fairgo_allreduce and fairgo_allreduce_async, by the table's
// call it is given.
func allreduce(
	call func(int64, uintptr, int64, fairgo.DType, fairgo.Op, uintptr) (int64, error),
	comm C.fairgo_comm_t,
	data unsafe.Pointer,
	count C.int64_t,
	dtype C.fairgo_dtype_t,
	op C.fairgo_op_t,
	stream unsafe.Pointer,
	work *C.fairgo_work_t,
) C.int {
	return result(func() error {
		if work == nil {
			return nilArg("work")
		}
		id, err := call(int64(comm), uintptr(data), int64(count), fairgo.DType(dtype), fairgo.Op(op), uintptr(stream))
		if err != nil {
			return err
		}
		*work = C.fairgo_work_t(id)
		return nil
	})
}

//export fairgo_work_stream_wait
func fairgo_work_stream_wait(work C.fairgo_work_t, stream unsafe.Pointer) C.int {
	return result(func() error { return table.StreamWait(int64(work), uintptr(stream)) })
}

//export fairgo_work_test
func fairgo_work_test(work C.fairgo_work_t, done *C.int) C.int {
	return result(func() error {
		if done == nil {
			return nilArg("done")
		}
		d, err := table.Test(int64(work))
		*done = 0
		if d {
			*done = 1
		}
		return err
	})
}

//export fairgo_work_wait
func fairgo_work_wait(work C.fairgo_work_t, timeoutMs C.int64_t) C.int {
	return result(func() error { return table.Wait(int64(work), millis(timeoutMs)) })
}

//export fairgo_work_free
func fairgo_work_free(work C.fairgo_work_t) C.int {
	return result(func() error { return table.FreeWork(int64(work)) })
}

//export fairgo_store_serve
func fairgo_store_serve(listenAddr *C.fg_cchar, store *C.fairgo_store_t, addr *C.char, addrLen C.size_t) C.int {
	return result(func() error {
		switch {
		case listenAddr == nil:
			return &fairgo.ArgError{Arg: "listen_addr", Value: "NULL", Reason: `want "host:port"`}
		case store == nil:
			return nilArg("store")
		case addr == nil:
			return nilArg("addr")
		}
		id, bound, err := table.ServeStore(C.GoString((*C.char)(unsafe.Pointer(listenAddr))))
		if err != nil {
			return err
		}
		if uint64(len(bound)) >= uint64(addrLen) {
			return errors.Join(&fairgo.ArgError{Arg: "addr_len", Value: uint64(addrLen),
				Reason: fmt.Sprintf("too short for the address %q and its NUL", bound)}, table.CloseStore(id))
		}
		buf := unsafe.Slice((*byte)(unsafe.Pointer(addr)), int(addrLen))
		buf[copy(buf, bound)] = 0
		*store = C.fairgo_store_t(id)
		return nil
	})
}

//export fairgo_store_close
func fairgo_store_close(store C.fairgo_store_t) C.int {
	return result(func() error { return table.CloseStore(int64(store)) })
}
