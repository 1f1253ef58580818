package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/cuda"
	"github.com/fairgo/fairgo/hier/setup"
	"github.com/fairgo/fairgo/nccl"
	"github.com/fairgo/fairgo/rendezvous"
)

// OpenCUDALocal drives s.Machines × s.Devices ranks from this process, one
// per GPU over the first GPUs, with the grid declared (cuda.NewLocalRanks):
// 2 × 1 puts two "machines" on two GPUs of one host.
func OpenCUDALocal(s Spec) (*Testbed, error) {
	n, err := cuda.Count()
	if err != nil {
		return nil, fmt.Errorf("testbed: counting GPUs: %w", err)
	}
	want := s.Machines * s.Devices
	if s.Machines < 1 || s.Devices < 1 || want > n {
		return nil, &fairgo.ArgError{Arg: "machines × devices", Value: fmt.Sprintf("%d×%d", s.Machines, s.Devices),
			Reason: fmt.Sprintf(
				"one process drives one rank per GPU, and %d GPUs are visible (run more ranks under fairrun)",
				n,
			)}
	}
	t := &Testbed{}
	var devs []*cuda.Device
	t.onClose(func() error {
		var errs []error
		for _, d := range devs {
			errs = append(errs, d.Close())
		}
		return errors.Join(errs...)
	})
	for i := range want {
		d, err := cuda.Open(i)
		if err != nil {
			return nil, t.closeOnError(err)
		}
		devs = append(devs, d)
	}
	hrs, err := cuda.NewLocalRanks(devs, s.Machines, s.Devices)
	if err != nil {
		return nil, t.closeOnError(err)
	}
	t.onClose(func() error { return cuda.CloseRanks(hrs) })
	t.newAlgo = func(ctx context.Context, algo backend.NCCLAlgo) ([]backend.Comm, error) {
		worlds := make([]*cuda.Comm, len(hrs))
		for i, hr := range hrs {
			worlds[i] = hr.Comms.World.(*cuda.Comm)
		}
		return algoWorld(ctx, worlds, algo)
	}
	for g, hr := range hrs {
		if err := t.addCUDARank(hr, g); err != nil {
			return nil, t.closeOnError(err)
		}
	}
	t.info = gpuInfo("cuda", t, s.Machines, s.Devices, 1)
	t.info.Placement = Placement{RanksPerGPU: 1}
	return t, nil
}

// OpenCUDAProcess is this process's rank of a job of one rank per process
// under a launcher (fairrun, torchrun, Slurm, Open MPI): setup.New with the
// cuda backend discovers the grid and builds the device and communicators
// through the launcher's store, which then carries barriers and gathers. The
// emulated testbed comes from the FAIRGO_TESTBED_* variables, and how ranks
// share GPUs from every process's report through the store.
func OpenCUDAProcess(ctx context.Context) (*Testbed, error) {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return nil, err
	}
	emu, err := EmulationFromEnv(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	setupCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	ls, err := rendezvous.Open(setupCtx, l)
	if err != nil {
		return nil, fmt.Errorf("testbed: the launcher's store: %w", err)
	}
	t := &Testbed{group: &group{store: rendezvous.WithPrefix(ls, "testbed"), rank: l.Rank, size: l.WorldSize}}
	t.onClose(func() error { // last: a rank that hosts the store serves until the others have left
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return ls.Leave(ctx)
	})
	rks, err := setup.Connect(setupCtx, ls, cuda.Backend{}, nil, setup.WithStorePrefix("testbed-setup"))
	if err != nil {
		return nil, t.closeOnError(err)
	}
	// This process's rank: the testbed owns its device and communicators,
	// released after every Reducer built over them.
	// The Reducers built over it get no Board: notes one of them left in
	// the store would abort the next.
	t.onClose(rks[0].Release)
	hr := backend.Rank{Grid: rks[0].Grid, Device: rks[0].Device, Comms: rks[0].Comms, Variants: rks[0].Variants}
	t.newAlgo = func(ctx context.Context, algo backend.NCCLAlgo) ([]backend.Comm, error) {
		world, ok := hr.Comms.World.(*cuda.Comm)
		if !ok {
			return nil, fmt.Errorf("testbed: the world communicator is a %T, not a *cuda.Comm", hr.Comms.World)
		}
		return algoWorld(ctx, []*cuda.Comm{world}, algo)
	}
	if err := t.addCUDARank(hr, hr.Comms.World.Rank()); err != nil {
		return nil, t.closeOnError(err)
	}
	g := hr.Grid
	t.info = gpuInfo("cuda-mp", t, g.Machines, g.Devices, l.WorldSize)
	t.info.GPUs[0] += fmt.Sprintf(" rank %d (machine %d, local %d)", hr.Comms.World.Rank(), g.Machine, g.Local)
	if id := os.Getenv("NCCL_HOSTID"); id != "" {
		t.info.Host += " NCCL_HOSTID=" + id
	}
	t.info.Emulation = emu
	if t.info.Placement, err = t.exchangeSeats(setupCtx, g.Machine); err != nil {
		return nil, t.closeOnError(err)
	}
	return t, nil
}

// algoWorld duplicates the world communicators of this process's ranks
// while NCCL_ALGO restricts the allreduce to algo, so that NCCL initialises
// the copies with that algorithm only (cuda.DuplicateAlgo; every process
// makes the same call).
func algoWorld(ctx context.Context, worlds []*cuda.Comm, algo backend.NCCLAlgo) ([]backend.Comm, error) {
	dups, err := cuda.DuplicateAlgo(ctx, worlds, algo, "flat-"+string(algo))
	if err != nil {
		return nil, err
	}
	out := make([]backend.Comm, len(dups))
	for i, c := range dups {
		out[i] = c
	}
	return out, nil
}

// exchangeSeats tells every process where this rank runs and returns the
// job's placement.
func (t *Testbed) exchangeSeats(ctx context.Context, machine int) (Placement, error) {
	d := t.ranks[0].Device.(*cuda.Device)
	mine, err := json.Marshal(Seat{Machine: machine, GPU: gpuIdentity(d.Ordinal()), NCCLHost: ncclHost()})
	if err != nil {
		return Placement{}, err
	}
	blobs, err := t.group.gather(ctx, "seats", mine, true)
	if err != nil {
		return Placement{}, err
	}
	seats := make([]Seat, len(blobs))
	for i, b := range blobs {
		if err := json.Unmarshal(b, &seats[i]); err != nil {
			return Placement{}, fmt.Errorf("testbed: seat of process %d: %w", i, err)
		}
	}
	return PlacementOf(seats), nil
}

// gpuIdentity names the physical GPU of a CUDA ordinal: the host and the
// ordinal's entry of CUDA_VISIBLE_DEVICES (fairrun pins each emulated
// machine's workers that way), else the ordinal.
func gpuIdentity(ordinal int) string {
	gpu := strconv.Itoa(ordinal)
	if v := strings.TrimSpace(os.Getenv("CUDA_VISIBLE_DEVICES")); v != "" {
		if fields := strings.Split(v, ","); ordinal < len(fields) {
			gpu = strings.TrimSpace(fields[ordinal])
		}
	}
	return hostname() + "/" + gpu
}

// addCUDARank adds a rank with a benchmark stream and two timing events.
func (t *Testbed) addCUDARank(hr backend.Rank, world int) error {
	d, ok := hr.Device.(*cuda.Device)
	if !ok {
		return fmt.Errorf("testbed: rank device is a %T, not a *cuda.Device", hr.Device)
	}
	tm := &eventTimer{}
	r := &Rank{Hier: hr, Device: d, WorldRank: world, timer: tm}
	t.ranks = append(t.ranks, r) // released by Close from here on
	var err error
	if tm.stream, err = d.CreateStream(); err != nil {
		return err
	}
	r.Stream = tm.stream
	if tm.start, err = d.CreateEvent(true); err != nil {
		return err
	}
	tm.end, err = d.CreateEvent(true)
	return err
}

// eventTimer times a CUDA stream's work with two events.
type eventTimer struct {
	stream     *cuda.Stream
	start, end *cuda.Event
}

// time records an event on the stream, runs fn, records another and waits
// for it: the GPU time of the work fn enqueued.
func (e *eventTimer) time(ctx context.Context, fn func() error) (time.Duration, error) {
	if err := e.start.Record(e.stream); err != nil {
		return 0, err
	}
	if err := fn(); err != nil {
		return 0, err
	}
	if err := e.end.Record(e.stream); err != nil {
		return 0, err
	}
	if err := e.end.Wait(ctx); err != nil {
		return 0, err
	}
	return cuda.Elapsed(e.start, e.end)
}

func (e *eventTimer) close() error {
	var errs []error
	if e.start != nil {
		errs = append(errs, e.start.Close())
	}
	if e.end != nil {
		errs = append(errs, e.end.Close())
	}
	if e.stream != nil {
		errs = append(errs, e.stream.Close())
	}
	return errors.Join(errs...)
}

func gpuInfo(backend string, t *Testbed, m, d, procs int) Info {
	info := Info{
		Backend:     backend,
		Timing:      "CUDA events on the benchmark stream",
		NCCLVersion: ncclVersion(),
		NCCLEnv:     NCCLEnv(),
		Machines:    m,
		Devices:     d,
		Processes:   procs,
		Host:        hostname(),
	}
	for _, r := range t.ranks {
		info.GPUs = append(info.GPUs, fmt.Sprint(r.Device))
	}
	return info
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
