# fairgo — make targets. `make test` is the test command CI runs.
GO        ?= go
CUDA_ENV  := CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu/stubs
NVCC      ?= nvcc
PTX_SRC   := cuda/kernels/reduce.cu
PTX_OUT   := cuda/kernels/reduce.ptx
TRAIN_SRC := examples/ddp/internal/gpu/train.cu
TRAIN_OUT := examples/ddp/internal/gpu/train.ptx

.PHONY: test vet fuzz demo cuda-deps ptx ptx-check cuda-build gpu-bin clean

test:
	$(GO) vet ./...
	$(GO) test -race -timeout 45m ./...

vet:
	$(GO) vet ./...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzLayout -fuzztime 60s ./staging

demo:
	$(GO) run ./examples/ddp -machines 2 -devices 4

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

# Builds and vets everything with the cuda tag (tests included), and runs the
# reduce kernels on the CPU against a reference (cuda/kernels/hostcheck.cpp).
cuda-build: cuda-deps
	$(CUDA_ENV) $(GO) build -tags cuda ./...
	$(CUDA_ENV) $(GO) vet -tags cuda ./...
	@if command -v g++ >/dev/null; then \
		g++ -std=c++17 -O1 -w -o /tmp/fairgo-hostcheck cuda/kernels/hostcheck.cpp && /tmp/fairgo-hostcheck; \
	else echo "hostcheck: g++ not found, skipped"; fi

# Everything scripts/gpu.sh runs on the GPU machine: the test binaries of
# the GPU packages and the programs (fairrun, fairbench, allreduce, ddp).
gpu-bin: cuda-deps
	mkdir -p bin
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/cuda.test ./cuda
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/nccl.test ./nccl
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/hier.test ./hier
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/ddpgpu.test ./examples/ddp/internal/gpu
	$(CUDA_ENV) $(GO) build -tags cuda -o bin/ ./cmd/... ./examples/... ./bench/cmd/...

clean:
	rm -rf bin
