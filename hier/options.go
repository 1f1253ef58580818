package hier

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"reflect"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
	"github.com/fairgo/fairgo/logging"
	"github.com/fairgo/fairgo/staging"
)

// Defaults for the options. They come from measurement on two H200s (see
// BENCHMARKS.md); the slice size grows with the grid so that each shard a
// machine exchanges stays at least DefaultMinShardBytes.
const (
	DefaultSliceBytes    = 16 << 20 // bytes per slice for small grids
	DefaultMinShardBytes = 512 << 10
	MaxDefaultSliceBytes = 256 << 20
	DefaultStagingBytes  = 256 << 20 // staging ring budget (D = 1 allreduce, ReduceScatter, AllGather)
	DefaultPaddingBytes  = 1 << 20   // padding ring budget
	DefaultParallelism   = 4         // slices in flight at least
	DefaultFlatThreshold = 256 << 10 // with a fixed algorithm: below this many bytes, one flat allreduce
	// DefaultAutoFlatThreshold is Auto's: below it one flat allreduce,
	// from it the size classes Auto measures.
	DefaultAutoFlatThreshold = minClassBytes
	DefaultSpin              = 200 * time.Microsecond
	// DefaultTimeout is the watchdog's time when WithTimeout is not given:
	// PyTorch's NCCL process group aborts a collective after 10 minutes by
	// default, and a trainer whose peer hangs should end, not wait forever.
	DefaultTimeout = 10 * time.Minute
)

// FlatNever, given to WithFlatThreshold, makes every call hierarchical.
const FlatNever = -1

// Option configures a Reducer. Options only record values; NewReducer
// validates them and reports the first invalid one by name.
type Option func(*config)

type config struct {
	sliceBytes    int64
	sliceSet      bool // WithSliceSize gave a size: no slice from the link model
	stagingBytes  int64
	paddingBytes  int64
	parallelism   int
	flatThreshold int64
	timeout       time.Duration
	timeoutSet    bool // WithTimeout was given (0 included: no watchdog)
	algorithm     Algorithm
	inline        bool
	spin          time.Duration
	spinSet       bool
	serialRail    bool
	serialSet     bool
	checkOff      bool
	checkAlone    time.Duration // the checker's wait for a call's data (checkAlone when 0); tests shorten or lengthen it
	// sharedMemoryDir is where a one-machine job's check maps its memory;
	// "" checks through the collective.
	sharedMemoryDir string
	sharedMemorySet bool
	checkHost       string // WithCheckHost; "": relayHost's choice
	fingerprintMax  int64
	fingerprintSet  bool
	routesOf        *Reducer // WithRoutesOf: whose route table this Reducer shares
	logger          *slog.Logger
	layout          staging.Layout // the slice and slots the options and the grid resolve to
}

// WithSliceSize sets the slice size in bytes: a tensor larger than this is
// cut into slices that go through the pipeline one after another. Zero
// means that the slice of each allreduce comes from the job's links: at its
// first hierarchical allreduce the Reducer measures the intra-machine link
// and the rail, and cuts each call into the number of slices that
// minimizes its modelled time (see Choice and doc/how-it-works.md). The staging
// slots of D = 1 and of ReduceScatter and AllGather are sized for
// DefaultSliceBytes grown with the grid (M·D·DefaultMinShardBytes, at most
// MaxDefaultSliceBytes) when it is zero.
func WithSliceSize(bytes int64) Option { return func(c *config) { c.sliceBytes = bytes } }

// WithStagingMemory sets the bytes of device memory for staging slots (the
// receive area of the collect stage when D = 1, and the gather area of
// ReduceScatter and AllGather). Zero means DefaultStagingBytes.
func WithStagingMemory(bytes int64) Option { return func(c *config) { c.stagingBytes = bytes } }

// WithPaddingMemory sets the bytes of device memory for padding slots (the
// elements of a slice that do not fill the M·D grid). Zero means
// DefaultPaddingBytes.
func WithPaddingMemory(bytes int64) Option { return func(c *config) { c.paddingBytes = bytes } }

// WithParallelism sets the minimum number of slices in flight: the staging
// and padding rings hold at least this many slots, shrinking the slice when
// the memory budget is too small. Zero means DefaultParallelism.
func WithParallelism(n int) Option { return func(c *config) { c.parallelism = n } }

// WithFlatThreshold sets the size in bytes below which a call is one flat
// allreduce on the world communicator, without measuring; with Auto the
// size classes start there. Zero means fairgo's choice:
// DefaultAutoFlatThreshold with Auto (which measures flat, its variants
// and the others from there), DefaultFlatThreshold with a fixed
// algorithm. FlatNever makes every call hierarchical: Auto then chooses
// among the two-level routes only.
func WithFlatThreshold(bytes int64) Option { return func(c *config) { c.flatThreshold = bytes } }

// WithAlgorithm fixes the algorithm of every allreduce that is not below
// the flat threshold (Auto, the default, measures and chooses per size).
// FlatRing and FlatTree need a backend that makes world variants
// (backend.Rank.Variants): without one NewReducer fails with an
// *fairgo.ArgError. The hierarchical forms (RailAllToAll, RailRSAG,
// RailAllReduce) are one flat allreduce on one machine.
func WithAlgorithm(a Algorithm) Option { return func(c *config) { c.algorithm = a } }

// WithInlineEnqueue lets a call with nothing collective to do before its
// data be enqueued on the calling goroutine, its first stage straight onto
// its After stream, when no earlier call is still waiting for the engine:
// no hand-off, no extra events. Such calls are an allreduce whose route is
// known (its size class measured, its communicator made, the links probed
// where its slices need them) and takes the call in one piece or one
// slice: flat, the hierarchy in one piece, halving-doubling, or one slice
// of the pipeline; a broadcast; and a reduce-scatter or all-gather on one
// machine. A call of several slices goes through the engine, which
// enqueues them while the caller goes on. Only turn it on when each rank
// of the process is driven by its own goroutine: NCCL's first use of a
// communicator can block the calling thread until the peers join, so one
// goroutine enqueueing for several ranks could deadlock. setup.New (one rank
// per process) turns it on.
func WithInlineEnqueue(on bool) Option { return func(c *config) { c.inline = on } }

// WithSerialRail sets how the rail's two exchanges (collect and diffuse)
// of a sliced allreduce share the network: on (the default), one after the
// other on one stream and communicator, so that a rank has at most one
// exchange on its NIC at a time; off, each on a stream and communicator of
// its own, so that the diffuse of one slice overlaps the collect of the
// next. The rail is the bottleneck either way; on NCCL's socket transport
// the second communicator's threads and flows cost more than the overlap
// gains (bench/NOTES.md).
func WithSerialRail(on bool) Option {
	return func(c *config) { c.serialRail, c.serialSet = on, true }
}

// WithCheck turns the cross-rank consistency check off (false) or on (true,
// the default). The check compares every call's shape (kind, count, element
// type, operator, root) across ranks beside the data, so that calls that
// differ between ranks fail with fairgo.ErrMismatch on every rank instead
// of hanging or returning wrong data. Off, such calls are undefined
// behaviour, as with NCCL itself. From the 129th call it is a few stores
// and loads in shared memory (WithSharedMemoryDir), the images of other
// machines' ranks brought over TCP (WithCheckHost); before, or where
// shared memory is off, a second, small collective per call, or a
// fingerprint inside a small call's data (WithFingerprintMax).
func WithCheck(on bool) Option { return func(c *config) { c.checkOff = !on } }

// WithSharedMemoryDir sets where the ranks of each machine make the memory
// through which they compare their calls (the check, WithCheck): a file
// that every rank of the machine maps, unlinked once they all have. Across
// machines (up to 32; larger jobs keep the collective check) each rank
// also sends its calls' images to the ranks of its local index on the
// other machines over TCP (WithCheckHost), which write them in their
// machine's file: directly up to four machines, through the lowest of
// those ranks from five on, where a call whose route is one collective
// carries its fingerprint instead (WithFingerprintMax). A call then costs
// the check a few stores and loads. Default DefaultSharedMemoryDir; when the ranks cannot all map
// their file there (no such file system, ranks on several hosts that
// declared one machine) or reach their peers, they check through the
// collective. "" always checks through the collective. A directory that is
// given must exist.
func WithSharedMemoryDir(dir string) Option {
	return func(c *config) { c.sharedMemoryDir, c.sharedMemorySet = dir, true }
}

// WithCheckHost sets the IPv4 address on which a rank listens for the
// check's images of the ranks of its local index on the other machines
// (the check through shared memory across two to 32 machines,
// WithSharedMemoryDir).
// Default "": the first IPv4 address of the interfaces NCCL_SOCKET_IFNAME
// names (prefixes, or exact names after "="), as NCCL's own sockets use,
// else that of the first interface that is up and not a loopback. Where a
// rank has no such address, or cannot reach a peer's, every rank checks
// through the collective.
func WithCheckHost(host string) Option { return func(c *config) { c.checkHost = host } }

// WithFingerprintMax sets the largest allreduce, in bytes, whose
// cross-rank check travels inside its own data instead of a second
// collective; 0 turns it off. Default DefaultFingerprintMax. It applies to
// sums, and to float averages on up to a few ranks (fingerprintFits in
// fingerprint.go says how many per type), with the watchdog armed
// (WithTimeout), on every route that takes the call in one piece (flat,
// the pairwise ones, the rail in one slice); other calls run the separate
// check. Max, min, product and the other averages of the same sizes carry
// a fingerprint too and run the separate check beside it, so that ranks
// whose operators differ run collectives of one size and find the mismatch
// in the fingerprint, where collectives of two sizes would wait for the
// watchdog (a rank that also runs the separate check may still wait there
// for peers that never join it). The fingerprint costs a call two device copies of its data and a
// few hundred elements more in its exchanges; the separate check is a
// second collective beside it on the same links, which on 16 machines of
// one GPU each doubled a 64 KiB call's time (BENCHMARKS.md, "The check
// carried by the data"). A difference of operator, kind, call order or
// acceptance is a *MismatchError naming the field, without the other
// ranks' values; ranks that disagree on the count or the element type
// make the exchanges themselves disagree: a rank that finds a peer's
// fingerprint missing (a *MismatchError on the size) aborts, the others
// end in that abort or the watchdog's *TimeoutError. It costs
// 2 × (this bytes + 2.4 KiB) of device memory per Reducer. Calls 1 and 65
// (whose collective checks carry the agreement on shared memory) and,
// where the ranks agreed on it, every call from the 129th on, which shared
// memory checks, carry no fingerprint: fingerprints serve the first calls,
// and jobs whose shared memory is off or out of reach.
func WithFingerprintMax(bytes int64) Option {
	return func(c *config) { c.fingerprintMax, c.fingerprintSet = bytes, true }
}

// WithRoutesOf makes the Reducer share Auto's measurements with src: the
// route src measured for each size class and the links it probed serve
// this Reducer too, and what this Reducer measures first serves src. Two
// configurations then follow the same routes in the same slices, so that a
// comparison of them (a benchmark's check on and off) measures what
// differs between them, not the noise of two calibrations. src must be a
// Reducer of the same rank (its grid place and world communicator) with
// the same flat threshold, and both must be Auto; as for any two Reducers
// over the same communicators, their calls must not be in flight at once.
func WithRoutesOf(src *Reducer) Option { return func(c *config) { c.routesOf = src } }

// WithTimeout sets the watchdog: work not complete this long after it
// could start (every earlier call done) aborts the communicators and fails
// with fairgo.ErrTimeout on every rank, so a dead or stuck peer cannot hang
// the trainer. Without this option the watchdog is armed at DefaultTimeout
// (10 minutes, as PyTorch's NCCL process group); zero turns it off (callers
// then bound every wait with their context).
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout, c.timeoutSet = d, true }
}

// WithSpin sets how long the engine goroutine polls for the next call before
// it parks, and how long Work.StreamWait polls for the enqueue before it
// blocks. Waking a parked goroutine costs the OS's scheduling latency on a
// busy host, during which a waiting GPU idles; polling trades a little CPU
// for that latency. Zero parks at once. Default DefaultSpin.
func WithSpin(d time.Duration) Option { return func(c *config) { c.spin, c.spinSet = d, true } }

// WithLogger sets the logger for the engine's rare events (aborts,
// timeouts, layout decisions), used as given. Nil means logging.Default():
// slog.Default()'s handler behind the level FAIRGO_LOG_LEVEL sets (debug,
// info, warn, error), warnings and errors only without it. Facts about the
// whole job (the links measured, each size class's choice) are logged at
// info by rank 0 and at debug by the others.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// ValidateOptions reports the first invalid option by name, as NewReducer
// would; setup code calls it before waiting on other ranks.
func ValidateOptions(opts ...Option) error {
	_, err := buildConfig(Grid{Machines: 1, Devices: 1}, opts)
	return err
}

func buildConfig(g Grid, opts []Option) (config, error) {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	bad := func(name string, v any, why string) error {
		return &fairgo.ArgError{Arg: name, Value: v, Reason: why}
	}
	switch {
	case c.sliceBytes < 0:
		return c, bad("WithSliceSize", c.sliceBytes, "must be positive, or 0 for the default")
	case c.stagingBytes < 0:
		return c, bad("WithStagingMemory", c.stagingBytes, "must be positive, or 0 for the default")
	case c.paddingBytes < 0:
		return c, bad("WithPaddingMemory", c.paddingBytes, "must be positive, or 0 for the default")
	case c.parallelism < 0:
		return c, bad("WithParallelism", c.parallelism, "must be positive, or 0 for the default")
	case c.parallelism > 1024:
		return c, bad("WithParallelism", c.parallelism, "more than 1024 slices in flight is not useful")
	case c.flatThreshold < FlatNever:
		return c, bad("WithFlatThreshold", c.flatThreshold, fmt.Sprintf("must be ≥ 0, or FlatNever (%d)", FlatNever))
	case !c.algorithm.Valid():
		return c, bad("WithAlgorithm", c.algorithm, "unknown algorithm")
	case c.timeout < 0:
		return c, bad("WithTimeout", c.timeout, "must be positive, or 0 for no watchdog")
	case c.fingerprintMax < 0:
		return c, bad("WithFingerprintMax", c.fingerprintMax, "must be positive, or 0 to turn fingerprints off")
	case c.fingerprintMax > 1<<30:
		return c, bad("WithFingerprintMax", c.fingerprintMax, "above 1 GiB the copies cost more than a separate check")
	case c.spin < 0 || c.spin > time.Second:
		return c, bad("WithSpin", c.spin, "must be between 0 and 1s")
	}
	if c.sharedMemorySet && c.sharedMemoryDir != "" {
		if st, err := os.Stat(c.sharedMemoryDir); err != nil || !st.IsDir() {
			return c, bad("WithSharedMemoryDir", c.sharedMemoryDir, "not a directory (\"\" checks through the collective)")
		}
	}
	if ip, err := netip.ParseAddr(c.checkHost); c.checkHost != "" && (err != nil || !ip.Is4()) {
		return c, bad("WithCheckHost", c.checkHost, "not an IPv4 address (\"\" picks one)")
	}
	if !c.sharedMemorySet {
		c.sharedMemoryDir = DefaultSharedMemoryDir
	}
	if !c.timeoutSet {
		c.timeout = DefaultTimeout
	}
	if !c.fingerprintSet {
		c.fingerprintMax = DefaultFingerprintMax
	}
	if !c.spinSet {
		c.spin = DefaultSpin
	}
	c.sliceSet = c.sliceBytes > 0
	if c.sliceBytes == 0 {
		c.sliceBytes = DefaultSliceBytes
		if grown := int64(g.Size()) * DefaultMinShardBytes; grown > c.sliceBytes {
			c.sliceBytes = min(grown, MaxDefaultSliceBytes)
		}
	}
	if c.stagingBytes == 0 {
		c.stagingBytes = DefaultStagingBytes
	}
	if c.paddingBytes == 0 {
		c.paddingBytes = DefaultPaddingBytes
	}
	if c.parallelism == 0 {
		c.parallelism = DefaultParallelism
	}
	if c.flatThreshold == 0 {
		c.flatThreshold = DefaultFlatThreshold
		if c.algorithm == Auto {
			c.flatThreshold = DefaultAutoFlatThreshold
		}
	}
	if c.logger == nil {
		c.logger = logging.Default()
	}
	layout, err := staging.Plan(staging.Params{
		Machines: g.Machines, Devices: g.Devices,
		SliceBytes: c.sliceBytes, StagingBytes: c.stagingBytes,
		PaddingBytes: c.paddingBytes, Parallelism: c.parallelism,
	})
	var ae *fairgo.ArgError
	if errors.As(err, &ae) {
		if opt, ok := layoutOptions[ae.Arg]; ok {
			return c, bad(opt, ae.Value, ae.Reason)
		}
	}
	if err != nil {
		return c, err
	}
	c.layout = layout
	return c, nil
}

// checkRank reports, as an *fairgo.ArgError, options that rank rk cannot
// follow: a fixed world variant (FlatRing, FlatTree) on a backend that
// makes none. NewReducer's check of the options against its rank.
func (c *config) checkRank(rk backend.Rank) error {
	if c.algorithm.variant() != "" && rk.Variants == nil {
		return errNoVariants(c.algorithm)
	}
	return nil
}

// sharedRoutes is the route table WithRoutesOf names for a Reducer of grid
// g with c, nil for a table of its own; an error where the two Reducers
// could not share one.
func (c *config) sharedRoutes(g Grid, world backend.Comm) (*routeTable, error) {
	src := c.routesOf
	if src == nil {
		return nil, nil
	}
	bad := func(why string) error {
		return &fairgo.ArgError{Arg: "WithRoutesOf", Value: src.rank.Grid, Reason: why}
	}
	switch {
	case src.rank.Grid != g:
		return nil, bad(fmt.Sprintf(
			"a Reducer of another grid than this one's %v (only Reducers of one rank share routes)", g))
	case !sameComm(src.rank.Comms.World, world):
		return nil, bad("a Reducer over another world communicator (only Reducers of one rank of one job share routes)")
	case src.cfg.flatThreshold != c.flatThreshold:
		return nil, bad(fmt.Sprintf("its flat threshold %d differs from this one's %d (their size classes would differ)",
			src.cfg.flatThreshold, c.flatThreshold))
	case src.cfg.algorithm != Auto || c.algorithm != Auto:
		return nil, bad(fmt.Sprintf("both Reducers must be Auto (they are %v and %v)", src.cfg.algorithm, c.algorithm))
	}
	return src.router.table, nil
}

// sameComm reports whether a and b are one communicator, where their
// dynamic types can tell (a type that cannot be compared is taken on
// trust).
func sameComm(a, b backend.Comm) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb {
		return false
	}
	if ta == nil || !ta.Comparable() {
		return true
	}
	return a == b
}

// layoutOptions are the options behind staging's parameters, for its
// errors.
var layoutOptions = map[string]string{
	"Parallelism": "WithParallelism", "StagingBytes": "WithStagingMemory", "PaddingBytes": "WithPaddingMemory",
}
