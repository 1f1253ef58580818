// Command fairrun launches the workers of a fairgo job on one node, the way
// torchrun does, and can split one host into several emulated machines.
//
//	fairrun --nproc-per-node N [--nnodes K --node-rank I --master-addr A --master-port P]
//	        [--emulate-machines M [--gpus G]] [--shuffle-ranks SEED] [--grace D] -- prog args...
//
// Node rank 0 hosts the rendezvous store. Each worker gets RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, FAIRGO_STORE_ADDR
// and GROUP_RANK, plus NCCL_NVLS_ENABLE=0 unless the environment sets it.
// Every output line is prefixed with the worker's rank ("[3] ..."). When one
// worker fails, or fairrun gets SIGINT or SIGTERM, every worker's process
// group gets SIGTERM, then SIGKILL after the grace period, and fairrun exits
// with the first failure's code (128+N for signal N).
//
// --emulate-machines M cuts the N workers into M contiguous groups, each a
// virtual machine with its own NCCL_HOSTID and FAIRGO_MACHINE_ID, its own
// LOCAL_RANK numbering and NCCL_SOCKET_IFNAME=lo; worker i gets
// CUDA_VISIBLE_DEVICES set to GPU i mod G (several workers may share a GPU).
// --shuffle-ranks SEED permutes the global ranks over the workers, to test
// that nothing depends on the rank order.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/launch"
)

func main() {
	cfg, err := launch.ParseArgs(os.Args[1:])
	if errors.Is(err, launch.ErrHelp) {
		fmt.Print(launch.Usage())
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			cancel(&launch.SignalError{Signal: s.(syscall.Signal)})
		}
	}()
	code, err := launch.Run(ctx, cfg)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}
