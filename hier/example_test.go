package hier_test

import (
	"context"
	"fmt"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/sim"
)

// The examples run every rank of a simulated cluster in one process: on
// GPUs each process holds one Reducer (setup.New) and makes the same calls.

// exCluster builds a simulated cluster of machines × devices ranks and one
// Reducer per rank.
func exCluster(ctx context.Context, machines, devices int, opts ...hier.Option) (*sim.Cluster, []*hier.Reducer) {
	c, err := sim.NewCluster(sim.Config{Machines: machines, Devices: devices})
	if err != nil {
		panic(err)
	}
	rs, err := c.Reducers(ctx, opts...)
	if err != nil {
		panic(err)
	}
	return c, rs
}

func exClose(c *sim.Cluster, rs []*hier.Reducer) {
	if err := hier.CloseAll(rs); err != nil {
		panic(err)
	}
	if err := c.Close(); err != nil {
		panic(err)
	}
}

// Average a gradient over 2 machines × 2 devices. AllReduce returns a
// *Work at once; Wait blocks until the result is in place.
func ExampleReducer_AllReduce() {
	ctx := context.Background()
	// A tensor this small normally takes one flat allreduce; FlatNever
	// sends it through the five stages.
	c, rs := exCluster(ctx, 2, 2, hier.WithFlatThreshold(hier.FlatNever))
	defer exClose(c, rs)

	grads := make([]fairgo.Tensor, len(rs))
	works := make([]*hier.Work, len(rs))
	for g, r := range rs {
		// Rank g's gradient is g+1 everywhere, so the average is 2.5.
		var err error
		grads[g], err = fairgo.Upload(c.Device(g), []float32{float32(g + 1), float32(g + 1), 10 * float32(g+1)})
		if err != nil {
			fmt.Println(err)
			return
		}
		works[g] = r.AllReduce(ctx, grads[g], fairgo.Avg)
	}
	for g, w := range works {
		if err := w.Wait(ctx); err != nil {
			fmt.Println("allreduce failed:", err)
			return
		}
		got, err := fairgo.Download[float32](c.Device(g), grads[g])
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d (%v): %v\n", g, rs[g].Grid(), got)
	}
	// Output:
	// rank 0 (2×2 (machine 0, local 0)): [2.5 2.5 25]
	// rank 1 (2×2 (machine 0, local 1)): [2.5 2.5 25]
	// rank 2 (2×2 (machine 1, local 0)): [2.5 2.5 25]
	// rank 3 (2×2 (machine 1, local 1)): [2.5 2.5 25]
}

// Reduce-scatter: send holds one block per rank in grid order (m·D + d);
// each rank receives the sum of its own block. This is the first half of a
// sharded optimizer step (ZeRO); AllGather is the second.
func ExampleReducer_ReduceScatter() {
	ctx := context.Background()
	c, rs := exCluster(ctx, 2, 2)
	defer exClose(c, rs)

	const block = 2
	recvs := make([]fairgo.Tensor, len(rs))
	works := make([]*hier.Work, len(rs))
	for g, r := range rs {
		dev := c.Device(g)
		// Element i of rank g's send buffer is 100·g + i.
		send := make([]float32, block*len(rs))
		for i := range send {
			send[i] = float32(100*g + i)
		}
		sendT, err := fairgo.Upload(dev, send)
		if err != nil {
			fmt.Println(err)
			return
		}
		if recvs[g], err = dev.AllocTensor(block, fairgo.Float32); err != nil {
			fmt.Println(err)
			return
		}
		works[g] = r.ReduceScatter(ctx, sendT, recvs[g], fairgo.Sum)
	}
	for g, w := range works {
		if err := w.Wait(ctx); err != nil {
			fmt.Println("reduce-scatter failed:", err)
			return
		}
		got, err := fairgo.Download[float32](c.Device(g), recvs[g])
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d holds block %d: %v\n", g, rs[g].Grid().Rank(), got)
	}
	// Output:
	// rank 0 holds block 0: [600 604]
	// rank 1 holds block 1: [608 612]
	// rank 2 holds block 2: [616 620]
	// rank 3 holds block 3: [624 628]
}

// Chain a collective between the trainer's own stream work without
// blocking the host: After makes the allreduce wait for what was enqueued
// on the stream before the call (the backward pass), and StreamWait makes
// what is enqueued on the stream afterwards (the optimizer) wait for the
// allreduce. Only the final Synchronize blocks.
func ExampleWork_StreamWait() {
	ctx := context.Background()
	c, rs := exCluster(ctx, 2, 1)
	defer exClose(c, rs)

	type rank struct {
		stream      *sim.Stream
		grad, saved fairgo.Tensor
		work        *hier.Work
	}
	ranks := make([]rank, len(rs))
	for g, r := range rs {
		dev := c.Device(g)
		s, err := dev.NewStream() // the trainer's compute stream
		if err != nil {
			fmt.Println(err)
			return
		}
		rk := rank{stream: s.(*sim.Stream)}
		// "Backward": a gradient produced by a copy on the compute stream.
		src, err := fairgo.Upload(dev, []float32{float32(g + 1), 4})
		if err != nil {
			fmt.Println(err)
			return
		}
		if rk.grad, err = dev.AllocTensor(2, fairgo.Float32); err != nil {
			fmt.Println(err)
			return
		}
		if rk.saved, err = dev.AllocTensor(2, fairgo.Float32); err != nil {
			fmt.Println(err)
			return
		}
		if err := dev.CopyAsync(rk.grad.Ptr, src.Ptr, src.Bytes, rk.stream); err != nil {
			fmt.Println(err)
			return
		}
		rk.work = r.AllReduce(ctx, rk.grad, fairgo.Sum, hier.After(rk.stream))
		// "Optimizer": consumes the reduced gradient, on the same stream.
		if err := rk.work.StreamWait(ctx, rk.stream); err != nil {
			fmt.Println(err)
			return
		}
		if err := dev.CopyAsync(rk.saved.Ptr, rk.grad.Ptr, rk.grad.Bytes, rk.stream); err != nil {
			fmt.Println(err)
			return
		}
		ranks[g] = rk
	}
	for g, rk := range ranks {
		if err := rk.stream.Synchronize(ctx); err != nil {
			fmt.Println("stream failed:", err)
			return
		}
		got, err := fairgo.Download[float32](c.Device(g), rk.saved)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d: %v\n", g, got)
	}
	// Output:
	// rank 0: [3 8]
	// rank 1: [3 8]
}

// Gather one block from every rank, in grid order.
func ExampleReducer_AllGather() {
	ctx := context.Background()
	c, rs := exCluster(ctx, 3, 1)
	defer exClose(c, rs)

	recvs := make([]fairgo.Tensor, len(rs))
	works := make([]*hier.Work, len(rs))
	for g, r := range rs {
		dev := c.Device(g)
		send, err := fairgo.Upload(dev, []float32{float32(g), 10 * float32(g)})
		if err != nil {
			fmt.Println(err)
			return
		}
		if recvs[g], err = dev.AllocTensor(int64(2*len(rs)), fairgo.Float32); err != nil {
			fmt.Println(err)
			return
		}
		works[g] = r.AllGather(ctx, send, recvs[g])
	}
	for g, w := range works {
		if err := w.Wait(ctx); err != nil {
			fmt.Println("all-gather failed:", err)
			return
		}
		got, err := fairgo.Download[float32](c.Device(g), recvs[g])
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("rank %d: %v\n", g, got)
	}
	// Output:
	// rank 0: [0 0 1 10 2 20]
	// rank 1: [0 0 1 10 2 20]
	// rank 2: [0 0 1 10 2 20]
}
