package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
	"github.com/fairgo/fairgo/streams"
)

// Info describes a testbed for the table's header and the records.
type Info struct {
	Backend     string   // "sim", "cuda", "cuda-mp"
	Timing      string   // how times are taken, e.g. "CUDA events"
	SimTimings  bool     // timings are wall clock on the simulated cluster, not GPU timings
	NCCLVersion string   // "2.28.3", or "" without NCCL
	GPUs        []string // the devices this process drives, e.g. "cuda:0 (NVIDIA H200)"
	Machines    int      // M
	Devices     int      // D
	Processes   int      // processes taking part
	Host        string
}

// World is M × D.
func (i Info) World() int { return i.Machines * i.Devices }

// Rank is one rank this process drives.
type Rank interface {
	// Hier is the rank's grid place, device and communicators, owned by the
	// testbed; the harness makes its own Reducers over them.
	Hier() hier.Rank
	// WorldRank is the rank's index in the world communicator.
	WorldRank() int
	// Stream is the benchmark's stream on the rank's device: flat and naive
	// run on it, and fairgo waits for it and makes it wait for completion.
	Stream() streams.Stream
	// Alloc allocates count elements of dt on the device (freed by Close).
	Alloc(count int64, dt fairgo.DType) (fairgo.Tensor, error)
	Upload(t fairgo.Tensor, data []byte) error
	Download(t fairgo.Tensor) ([]byte, error)
	// Time runs fn, which enqueues work on Stream(), and returns how long
	// that work took: GPU time between two events on GPUs, wall clock until
	// the stream is idle on sim.
	Time(ctx context.Context, fn func() error) (time.Duration, error)
}

// Testbed is the ranks of one process and how it meets the other processes
// of the job.
type Testbed interface {
	Info() Info
	// Ranks are the ranks this process drives.
	Ranks() []Rank
	// Barrier returns once every process has called it.
	Barrier(ctx context.Context) error
	// Gather sends blob to process 0 under key (unique per call); process
	// 0 gets every process's blob in process order, the others get nil.
	Gather(ctx context.Context, key string, blob []byte) ([][]byte, error)
	// Root reports whether this process prints and writes the results.
	Root() bool
	Close() error
}

// Opener makes a testbed from the command's settings.
type Opener func(ctx context.Context, s TestbedSpec) (Testbed, error)

// TestbedSpec is what an Opener needs.
type TestbedSpec struct {
	Machines, Devices int // grid of a single-process testbed
	Seed              int64
	Jitter            time.Duration // sim only
}

var openers = map[string]Opener{"sim": openSim}

// RegisterBackend adds a testbed kind; the cuda build registers "cuda".
func RegisterBackend(name string, o Opener) { openers[name] = o }

// Backends lists the testbed kinds in this build.
func Backends() []string {
	var out []string
	for k := range openers {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Open opens a testbed of the named kind.
func Open(ctx context.Context, backend string, s TestbedSpec) (Testbed, error) {
	o, ok := openers[backend]
	if !ok {
		hint := ""
		if backend == "cuda" {
			hint = "; build with -tags cuda"
		}
		return nil, &fairgo.ArgError{Arg: "-backend", Value: backend, Reason: fmt.Sprintf("not in this build (have %s)%s", strings.Join(Backends(), ", "), hint)}
	}
	return o(ctx, s)
}

// NCCLEnv returns the NCCL_* variables of the environment, sorted.
func NCCLEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NCCL_") {
			out = append(out, kv)
		}
	}
	sort.Strings(out)
	return out
}
