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
	rank, world := r.WorldRank(), r.Grid().Size()
	model, err := NewMLP[float32](cfg.Sizes)
	if err != nil {
		return nil, err
	}
	model.Init(rand.New(rand.NewPCG(cfg.Seed, 0x1417+uint64(rank))))
	nparams := int64(len(model.Params))
	buckets, err := AssignBuckets(model.ParamList(), 4, cfg.BucketBytes)
	if err != nil {
		return nil, err
	}
	tr, err := gpu.LoadKernels(d)
	if err != nil {
		return nil, err
	}
	compute, err := d.CreateStream() // destroyed with the device
	if err != nil {
		return nil, fmt.Errorf("creating the compute stream: %w", err)
	}

	// Device memory is freed when training succeeds; after an error a
	// collective may still use it, and the device's Close frees it.
	var allocs []uintptr
	var allocErr error
	alloc := func(n int64, dt fairgo.DType) fairgo.Tensor {
		t, err := d.AllocTensor(n, dt)
		if err != nil {
			allocErr = errors.Join(allocErr, err)
			return fairgo.Tensor{}
		}
		allocs = append(allocs, t.Ptr)
		return t
	}
	batch, L := cfg.Batch, model.Layers()
	in, classes := cfg.Sizes[0], cfg.Sizes[L]
	widest := int64(0)
	for _, w := range cfg.Sizes {
		widest = max(widest, int64(w))
	}
	params, velocity, grads := alloc(
		nparams,
		fairgo.Float32,
	), alloc(
		nparams,
		fairgo.Float32,
	), alloc(
		nparams,
		fairgo.Float32,
	)
	teacherT := alloc(int64(in*classes), fairgo.Float32)
	labels := alloc(int64(batch), fairgo.Int32)
	acts := make([]fairgo.Tensor, L+1) // acts[l]: input of layer l (batch × Sizes[l]); acts[L]: logits
	for l := range acts {
		acts[l] = alloc(int64(batch*cfg.Sizes[l]), fairgo.Float32)
	}
	dA, dB := alloc(int64(batch)*widest, fairgo.Float32), alloc(int64(batch)*widest, fairgo.Float32)
	loss, correct := alloc(int64(batch), fairgo.Float32), alloc(int64(batch), fairgo.Float32)
	stats := alloc(2, fairgo.Float64)     // Σ mean loss, Σ correct over the epoch's steps
	hostStats := alloc(4, fairgo.Float64) // for allReduceHost
	if allocErr != nil {
		return nil, fmt.Errorf("allocating device memory: %w", allocErr)
	}

	// Start from rank 0's parameters, zero velocity; the teacher once.
	pbytes := make([]byte, nparams*4)
	encode(fairgo.Float32, pbytes, model.Params)
	if err := d.Upload(params.Ptr, pbytes); err != nil {
		return nil, fmt.Errorf("uploading the parameters: %w", err)
	}
	teacher := NewTeacher(cfg.Seed, in, classes)
	tbytes := make([]byte, 4*len(teacher.w))
	encode(fairgo.Float32, tbytes, teacher.w)
	if err := d.UploadAsync(teacherT.Ptr, tbytes, compute); err != nil {
		return nil, fmt.Errorf("uploading the teacher: %w", err)
	}
	for _, t := range []fairgo.Tensor{velocity, stats} {
		if err := d.FillAsync(t, 0, 0, 0, compute); err != nil {
			return nil, fmt.Errorf("zeroing: %w", err)
		}
	}
	if err := r.Broadcast(ctx, params, 0).Wait(ctx); err != nil {
		return nil, fmt.Errorf("broadcasting rank 0's parameters: %w", err)
	}

	// Timing events, four per step of an epoch: start, backward done,
	// communication done, optimizer done.
	evs := make([][4]*cuda.Event, cfg.Steps)
	for i := range evs {
		for j := range evs[i] {
			if evs[i][j], err = d.CreateEvent(true); err != nil {
				return nil, fmt.Errorf("creating timing events: %w", err)
			}
		}
	}
	defer func() {
		for i := range evs {
			for _, e := range evs[i] {
				if e != nil {
					_ = e.Close()
				}
			}
		}
	}()

	type layerT struct{ w, b, gw, gb fairgo.Tensor }
	layers := make([]layerT, L)
	for l, ly := range model.layers {
		layers[l] = layerT{
			w: params.Slice(int64(ly.w), int64(ly.in*ly.out)), b: params.Slice(int64(ly.b), int64(ly.out)),
			gw: grads.Slice(int64(ly.w), int64(ly.in*ly.out)), gb: grads.Slice(int64(ly.b), int64(ly.out)),
		}
	}
	works := make([]*hier.Work, len(buckets))
	res := &Result{Buckets: buckets}
	dataSeed := cfg.Seed ^ 0xda7a

	// step enqueues one training step on the compute stream.
	step := func(s int) error {
		ev := evs[s]
		if err := ev[0].Record(compute); err != nil {
			return err
		}
		// This rank's batch, drawn on the GPU; the same batches every epoch.
		x := acts[0]
		if err := tr.GenInputs(x, dataSeed, rank, s, compute); err != nil {
			return err
		}
		if err := tr.GenLabels(labels, x, teacherT, batch, in, classes, compute); err != nil {
			return err
		}
		// Forward: acts[l+1] = act(acts[l]·Wᵀ + b).
		for l, ly := range model.layers {
			if err := tr.MatMul(acts[l+1], acts[l], layers[l].w, batch, ly.out, ly.in, false, true, compute); err != nil {
				return err
			}
			if err := tr.BiasAct(acts[l+1], layers[l].b, batch, ly.out, l+1 < L, compute); err != nil {
				return err
			}
		}
		dz, da := dA, dB
		if err := tr.SoftmaxXent(acts[L], labels, loss, correct, dz, batch, classes, 1/float32(batch), compute); err != nil {
			return err
		}
		if err := tr.AccumStats(stats, loss, correct, batch, compute); err != nil {
			return err
		}
		// Backward, from the last layer to the first. A bucket is handed
		// to AllReduce right after the kernels writing its gradients are
		// enqueued (hier.After orders it after them, and only them).
		next := 0
		for l := L - 1; l >= 0; l-- {
			ly := model.layers[l]
			if err := tr.MatMul(layers[l].gw, dz, acts[l], ly.out, ly.in, batch, true, false, compute); err != nil {
				return err
			}
			if err := tr.ColSum(layers[l].gb, dz, batch, ly.out, compute); err != nil {
				return err
			}
			for ; next < len(buckets) && buckets[next].Layer >= l; next++ {
				b := buckets[next]
				works[next] = r.AllReduce(
					ctx,
					grads.Slice(int64(b.Lo), int64(b.Len())),
					fairgo.Avg,
					hier.After(compute),
				)
			}
			if l > 0 {
				if err := tr.MatMul(da, dz, layers[l].w, batch, ly.in, ly.out, false, false, compute); err != nil {
					return err
				}
				if err := tr.ReLUMask(da.Slice(0, int64(batch*ly.in)), acts[l], compute); err != nil {
					return err
				}
				dz, da = da, dz
			}
		}
		if next != len(buckets) {
			return fmt.Errorf("internal error: %d of %d buckets launched", next, len(buckets))
		}
		if err := ev[1].Record(compute); err != nil {
			return err
		}
		// The optimizer waits for the allreduces on the device.
		for i, w := range works {
			if err := w.StreamWait(ctx, compute); err != nil {
				return fmt.Errorf("allreduce of bucket %d: %w", i, err)
			}
		}
		if err := ev[2].Record(compute); err != nil {
			return err
		}
		if err := tr.SGD(params, velocity, grads, float32(cfg.LR), float32(cfg.Momentum), compute); err != nil {
			return err
		}
		return ev[3].Record(compute)
	}

	for epoch := 1; epoch <= cfg.Epochs; epoch++ {
		for s := range cfg.Steps {
			if err := step(s); err != nil {
				return nil, fmt.Errorf("epoch %d step %d: %w", epoch, s, err)
			}
		}
		// The epoch's numbers: the one host wait per epoch.
		for i, w := range works {
			if err := w.Wait(ctx); err != nil {
				return nil, fmt.Errorf("epoch %d: allreduce of bucket %d: %w", epoch, i, err)
			}
		}
		if err := compute.Synchronize(); err != nil {
			return nil, fmt.Errorf("epoch %d: %w", epoch, err)
		}
		var comp, comm time.Duration
		for _, ev := range evs {
			back, err1 := cuda.Elapsed(ev[0], ev[1])
			wait, err2 := cuda.Elapsed(ev[1], ev[2])
			opt, err3 := cuda.Elapsed(ev[2], ev[3])
			if err := errors.Join(err1, err2, err3); err != nil {
				return nil, fmt.Errorf("epoch %d: timing: %w", epoch, err)
			}
			comp += back + opt
			comm += wait
		}
		sb := make([]byte, 16)
		if err := d.DownloadAfter(sb, stats.Ptr, compute); err != nil {
			return nil, fmt.Errorf("epoch %d statistics: %w", epoch, err)
		}
		if err := d.FillAsync(stats, 0, 0, 0, compute); err != nil {
			return nil, fmt.Errorf("epoch %d statistics: %w", epoch, err)
		}
		sum := make([]float64, 2)
		decodeF64(sum, sb)
		steps := float64(cfg.Steps)
		vals := []float64{sum[0] / steps, sum[1] / (steps * float64(batch)),
			comp.Seconds() / steps, comm.Seconds() / steps}
		if err := allReduceHost(ctx, r, d, hostStats, vals); err != nil {
			return nil, fmt.Errorf("epoch %d statistics: %w", epoch, err)
		}
		es := EpochStats{
			Epoch:    epoch,
			Loss:     vals[0],
			Accuracy: vals[1],
			Compute:  seconds(vals[2]),
			Comm:     seconds(vals[3]),
		}
		res.Epochs = append(res.Epochs, es)
		if onEpoch != nil {
			onEpoch(es)
		}
	}

	if err := compute.Synchronize(); err != nil {
		return nil, err
	}
	res.Params = make([]byte, nparams*4)
	if err := d.Download(res.Params, params.Ptr); err != nil {
		return nil, fmt.Errorf("downloading the final parameters: %w", err)
	}
	if err := checkReplicas(ctx, r, d, res.Params, world); err != nil {
		return res, err
	}
	errs := []error{tr.Close()}
	for _, p := range allocs {
		errs = append(errs, d.Free(p))
	}
	return res, errors.Join(errs...)
}

func decodeF64(dst []float64, src []byte) {
	for i := range dst {
		dst[i] = math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:]))
	}
}
