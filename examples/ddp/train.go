package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/internal/elem"
)

// Memory is what the trainer needs of its rank's device besides the
// Reducer: tensors, and synchronous copies between host and device.
// *sim.Device and *cuda.Device implement it.
type Memory interface {
	AllocTensor(count int64, dt fairgo.DType) (fairgo.Tensor, error)
	Free(ptr uintptr) error
	Upload(dst uintptr, src []byte) error
	Download(dst []byte, src uintptr) error
}

// Config is one training run. Every rank must use the same Config.
type Config struct {
	Epochs, Steps, Batch int
	Sizes                []int // MLP widths: input, hidden..., classes
	LR, Momentum         float64
	Seed                 uint64
	// DType is the type gradients are communicated in: Float32, or
	// BFloat16 (half the bytes; the optimizer still runs in float32).
	DType       fairgo.DType
	BucketBytes int64
}

func (c Config) validate() error {
	switch {
	case c.Epochs < 1 || c.Steps < 1 || c.Batch < 1:
		return fmt.Errorf("epochs, steps and batch must be positive (got %d, %d, %d)", c.Epochs, c.Steps, c.Batch)
	case len(c.Sizes) < 2:
		return fmt.Errorf("the model needs an input and an output width (got %v)", c.Sizes)
	case c.DType != fairgo.Float32 && c.DType != fairgo.BFloat16:
		return fmt.Errorf("gradients are communicated in float32 or bfloat16, not %v", c.DType)
	case !(c.LR > 0) || c.Momentum < 0 || c.Momentum >= 1:
		return fmt.Errorf("need lr > 0 and momentum in [0, 1) (got %g, %g)", c.LR, c.Momentum)
	case c.BucketBytes <= 0:
		return fmt.Errorf("bucket size %d bytes must be positive", c.BucketBytes)
	}
	return nil
}

// EpochStats are one epoch's numbers, averaged over all ranks (every rank
// gets the same values: they are themselves allreduced).
type EpochStats struct {
	Epoch    int
	Loss     float64 // mean training loss
	Accuracy float64 // fraction of training samples predicted right
	// Compute is the time per step spent outside Wait (forward, backward,
	// copies, optimizer); Comm is the time per step spent in Wait, the
	// communication that the backward pass did not hide.
	Compute, Comm time.Duration
}

// Result is what one rank ends with.
type Result struct {
	Epochs  []EpochStats
	Buckets []Bucket
	// Params are the rank's final parameters as downloaded from its device
	// (float32, little-endian).
	Params []byte
}

// ErrReplicasDiffer reports replicas whose parameters are not bit-identical
// at the end of training.
var ErrReplicasDiffer = errors.New("replicas hold different parameters")

// Train runs data-parallel training on one rank: r is the rank's Reducer
// and mem its device. Every rank of the job calls Train with the same cfg,
// concurrently (one process per GPU, or one goroutine per simulated
// device). onEpoch, if not nil, is called after each epoch.
//
// Each step computes the loss and gradients of this rank's batch on the
// host, and as soon as the backward pass has finished the layers of a
// gradient bucket it uploads the bucket and starts its allreduce (Avg), so
// that the reduction of the last layers overlaps the backward pass of the
// first ones. The optimizer step (SGD with momentum) waits on the Works,
// then updates the parameters and uploads them to the device. At the end
// every rank checks, through an AllGather of hashes, that all replicas hold
// bit-identical parameters.
func Train(ctx context.Context, cfg Config, r *hier.Reducer, mem Memory, onEpoch func(EpochStats)) (*Result, error) {
	t, err := newTrainer(cfg, r, mem)
	if err != nil {
		return nil, err
	}
	if err := t.allocate(); err != nil {
		return nil, err
	}
	if err := t.startFromRank0(ctx); err != nil {
		return nil, err
	}
	t.drawShard()
	res, err := runEpochs(ctx, cfg.Epochs, t.buckets, t.epoch, onEpoch)
	if err != nil {
		return nil, err
	}
	return t.finish(ctx, res)
}

// runEpochs runs epochs 1 to n by epoch, calling onEpoch (if not nil)
// after each, and returns their statistics with the buckets: the loop
// of Train and of its GPU form alike.
func runEpochs(
	ctx context.Context, n int, buckets []Bucket,
	epoch func(context.Context, int) (EpochStats, error), onEpoch func(EpochStats),
) (*Result, error) {
	res := &Result{Buckets: buckets}
	for e := 1; e <= n; e++ {
		es, err := epoch(ctx, e)
		if err != nil {
			return nil, err
		}
		res.Epochs = append(res.Epochs, es)
		if onEpoch != nil {
			onEpoch(es)
		}
	}
	return res, nil
}

// trainer is the state of Train on one rank.
type trainer struct {
	cfg     Config
	r       *hier.Reducer
	mem     Memory
	model   *MLP[float32]
	buckets []Bucket
	rank    int

	// Device memory is freed when training succeeds; after an error a
	// collective may still use it, and the caller tears the device down.
	allocs                  []uintptr
	paramsT, gradsT, statsT fairgo.Tensor
	// host is the staging buffer of copies, pbytes its head holding the
	// parameters.
	host, pbytes []byte

	x        []float32 // this rank's shard of the data, Steps batches
	y        []int
	grad     []float32
	velocity []float32
	ws       Workspace[float32]
	works    []*hier.Work
}

// newTrainer checks the configuration and sets up the rank's replica of
// the model and its gradient buckets.
func newTrainer(cfg Config, r *hier.Reducer, mem Memory) (*trainer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rank := r.WorldRank()
	model, err := NewMLP[float32](cfg.Sizes)
	if err != nil {
		return nil, err
	}
	// Each rank initialises its replica from its own seed, as a trainer's
	// processes do; the broadcast below makes rank 0's replica everyone's.
	model.Init(rand.New(rand.NewPCG(cfg.Seed, 0x1417+uint64(rank))))
	buckets, err := AssignBuckets(model.ParamList(), cfg.DType.Size(), cfg.BucketBytes)
	if err != nil {
		return nil, err
	}
	return &trainer{cfg: cfg, r: r, mem: mem, model: model, buckets: buckets, rank: rank}, nil
}

// allocate allocates the device tensors (parameters, gradients,
// statistics) and the host buffer of copies.
func (t *trainer) allocate() error {
	alloc := func(n int64, dt fairgo.DType) (fairgo.Tensor, error) {
		ten, err := t.mem.AllocTensor(n, dt)
		if err == nil {
			t.allocs = append(t.allocs, ten.Ptr)
		}
		return ten, err
	}
	nparams := int64(len(t.model.Params))
	var err error
	if t.paramsT, err = alloc(nparams, fairgo.Float32); err != nil {
		return fmt.Errorf("allocating the parameters: %w", err)
	}
	if t.gradsT, err = alloc(nparams, t.cfg.DType); err != nil {
		return fmt.Errorf("allocating the gradients: %w", err)
	}
	if t.statsT, err = alloc(4, fairgo.Float64); err != nil {
		return fmt.Errorf("allocating the statistics: %w", err)
	}
	maxBucket := 0
	for _, b := range t.buckets {
		maxBucket = max(maxBucket, b.Len())
	}
	t.host = make([]byte, max(nparams*4, int64(maxBucket*t.cfg.DType.Size())))
	t.pbytes = t.host[:nparams*4]
	return nil
}

// startFromRank0 makes rank 0's parameters every replica's.
func (t *trainer) startFromRank0(ctx context.Context) error {
	encode(fairgo.Float32, t.pbytes, t.model.Params)
	if err := t.mem.Upload(t.paramsT.Ptr, t.pbytes); err != nil {
		return fmt.Errorf("uploading the parameters: %w", err)
	}
	if err := t.r.Broadcast(ctx, t.paramsT, 0).Wait(ctx); err != nil {
		return fmt.Errorf("broadcasting rank 0's parameters: %w", err)
	}
	if err := t.mem.Download(t.pbytes, t.paramsT.Ptr); err != nil {
		return fmt.Errorf("downloading the parameters: %w", err)
	}
	decode(fairgo.Float32, t.model.Params, t.pbytes)
	return nil
}

// drawShard draws this rank's shard of the data from its own seed,
// labelled by the teacher every rank shares, and sets up the optimizer's
// state.
func (t *trainer) drawShard() {
	cfg := t.cfg
	in, classes := cfg.Sizes[0], cfg.Sizes[len(cfg.Sizes)-1]
	teacher := NewTeacher(cfg.Seed, in, classes)
	t.x = make([]float32, cfg.Steps*cfg.Batch*in)
	t.y = make([]int, cfg.Steps*cfg.Batch)
	teacher.Sample(rand.New(rand.NewPCG(cfg.Seed^0xda7a, uint64(t.rank))), t.x, t.y)
	nparams := len(t.model.Params)
	t.grad = make([]float32, nparams)
	t.velocity = make([]float32, nparams)
	t.works = make([]*hier.Work, len(t.buckets))
}

// epoch runs the steps of one epoch and returns its numbers, averaged
// over the ranks.
func (t *trainer) epoch(ctx context.Context, epoch int) (EpochStats, error) {
	var lossSum float64
	var correct int
	var compute, comm time.Duration
	for step := range t.cfg.Steps {
		start := time.Now()
		loss, ok, waited, err := t.step(ctx, epoch, step)
		if err != nil {
			return EpochStats{}, err
		}
		lossSum += loss
		correct += ok
		comm += waited
		compute += time.Since(start)
	}
	compute -= comm

	// Average the epoch's numbers over the ranks, with fairgo too.
	steps := float64(t.cfg.Steps)
	stats := []float64{lossSum / steps, float64(correct) / (steps * float64(t.cfg.Batch)),
		compute.Seconds() / steps, comm.Seconds() / steps}
	if err := allReduceHost(ctx, t.r, t.mem, t.statsT, stats); err != nil {
		return EpochStats{}, fmt.Errorf("epoch %d statistics: %w", epoch, err)
	}
	return EpochStats{Epoch: epoch, Loss: stats[0], Accuracy: stats[1],
		Compute: seconds(stats[2]), Comm: seconds(stats[3])}, nil
}

// step runs one training step: the backward pass with the buckets'
// allreduces, the wait for them, and the optimizer. It returns the
// batch's loss, its correct predictions and the time spent in Wait.
func (t *trainer) step(ctx context.Context, epoch, step int) (float64, int, time.Duration, error) {
	cfg, in := t.cfg, t.cfg.Sizes[0]
	xs := t.x[step*cfg.Batch*in : (step+1)*cfg.Batch*in]
	ys := t.y[step*cfg.Batch : (step+1)*cfg.Batch]
	loss, ok, err := t.backwardAndLaunch(ctx, xs, ys)
	if err != nil {
		return 0, 0, 0, err
	}
	comm, err := t.averagedGradients(ctx, epoch, step)
	if err != nil {
		return 0, 0, 0, err
	}
	sgdMomentum(t.model.Params, t.velocity, t.grad, float32(cfg.LR), float32(cfg.Momentum))
	encode(fairgo.Float32, t.pbytes, t.model.Params)
	if err := t.mem.Upload(t.paramsT.Ptr, t.pbytes); err != nil {
		return 0, 0, 0, fmt.Errorf("uploading the parameters: %w", err)
	}
	return loss, ok, comm, nil
}

// backwardAndLaunch runs the forward and backward pass of one batch,
// launching each bucket's allreduce as soon as its layers are done.
// Buckets are in backward order, so the ready ones are always the next
// few.
func (t *trainer) backwardAndLaunch(ctx context.Context, xs []float32, ys []int) (float64, int, error) {
	next := 0
	var launchErr error
	ready := func(layer int) {
		for ; launchErr == nil && next < len(t.buckets) && t.buckets[next].Layer >= layer; next++ {
			if err := t.launchBucket(ctx, next); err != nil {
				launchErr = err
				return
			}
		}
	}
	loss, ok := t.model.Step(&t.ws, xs, ys, t.grad, ready)
	if launchErr != nil {
		return 0, 0, launchErr
	}
	if next != len(t.buckets) {
		return 0, 0, fmt.Errorf("internal error: %d of %d buckets launched", next, len(t.buckets))
	}
	return loss, ok, nil
}

// launchBucket uploads bucket i's gradients and starts their allreduce.
func (t *trainer) launchBucket(ctx context.Context, i int) error {
	b := t.buckets[i]
	ten := t.gradsT.Slice(int64(b.Lo), int64(b.Len()))
	buf := t.host[:ten.ByteLen()]
	encode(t.cfg.DType, buf, t.grad[b.Lo:b.Hi])
	if err := t.mem.Upload(ten.Ptr, buf); err != nil {
		return fmt.Errorf("uploading bucket %d: %w", i, err)
	}
	t.works[i] = t.r.AllReduce(ctx, ten, fairgo.Avg)
	return nil
}

// averagedGradients waits on the Works, bucket by bucket, and downloads
// the averaged gradients into grad. It returns the time spent in Wait.
func (t *trainer) averagedGradients(ctx context.Context, epoch, step int) (time.Duration, error) {
	var comm time.Duration
	for i, b := range t.buckets {
		t0 := time.Now()
		err := t.works[i].Wait(ctx)
		comm += time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("epoch %d step %d: allreduce of bucket %d: %w", epoch, step, i, err)
		}
		ten := t.gradsT.Slice(int64(b.Lo), int64(b.Len()))
		buf := t.host[:ten.ByteLen()]
		if err := t.mem.Download(buf, ten.Ptr); err != nil {
			return 0, fmt.Errorf("downloading bucket %d: %w", i, err)
		}
		decode(t.cfg.DType, t.grad[b.Lo:b.Hi], buf)
	}
	return comm, nil
}

// finish downloads the final parameters into res, checks that every
// replica holds the same, and frees the device memory.
func (t *trainer) finish(ctx context.Context, res *Result) (*Result, error) {
	res.Params = make([]byte, len(t.model.Params)*4)
	if err := t.mem.Download(res.Params, t.paramsT.Ptr); err != nil {
		return nil, fmt.Errorf("downloading the final parameters: %w", err)
	}
	if err := checkReplicas(ctx, t.r, t.mem, res.Params, t.r.Grid().Size()); err != nil {
		return res, err
	}
	var errs []error
	for _, p := range t.allocs {
		errs = append(errs, t.mem.Free(p))
	}
	return res, errors.Join(errs...)
}

// sgdMomentum is PyTorch's SGD with momentum (dampening 0, no Nesterov):
// v = μ·v + g; p -= lr·v.
func sgdMomentum(p, v, g []float32, lr, mu float32) {
	v, g = v[:len(p)], g[:len(p)]
	for i := range p {
		v[i] = mu*v[i] + g[i]
		p[i] -= lr * v[i]
	}
}

// allReduceHost averages vals over the ranks through t (float64, len(vals)
// elements), in place.
func allReduceHost(ctx context.Context, r *hier.Reducer, mem Memory, t fairgo.Tensor, vals []float64) error {
	buf := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(v))
	}
	t = t.Slice(0, int64(len(vals)))
	if err := mem.Upload(t.Ptr, buf); err != nil {
		return err
	}
	if err := r.AllReduce(ctx, t, fairgo.Avg).Wait(ctx); err != nil {
		return err
	}
	if err := mem.Download(buf, t.Ptr); err != nil {
		return err
	}
	for i := range vals {
		vals[i] = math.Float64frombits(binary.LittleEndian.Uint64(buf[8*i:]))
	}
	return nil
}

// checkReplicas gathers a hash of every rank's parameters and fails with
// ErrReplicasDiffer unless they are all equal. It works across processes;
// a single-process caller can also compare the bytes themselves.
func checkReplicas(ctx context.Context, r *hier.Reducer, mem Memory, params []byte, world int) error {
	h := fnv.New64a()
	h.Write(params)
	send, err := mem.AllocTensor(1, fairgo.Uint64)
	if err != nil {
		return err
	}
	recv, err := mem.AllocTensor(int64(world), fairgo.Uint64)
	if err != nil {
		return errors.Join(err, mem.Free(send.Ptr))
	}
	buf := binary.LittleEndian.AppendUint64(nil, h.Sum64())
	if err := mem.Upload(send.Ptr, buf); err != nil {
		return err
	}
	if err := r.AllGather(ctx, send, recv).Wait(ctx); err != nil {
		return fmt.Errorf("gathering parameter hashes: %w", err)
	}
	all := make([]byte, 8*world)
	if err := mem.Download(all, recv.Ptr); err != nil {
		return err
	}
	// AllGather blocks are in grid order; which rank differs does not
	// matter here, only that one does.
	var differ []int
	for g := range world {
		if binary.LittleEndian.Uint64(all[8*g:]) != h.Sum64() {
			differ = append(differ, g)
		}
	}
	if len(differ) > 0 {
		return fmt.Errorf(
			"%w: grid ranks %v disagree with world rank %d (hash %016x)",
			ErrReplicasDiffer,
			differ,
			r.WorldRank(),
			h.Sum64(),
		)
	}
	return errors.Join(mem.Free(send.Ptr), mem.Free(recv.Ptr))
}

// encode writes src into dst as elements of dt (float32 or bfloat16).
func encode(dt fairgo.DType, dst []byte, src []float32) {
	if dt == fairgo.Float32 {
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return
	}
	for i, v := range src {
		elem.Set(dt, dst, i, float64(v))
	}
}

// decode reads elements of dt from src into dst.
func decode(dt fairgo.DType, dst []float32, src []byte) {
	if dt == fairgo.Float32 {
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		return
	}
	for i := range dst {
		dst[i] = float32(elem.Get(dt, src, i))
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
