# fairgo — make targets. `make test` is the test command CI runs.
GO        ?= go
CUDA_ENV  := CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu/stubs
NVCC      ?= nvcc
PTX_SRC   := cuda/kernels/reduce.cu
PTX_OUT   := cuda/kernels/reduce.ptx

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

ptx: $(PTX_SRC)
	$(NVCC) -ptx -arch=compute_70 -O3 -o $(PTX_OUT) $(PTX_SRC)

# Regenerates the PTX into a temporary file and fails if the committed one differs.
ptx-check:
	@if command -v $(NVCC) >/dev/null; then \
		$(NVCC) -ptx -arch=compute_70 -O3 -o /tmp/fairgo-reduce.ptx $(PTX_SRC) && \
		diff -q <(grep -v '^//' /tmp/fairgo-reduce.ptx) <(grep -v '^//' $(PTX_OUT)) && echo "ptx: committed PTX matches"; \
	else echo "ptx: nvcc not found, skipped"; fi

cuda-build: cuda-deps
	$(CUDA_ENV) $(GO) build -tags cuda ./...
	$(CUDA_ENV) $(GO) vet -tags cuda ./...

gpu-bin: cuda-deps
	mkdir -p bin
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/cuda.test ./cuda
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/nccl.test ./nccl
	$(CUDA_ENV) $(GO) test -c -tags cuda -o bin/hier.test ./hier
	$(CUDA_ENV) $(GO) build -tags cuda -o bin/ ./cmd/... ./examples/... ./bench/cmd/...

clean:
	rm -rf bin
