//go:build cuda

package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/streams"
)

func init() { RegisterBackend("cuda", openCUDA) }

// underLauncher reports whether this process is one worker of a launched
// job of several processes (WORLD_SIZE > 1 from torchrun, fairrun, Slurm or
// Open MPI).
func underLauncher() bool {
	l, err := rendezvous.FromEnv()
	return err == nil && l.WorldSize > 1
}

// openCUDA opens the GPU testbed: one rank per process through setup.New
// under a launcher, else every rank in this process over the first
// Machines × Devices GPUs (cuda.NewLocalRanks).
func openCUDA(ctx context.Context, s TestbedSpec) (Testbed, error) {
	if underLauncher() {
		return openCUDAProcess(ctx)
	}
	return openCUDALocal(s)
}

func ncclVersion() string {
	lib, err := nccl.Load()
	if err != nil {
		return "unavailable: " + err.Error()
	}
	defer lib.Close()
	M, m, p := nccl.SplitVersion(lib.Version())
	return fmt.Sprintf("%d.%d.%d", M, m, p)
}

// cudaRank is one rank on a GPU, with the benchmark's stream and two timing
// events.
type cudaRank struct {
	rank       hier.Rank
	dev        *cuda.Device
	world      int
	stream     *cuda.Stream
	start, end *cuda.Event
	allocs     []fairgo.Tensor
}

func newCUDARank(rk hier.Rank) (*cudaRank, error) {
	dev, ok := rk.Device.(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("bench: rank device is a %T, not a *cuda.Device", rk.Device)
	}
	r := &cudaRank{rank: rk, dev: dev, world: rk.Comms.World.Rank()}
	var err error
	if r.stream, err = dev.CreateStream(); err != nil {
		return nil, err
	}
	if r.start, err = dev.CreateEvent(true); err != nil {
		return nil, err
	}
	if r.end, err = dev.CreateEvent(true); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *cudaRank) Hier() hier.Rank        { return r.rank }
func (r *cudaRank) WorldRank() int         { return r.world }
func (r *cudaRank) Stream() streams.Stream { return r.stream }
func (r *cudaRank) Alloc(count int64, dt fairgo.DType) (fairgo.Tensor, error) {
	t, err := r.dev.AllocTensor(count, dt)
	if err == nil {
		r.allocs = append(r.allocs, t)
	}
	return t, err
}
func (r *cudaRank) Upload(t fairgo.Tensor, data []byte) error { return r.dev.Upload(t.Ptr, data) }
func (r *cudaRank) Download(t fairgo.Tensor) ([]byte, error) {
	out := make([]byte, t.ByteLen())
	return out, r.dev.Download(out, t.Ptr)
}

// Time records a timing event on the stream, runs fn, records another and
// waits for it: the GPU time of the work fn enqueued.
func (r *cudaRank) Time(ctx context.Context, fn func() error) (time.Duration, error) {
	if err := r.start.Record(r.stream); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := r.end.Record(r.stream); err != nil {
		return 0, err
	}
	if err := r.end.Wait(ctx); err != nil {
		return 0, err
	}
	return cuda.Elapsed(r.start, r.end)
}

func (r *cudaRank) release() error {
	var errs []error
	for _, t := range r.allocs {
		errs = append(errs, r.dev.Free(t.Ptr))
	}
	r.allocs = nil
	for _, c := range []interface{ Close() error }{r.start, r.end, r.stream} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

func gpuInfo(backend string, ranks []*cudaRank, M, D, procs int) Info {
	host, _ := os.Hostname()
	info := Info{Backend: backend, Timing: "CUDA events on the benchmark stream", NCCLVersion: ncclVersion(),
		Machines: M, Devices: D, Processes: procs, Host: host}
	for _, r := range ranks {
		info.GPUs = append(info.GPUs, r.dev.String())
	}
	return info
}

// localBed drives every rank from this process (cuda.NewLocalRanks).
type localBed struct {
	devs  []*cuda.Device
	hr    []hier.Rank
	ranks []*cudaRank
	info  Info
}

func openCUDALocal(s TestbedSpec) (Testbed, error) {
	n, err := cuda.Count()
	if err != nil {
		return nil, fmt.Errorf("bench: counting GPUs: %w", err)
	}
	want := s.Machines * s.Devices
	if want < 1 || want > n {
		return nil, &fairgo.ArgError{Arg: "-machines × -devices", Value: want, Reason: fmt.Sprintf("one process drives one rank per GPU, and %d GPUs are visible (run more ranks under fairrun)", n)}
	}
	b := &localBed{}
	fail := func(err error) (Testbed, error) { return nil, errors.Join(err, b.Close()) }
	for i := 0; i < want; i++ {
		d, err := cuda.Open(i)
		if err != nil {
			return fail(err)
		}
		b.devs = append(b.devs, d)
	}
	if b.hr, err = cuda.NewLocalRanks(b.devs, s.Machines, s.Devices); err != nil {
		return fail(err)
	}
	for _, rk := range b.hr {
		r, err := newCUDARank(rk)
		if r != nil {
			b.ranks = append(b.ranks, r)
		}
		if err != nil {
			return fail(err)
		}
	}
	b.info = gpuInfo("cuda", b.ranks, s.Machines, s.Devices, 1)
	return b, nil
}

func (b *localBed) Info() Info { return b.info }
func (b *localBed) Ranks() []Rank {
	out := make([]Rank, len(b.ranks))
	for i, r := range b.ranks {
		out[i] = r
	}
	return out
}
func (b *localBed) Barrier(context.Context) error { return nil }
func (b *localBed) Root() bool                    { return true }
func (b *localBed) Gather(_ context.Context, _ string, blob []byte) ([][]byte, error) {
	return [][]byte{blob}, nil
}
func (b *localBed) Close() error {
	var errs []error
	for _, r := range b.ranks {
		errs = append(errs, r.release())
	}
	if b.hr != nil {
		errs = append(errs, cuda.CloseRanks(b.hr))
	}
	for _, d := range b.devs {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}

// processBed is one rank per process under a launcher: setup.New with
// cuda.Backend builds the device and communicators, and the launcher's store
// carries barriers and results.
type processBed struct {
	launch  rendezvous.Launch
	client  *rendezvous.Client
	store   rendezvous.Store
	red     *hier.Reducer // owns the device and communicators
	rank    *cudaRank
	info    Info
	barrier int
}

func openCUDAProcess(ctx context.Context) (Testbed, error) {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return nil, err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cl, err := rendezvous.Dial(setupCtx, l.StoreAddr)
	if err != nil {
		return nil, fmt.Errorf("bench: dialing the launcher's store %s: %w", l.StoreAddr, err)
	}
	red, err := setup.New(setupCtx, cl, cuda.Backend{}, setup.WithStorePrefix("fairbench-setup"))
	if err != nil {
		_ = cl.Close()
		return nil, err
	}
	b := &processBed{launch: l, client: cl, store: rendezvous.WithPrefix(cl, "fairbench"), red: red}
	rk := hier.Rank{Grid: red.Grid(), Device: red.Device(), Comms: red.Comms()}
	if b.rank, err = newCUDARank(rk); err != nil {
		return nil, errors.Join(err, b.Close())
	}
	g := red.Grid()
	b.info = gpuInfo("cuda-mp", []*cudaRank{b.rank}, g.Machines, g.Devices, l.WorldSize)
	b.info.GPUs[0] += fmt.Sprintf(" rank %d (machine %d, local %d)", b.rank.world, g.Machine, g.Local)
	if id := os.Getenv("NCCL_HOSTID"); id != "" {
		b.info.Host += " NCCL_HOSTID=" + id
	}
	return b, nil
}

func (b *processBed) Info() Info    { return b.info }
func (b *processBed) Ranks() []Rank { return []Rank{b.rank} }
func (b *processBed) Root() bool    { return b.launch.Rank == 0 }

func (b *processBed) Barrier(ctx context.Context) error {
	b.barrier++
	key := "barrier/" + strconv.Itoa(b.barrier)
	n, err := b.store.Add(ctx, key, 1)
	if err != nil {
		return fmt.Errorf("bench: barrier: %w", err)
	}
	if n == int64(b.launch.WorldSize) {
		if err := b.store.Set(ctx, key+"/done", nil); err != nil {
			return fmt.Errorf("bench: barrier: %w", err)
		}
	}
	if err := b.store.Wait(ctx, key+"/done"); err != nil {
		return fmt.Errorf("bench: barrier: %w", err)
	}
	return nil
}

func (b *processBed) Gather(ctx context.Context, key string, blob []byte) ([][]byte, error) {
	if err := b.store.Set(ctx, fmt.Sprintf("gather/%s/%d", key, b.launch.Rank), blob); err != nil {
		return nil, fmt.Errorf("bench: gather: %w", err)
	}
	if !b.Root() {
		return nil, nil
	}
	out := make([][]byte, b.launch.WorldSize)
	for p := range out {
		v, err := b.store.Get(ctx, fmt.Sprintf("gather/%s/%d", key, p))
		if err != nil {
			return nil, fmt.Errorf("bench: gather from process %d: %w", p, err)
		}
		out[p] = v
	}
	return out, nil
}

func (b *processBed) Close() error {
	var errs []error
	if b.rank != nil {
		errs = append(errs, b.rank.release())
	}
	if err := b.red.Close(); err != nil && !errors.Is(err, fairgo.ErrClosed) {
		errs = append(errs, err)
	}
	errs = append(errs, b.client.Close())
	return errors.Join(errs...)
}
