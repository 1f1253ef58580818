package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/examples/ddp/internal/gpu"
	"github.com/fairgo/fairgo/hier"
)

// trainGPU is Train on a GPU: the same model, data task, buckets, optimizer
// and replica check, with every step computed by the kernels of
// internal/gpu (train.cu) on one compute stream of the rank's GPU and no
// host copy or host wait inside a step:
//
//   - the step's batch is generated on the GPU from (seed, rank, step) and
//     labelled by the teacher (uploaded once);
//   - the backward pass runs from the last layer to the first; as soon as
//     the kernels writing a bucket's gradients are enqueued, the bucket goes
//     to AllReduce(..., Avg, hier.After(compute)), whose stages run on the
//     Reducer's own streams while the compute stream goes on with the
//     earlier layers;
//   - the SGD kernel waits for the Works on the device (Work.StreamWait on
//     the compute stream), not on the host.
//
// Timing comes from CUDA events on the compute stream, read at the end of
// each epoch: compute is the GPU time from the step's start to the end of
// its backward pass plus the optimizer; exposed communication is the time
// the compute stream spends waiting for the allreduces after its backward
// pass is done (what the overlap did not hide).
//
// Gradients are communicated in float32 only.
func trainGPU(ctx context.Context, cfg Config, r *hier.Reducer, _ Memory, onEpoch func(EpochStats)) (*Result, error) {
	t, err := newGPUTrainer(cfg, r)
	if err != nil {
		return nil, err
	}
	if err := t.allocate(); err != nil {
		return nil, err
	}
	if err := t.initialState(ctx); err != nil {
		return nil, err
	}
	if t.evs, err = createTimingEvents(t.d, cfg.Steps); err != nil {
		return nil, err
	}
	defer closeTimingEvents(t.evs)
	t.layerViews()
	res, err := runEpochs(ctx, cfg.Epochs, t.buckets, t.epoch, onEpoch)
	if err != nil {
		return nil, err
	}
	return t.finish(ctx, res)
}

// gpuTrainer is the state of trainGPU: the rank's device, its kernels and
// compute stream, the model and its buckets, and the device memory of a
// step.
type gpuTrainer struct {
	cfg      Config
	r        *hier.Reducer
	d        *cuda.Device
	tr       *gpu.Kernels
	compute  *cuda.Stream
	model    *MLP[float32]
	buckets  []Bucket
	rank     int
	dataSeed uint64
	mem      gpuMemory
	layers   []gpuLayer
	works    []*hier.Work
	// Timing events, four per step of an epoch: start, backward done,
	// communication done, optimizer done.
	evs [][4]*cuda.Event
}

// gpuMemory is the trainer's device memory.
type gpuMemory struct {
	allocs                  []uintptr // freed when training succeeds
	params, velocity, grads fairgo.Tensor
	teacher, labels         fairgo.Tensor
	acts                    []fairgo.Tensor // acts[l]: input of layer l (batch × Sizes[l]); acts[L]: logits
	dA, dB                  fairgo.Tensor   // the backward pass's gradients of activations, in turns
	loss, correct           fairgo.Tensor
	stats                   fairgo.Tensor // Σ mean loss, Σ correct over the epoch's steps
	hostStats               fairgo.Tensor // for allReduceHost
}

// gpuLayer is one layer's views of the parameters and gradients.
type gpuLayer struct{ w, b, gw, gb fairgo.Tensor }

// newGPUTrainer checks the configuration and sets up the rank's replica
// of the model, its buckets, the kernels and the compute stream.
func newGPUTrainer(cfg Config, r *hier.Reducer) (*gpuTrainer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.DType != fairgo.Float32 {
		return nil, fmt.Errorf("the GPU trainer communicates float32 gradients, not %v (use -dtype float32)", cfg.DType)
	}
	d, ok := r.Device().(*cuda.Device)
	if !ok {
		return nil, fmt.Errorf("the Reducer's device is a %T, not a *cuda.Device", r.Device())
	}
	rank := r.WorldRank()
	model, err := NewMLP[float32](cfg.Sizes)
	if err != nil {
		return nil, err
	}
	model.Init(rand.New(rand.NewPCG(cfg.Seed, 0x1417+uint64(rank))))
	buckets, err := AssignBuckets(model.ParamList(), 4, cfg.BucketBytes)
	if err != nil {
		return nil, err
	}
	tr, err := gpu.LoadKernels(d)
	if err != nil {
		return nil, err
	}
	// The compute stream is destroyed with the device.
	compute, err := d.CreateStream()
	if err != nil {
		return nil, fmt.Errorf("creating the compute stream: %w", err)
	}
	return &gpuTrainer{
		cfg: cfg, r: r, d: d, tr: tr, compute: compute, model: model, buckets: buckets,
		rank: rank, dataSeed: cfg.Seed ^ 0xda7a, works: make([]*hier.Work, len(buckets)),
	}, nil
}

// allocate allocates the device memory of training. It is freed when
// training succeeds; after an error a collective may still use it, and
// the device's Close frees it.
func (t *gpuTrainer) allocate() error {
	var allocErr error
	m := &t.mem
	alloc := func(n int64, dt fairgo.DType) fairgo.Tensor {
		ten, err := t.d.AllocTensor(n, dt)
		if err != nil {
			allocErr = errors.Join(allocErr, err)
			return fairgo.Tensor{}
		}
		m.allocs = append(m.allocs, ten.Ptr)
		return ten
	}
	cfg, nparams := t.cfg, int64(len(t.model.Params))
	batch, L := cfg.Batch, t.model.Layers()
	in, classes := cfg.Sizes[0], cfg.Sizes[L]
	widest := int64(0)
	for _, w := range cfg.Sizes {
		widest = max(widest, int64(w))
	}
	m.params, m.velocity, m.grads = alloc(nparams, fairgo.Float32), alloc(nparams, fairgo.Float32),
		alloc(nparams, fairgo.Float32)
	m.teacher = alloc(int64(in*classes), fairgo.Float32)
	m.labels = alloc(int64(batch), fairgo.Int32)
	m.acts = make([]fairgo.Tensor, L+1)
	for l := range m.acts {
		m.acts[l] = alloc(int64(batch*cfg.Sizes[l]), fairgo.Float32)
	}
	m.dA, m.dB = alloc(int64(batch)*widest, fairgo.Float32), alloc(int64(batch)*widest, fairgo.Float32)
	m.loss, m.correct = alloc(int64(batch), fairgo.Float32), alloc(int64(batch), fairgo.Float32)
	m.stats = alloc(2, fairgo.Float64)
	m.hostStats = alloc(4, fairgo.Float64)
	if allocErr != nil {
		return fmt.Errorf("allocating device memory: %w", allocErr)
	}
	return nil
}

// initialState starts every replica from rank 0's parameters with zero
// velocity, and uploads the teacher once.
func (t *gpuTrainer) initialState(ctx context.Context) error {
	d, m, cfg := t.d, &t.mem, t.cfg
	pbytes := make([]byte, len(t.model.Params)*4)
	encode(fairgo.Float32, pbytes, t.model.Params)
	if err := d.Upload(m.params.Ptr, pbytes); err != nil {
		return fmt.Errorf("uploading the parameters: %w", err)
	}
	teacher := NewTeacher(cfg.Seed, cfg.Sizes[0], cfg.Sizes[t.model.Layers()])
	tbytes := make([]byte, 4*len(teacher.w))
	encode(fairgo.Float32, tbytes, teacher.w)
	if err := d.UploadAsync(m.teacher.Ptr, tbytes, t.compute); err != nil {
		return fmt.Errorf("uploading the teacher: %w", err)
	}
	for _, ten := range []fairgo.Tensor{m.velocity, m.stats} {
		if err := d.FillAsync(ten, 0, 0, 0, t.compute); err != nil {
			return fmt.Errorf("zeroing: %w", err)
		}
	}
	if err := t.r.Broadcast(ctx, m.params, 0).Wait(ctx); err != nil {
		return fmt.Errorf("broadcasting rank 0's parameters: %w", err)
	}
	return nil
}

// createTimingEvents creates the timing events of the steps of an epoch.
func createTimingEvents(d *cuda.Device, steps int) ([][4]*cuda.Event, error) {
	evs := make([][4]*cuda.Event, steps)
	for i := range evs {
		for j := range evs[i] {
			var err error
			if evs[i][j], err = d.CreateEvent(true); err != nil {
				return nil, fmt.Errorf("creating timing events: %w", err)
			}
		}
	}
	return evs, nil
}

func closeTimingEvents(evs [][4]*cuda.Event) {
	for i := range evs {
		for _, e := range evs[i] {
			if e != nil {
				_ = e.Close()
			}
		}
	}
}

// layerViews cuts each layer's weights, biases and their gradients out
// of the parameter and gradient tensors.
func (t *gpuTrainer) layerViews() {
	params, grads := t.mem.params, t.mem.grads
	t.layers = make([]gpuLayer, t.model.Layers())
	for l, ly := range t.model.layers {
		t.layers[l] = gpuLayer{
			w: params.Slice(int64(ly.w), int64(ly.in*ly.out)), b: params.Slice(int64(ly.b), int64(ly.out)),
			gw: grads.Slice(int64(ly.w), int64(ly.in*ly.out)), gb: grads.Slice(int64(ly.b), int64(ly.out)),
		}
	}
}

// step enqueues one training step on the compute stream.
func (t *gpuTrainer) step(ctx context.Context, s int) error {
	ev := t.evs[s]
	if err := ev[0].Record(t.compute); err != nil {
		return err
	}
	if err := t.forward(s); err != nil {
		return err
	}
	if err := t.backward(ctx); err != nil {
		return err
	}
	if err := ev[1].Record(t.compute); err != nil {
		return err
	}
	// The optimizer waits for the allreduces on the device.
	for i, w := range t.works {
		if err := w.StreamWait(ctx, t.compute); err != nil {
			return fmt.Errorf("allreduce of bucket %d: %w", i, err)
		}
	}
	if err := ev[2].Record(t.compute); err != nil {
		return err
	}
	cfg, m := t.cfg, &t.mem
	if err := t.tr.SGD(m.params, m.velocity, m.grads, float32(cfg.LR), float32(cfg.Momentum), t.compute); err != nil {
		return err
	}
	return ev[3].Record(t.compute)
}

// forward draws step s's batch of this rank on the GPU (the same batches
// every epoch), runs the forward pass and the loss, and leaves the loss's
// gradient in mem.dA.
func (t *gpuTrainer) forward(s int) error {
	tr, m, compute := t.tr, &t.mem, t.compute
	batch, L := t.cfg.Batch, t.model.Layers()
	in, classes := t.cfg.Sizes[0], t.cfg.Sizes[L]
	x := m.acts[0]
	if err := tr.GenInputs(x, t.dataSeed, t.rank, s, compute); err != nil {
		return err
	}
	if err := tr.GenLabels(m.labels, x, m.teacher, batch, in, classes, compute); err != nil {
		return err
	}
	// Forward: acts[l+1] = act(acts[l]·Wᵀ + b).
	for l, ly := range t.model.layers {
		if err := tr.MatMul(m.acts[l+1], m.acts[l], t.layers[l].w, batch, ly.out, ly.in, false, true, compute); err != nil {
			return err
		}
		if err := tr.BiasAct(m.acts[l+1], t.layers[l].b, batch, ly.out, l+1 < L, compute); err != nil {
			return err
		}
	}
	scale := 1 / float32(batch)
	if err := tr.SoftmaxXent(m.acts[L], m.labels, m.loss, m.correct, m.dA, batch, classes, scale, compute); err != nil {
		return err
	}
	return tr.AccumStats(m.stats, m.loss, m.correct, batch, compute)
}

// backward runs the backward pass from the last layer to the first. A
// bucket is handed to AllReduce right after the kernels writing its
// gradients are enqueued (hier.After orders it after them, and only
// them).
func (t *gpuTrainer) backward(ctx context.Context) error {
	tr, m, compute, batch := t.tr, &t.mem, t.compute, t.cfg.Batch
	dz, da := m.dA, m.dB
	next := 0
	for l := t.model.Layers() - 1; l >= 0; l-- {
		ly, lt := t.model.layers[l], t.layers[l]
		if err := tr.MatMul(lt.gw, dz, m.acts[l], ly.out, ly.in, batch, true, false, compute); err != nil {
			return err
		}
		if err := tr.ColSum(lt.gb, dz, batch, ly.out, compute); err != nil {
			return err
		}
		next = t.launchReadyBuckets(ctx, next, l)
		if l > 0 {
			if err := tr.MatMul(da, dz, lt.w, batch, ly.in, ly.out, false, false, compute); err != nil {
				return err
			}
			if err := tr.ReLUMask(da.Slice(0, int64(batch*ly.in)), m.acts[l], compute); err != nil {
				return err
			}
			dz, da = da, dz
		}
	}
	if next != len(t.buckets) {
		return fmt.Errorf("internal error: %d of %d buckets launched", next, len(t.buckets))
	}
	return nil
}

// launchReadyBuckets hands to AllReduce the buckets from next on whose
// gradients are all written once layer's are, and returns the next
// bucket to launch.
func (t *gpuTrainer) launchReadyBuckets(ctx context.Context, next, layer int) int {
	for ; next < len(t.buckets) && t.buckets[next].Layer >= layer; next++ {
		b := t.buckets[next]
		t.works[next] = t.r.AllReduce(
			ctx,
			t.mem.grads.Slice(int64(b.Lo), int64(b.Len())),
			fairgo.Avg,
			hier.After(t.compute),
		)
	}
	return next
}

// epoch enqueues the steps of one epoch and returns its numbers, averaged
// over the ranks: the one host wait per epoch.
func (t *gpuTrainer) epoch(ctx context.Context, epoch int) (EpochStats, error) {
	for s := range t.cfg.Steps {
		if err := t.step(ctx, s); err != nil {
			return EpochStats{}, fmt.Errorf("epoch %d step %d: %w", epoch, s, err)
		}
	}
	for i, w := range t.works {
		if err := w.Wait(ctx); err != nil {
			return EpochStats{}, fmt.Errorf("epoch %d: allreduce of bucket %d: %w", epoch, i, err)
		}
	}
	if err := t.compute.Synchronize(); err != nil {
		return EpochStats{}, fmt.Errorf("epoch %d: %w", epoch, err)
	}
	comp, comm, err := t.epochTimes()
	if err != nil {
		return EpochStats{}, fmt.Errorf("epoch %d: timing: %w", epoch, err)
	}
	sum, err := t.takeStats()
	if err != nil {
		return EpochStats{}, fmt.Errorf("epoch %d statistics: %w", epoch, err)
	}
	steps := float64(t.cfg.Steps)
	vals := []float64{sum[0] / steps, sum[1] / (steps * float64(t.cfg.Batch)),
		comp.Seconds() / steps, comm.Seconds() / steps}
	if err := allReduceHost(ctx, t.r, t.d, t.mem.hostStats, vals); err != nil {
		return EpochStats{}, fmt.Errorf("epoch %d statistics: %w", epoch, err)
	}
	return EpochStats{
		Epoch:    epoch,
		Loss:     vals[0],
		Accuracy: vals[1],
		Compute:  seconds(vals[2]),
		Comm:     seconds(vals[3]),
	}, nil
}

// epochTimes reads the epoch's timing events: compute is the time from
// each step's start to the end of its backward pass plus the optimizer's,
// comm the time the compute stream waited for the allreduces.
func (t *gpuTrainer) epochTimes() (comp, comm time.Duration, err error) {
	for _, ev := range t.evs {
		back, err1 := cuda.Elapsed(ev[0], ev[1])
		wait, err2 := cuda.Elapsed(ev[1], ev[2])
		opt, err3 := cuda.Elapsed(ev[2], ev[3])
		if err := errors.Join(err1, err2, err3); err != nil {
			return 0, 0, err
		}
		comp += back + opt
		comm += wait
	}
	return comp, comm, nil
}

// takeStats downloads the epoch's sums of loss and correct answers and
// zeroes them for the next epoch.
func (t *gpuTrainer) takeStats() ([]float64, error) {
	sb := make([]byte, 16)
	if err := t.d.DownloadAfter(sb, t.mem.stats.Ptr, t.compute); err != nil {
		return nil, err
	}
	if err := t.d.FillAsync(t.mem.stats, 0, 0, 0, t.compute); err != nil {
		return nil, err
	}
	sum := make([]float64, 2)
	decodeF64(sum, sb)
	return sum, nil
}

// finish downloads the final parameters into res, checks that every
// replica holds the same, and frees the kernels and the device memory.
func (t *gpuTrainer) finish(ctx context.Context, res *Result) (*Result, error) {
	if err := t.compute.Synchronize(); err != nil {
		return nil, err
	}
	res.Params = make([]byte, len(t.model.Params)*4)
	if err := t.d.Download(res.Params, t.mem.params.Ptr); err != nil {
		return nil, fmt.Errorf("downloading the final parameters: %w", err)
	}
	if err := checkReplicas(ctx, t.r, t.d, res.Params, t.r.Grid().Size()); err != nil {
		return res, err
	}
	errs := []error{t.tr.Close()}
	for _, p := range t.mem.allocs {
		errs = append(errs, t.d.Free(p))
	}
	return res, errors.Join(errs...)
}

func decodeF64(dst []float64, src []byte) {
	for i := range dst {
		dst[i] = math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:]))
	}
}
