# fairgo — make targets. `make test` is the test command CI runs.
GO        ?= go
PYTHON    ?= python3
STRIP     := -ldflags="-s -w"
NVCC      ?= nvcc
PTX_SRC   := cuda/kernels/reduce.cu
PTX_OUT   := cuda/kernels/reduce.ptx
TRAIN_SRC := examples/ddp/internal/gpu/train.cu
TRAIN_OUT := examples/ddp/internal/gpu/train.ptx

.PHONY: bench-smoke test vet fmt-check fuzz demo cuda-deps ptx ptx-check hostcheck gpu-bin clean cgo-check libfairgo libfairgo-sim capi-test python-test wheel

# go test -race through internal/testprogress, which prints each package as
# it ends and each top-level test that took 2 s or more; hier, the longest,
# is listed first so that it starts first.
test:
	$(GO) vet ./...
	$(GO) run ./internal/testprogress $(GO) -race -timeout 45m ./hier ./...

vet:
	$(GO) vet ./...

# bench-smoke runs every benchmark once (those of the GPU skip without
# one): a benchmark that no longer runs fails CI, not the next measurement.
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

# fmt-check fails listing the Go files gofmt would change.
fmt-check:
	@files=$$(gofmt -l .); if [ -n "$$files" ]; then echo "gofmt would change:"; echo "$$files"; exit 1; fi

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzLayout -fuzztime 60s ./staging

demo:
	$(GO) run ./examples/ddp -machines 2 -devices 4

# Debian's CUDA 11.8 headers and nvcc, for `make ptx` and the PTX check
# (building fairgo needs neither).
cuda-deps:
	bash .ci/cuda-deps.sh

# The library's reduce kernels, and the training kernels of examples/ddp.
ptx: $(PTX_SRC) $(TRAIN_SRC)
	$(NVCC) -ptx -arch=compute_70 -O3 -o $(PTX_OUT) $(PTX_SRC)
	$(NVCC) -ptx -arch=compute_70 -O3 -o $(TRAIN_OUT) $(TRAIN_SRC)

# Regenerates the PTX into a temporary file and fails if the committed one differs.
ptx-check:
	@if command -v $(NVCC) >/dev/null; then \
		$(NVCC) -ptx -arch=compute_70 -O3 -o /tmp/fairgo-reduce.ptx $(PTX_SRC) && \
		grep -v '^//' /tmp/fairgo-reduce.ptx >/tmp/fairgo-reduce.new && grep -v '^//' $(PTX_OUT) >/tmp/fairgo-reduce.old && \
		diff -q /tmp/fairgo-reduce.old /tmp/fairgo-reduce.new && \
		$(NVCC) -ptx -arch=compute_70 -O3 -o /tmp/fairgo-train.ptx $(TRAIN_SRC) && \
		grep -v '^//' /tmp/fairgo-train.ptx >/tmp/fairgo-train.new && grep -v '^//' $(TRAIN_OUT) >/tmp/fairgo-train.old && \
		diff -q /tmp/fairgo-train.old /tmp/fairgo-train.new && echo "ptx: committed PTX matches"; \
	else echo "ptx: nvcc not found, skipped"; fi

# Runs the reduce kernels of cuda/kernels/reduce.cu on the CPU against a
# reference (cuda/kernels/hostcheck.cpp).
hostcheck:
	@if command -v g++ >/dev/null; then \
		g++ -std=c++17 -O1 -w -o /tmp/fairgo-hostcheck cuda/kernels/hostcheck.cpp && /tmp/fairgo-hostcheck; \
	else echo "hostcheck: g++ not found, skipped"; fi

# Everything scripts/gpu.sh runs on the GPU machine: the test binaries of
# the GPU packages, the programs (fairrun, fairbench, allreduce, ddp; not
# the test workers under internal/ nor examples/minimal), libfairgo (lib/)
# and its wheel (dist/). The GPU backend is in every build (it loads the
# CUDA driver at run time), so these are plain builds. Stripped, to keep
# what travels small (bin/ and lib/libfairgo.so: about 64 MiB).
gpu-bin: libfairgo wheel
	mkdir -p bin
	$(GO) test -c $(STRIP) -o bin/cuda.test ./cuda
	$(GO) test -c $(STRIP) -o bin/nccl.test ./nccl
	$(GO) test -c $(STRIP) -o bin/hier.test ./hier
	$(GO) test -c $(STRIP) -o bin/ddpgpu.test ./examples/ddp/internal/gpu
	$(GO) build $(STRIP) -o bin/ $$($(GO) list ./cmd/... ./examples/... ./bench/cmd/... | grep -Ev '/cmd/libfairgo$$|/internal/|/examples/minimal$$')

# libfairgo.so for glibc 2.28 and older whatever glibc builds it, so that
# its wheel is manylinux_2_28 or older (RHEL 8, Ubuntu 20.04): every C file
# of the build, runtime/cgo's and package net's included, gets
# cmd/libfairgo/glibc_compat.h, which binds the pthread, dl and resolver
# functions to their pre-2.34 symbol versions (Go code's own references to
# dlopen and co.: cmd/libfairgo/glibc_compat_linux_amd64.S), and the
# libraries those versions live in before glibc 2.34 are linked even where
# nothing of theirs is used (on glibc 2.34 and newer they are empty). The
# header's checksum is among the flags because go's build cache does not
# see files that -include names. On a host without glibc, a plain build.
# python/tests/test_wheel.py checks the result (make python-test).
GLIBC_COMPAT_H := $(CURDIR)/cmd/libfairgo/glibc_compat.h
ifneq ($(shell ldd --version 2>&1 | grep -ciE 'glibc|gnu libc'),0)
GLIBC_COMPAT := CGO_CFLAGS="$${CGO_CFLAGS:--O2 -g} -include $(GLIBC_COMPAT_H) -DFAIRGO_GLIBC_COMPAT=$(firstword $(shell cksum < $(GLIBC_COMPAT_H)))" \
	CGO_LDFLAGS="$${CGO_LDFLAGS:--O2 -g} -Wl,--push-state,--no-as-needed -l:libpthread.so.0 -l:libdl.so.2 -l:libresolv.so.2 -Wl,--pop-state"
endif

# libfairgo.so, fairgo's C ABI (cmd/libfairgo/fairgo.h), for the PyTorch DDP
# comm hook (python/fairgo_torch) and other languages: lib/libfairgo.so and
# lib/fairgo.h. It loads anywhere; running collectives needs a GPU driver
# and NCCL (see the README).
libfairgo: cgo-check
	mkdir -p lib
	CGO_ENABLED=1 $(GLIBC_COMPAT) $(GO) build -tags fairgo_nonvml -ldflags="-s -w" -buildmode=c-shared -o lib/libfairgo.so ./cmd/libfairgo
	rm -f lib/libfairgo.h # cgo's generated header; fairgo.h is the documented one
	cp cmd/libfairgo/fairgo.h lib/fairgo.h

# A C ABI is cgo's: libfairgo and the tests that load it need a C compiler
# whatever CGO_ENABLED says for the rest of the build.
cgo-check:
	@command -v $${CC:-cc} >/dev/null 2>&1 || { echo "make: libfairgo.so (the C ABI, the wheel) needs cgo and a C compiler ($${CC:-cc} not found); the Go packages and programs build without one (CGO_ENABLED=0 go build ./...)" >&2; exit 1; }

# The fairgo_torch wheel with lib/libfairgo.so inside, into dist/
# (python/build_wheel.py: no pip, setuptools or network needed).
wheel: libfairgo
	rm -f dist/fairgo_torch-*.whl
	$(PYTHON) python/build_wheel.py --lib lib/libfairgo.so --out dist

# The same ABI on the simulated cluster (one rank, no GPU), for testing
# callers of the library on a host without a GPU.
libfairgo-sim: cgo-check
	mkdir -p lib
	CGO_ENABLED=1 $(GLIBC_COMPAT) $(GO) build -tags fairgo_sim,fairgo_nonvml -buildmode=c-shared -o lib/libfairgo_sim.so ./cmd/libfairgo
	rm -f lib/libfairgo_sim.h

# A C and a C++ caller of fairgo.h, run against libfairgo_sim.so (two ranks
# on threads of their own among its cases).
capi-test: libfairgo-sim
	gcc -std=c99 -Wall -Wextra -Werror -pthread -Icmd/libfairgo -o lib/abi_smoke cmd/libfairgo/testdata/abi_smoke.c -Llib -lfairgo_sim -Wl,-rpath,'$$ORIGIN'
	lib/abi_smoke
	g++ -x c++ -std=c++17 -Wall -Wextra -Werror -pthread -Icmd/libfairgo -o lib/abi_smoke_cpp cmd/libfairgo/testdata/abi_smoke.c -Llib -lfairgo_sim -Wl,-rpath,'$$ORIGIN'
	lib/abi_smoke_cpp

# The Python package's unit tests that need neither PyTorch nor a GPU (the
# ctypes layer runs against libfairgo_sim.so; the wheel is installed into a
# fresh virtual environment).
python-test: libfairgo-sim wheel
	cd python && FAIRGO_LIB=$(CURDIR)/lib/libfairgo_sim.so $(PYTHON) -m unittest discover -s tests -v
	cd examples/ddp_torch && $(PYTHON) -m unittest discover -s . -v

clean:
	rm -rf bin dist
