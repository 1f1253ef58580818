package topology

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/logging"
	"github.com/fairgo/fairgo/rendezvous"
)

// Keys Discover uses in its store (under whatever prefix the caller chose).
const (
	keyMember  = "topology/member/" // + rank
	keyJoined  = "topology/joined"
	keyMembers = "topology/members"
)

// diagnoseTimeout bounds the store reads that describe an incomplete world.
const diagnoseTimeout = 2 * time.Second

// IncompleteError: the context ended before every rank joined. It lists
// the ranks that never reported and what the others reported, and unwraps
// to ErrIncomplete, fairgo.ErrTimeout (a rank that did not come in time,
// as the watchdog's and the simulator's stalls) and the context's error.
type IncompleteError struct {
	WorldSize int
	Missing   []int           // ranks that did not report (nil when unknown)
	Machines  []MachineReport // what the ranks that did report said
	Err       error           // the context's error
}

func (e *IncompleteError) Error() string {
	missing := fmt.Sprint(e.Missing)
	if e.Missing == nil {
		missing = "(unknown)"
	}
	return fmt.Sprintf("%v: %d of %d ranks reported before %v; missing ranks %s; reported:%s",
		ErrIncomplete, e.WorldSize-len(e.Missing), e.WorldSize, e.Err, missing, reportLines(e.Machines))
}

// Unwrap returns ErrIncomplete, fairgo.ErrTimeout and the context's error.
func (e *IncompleteError) Unwrap() []error { return []error{ErrIncomplete, fairgo.ErrTimeout, e.Err} }

// Self describes this process as a Member.
type Self struct {
	Host Host // environment, hostname and files; zero: the OS's
	// Ordinal is the CUDA device ordinal this rank uses; DefaultOrdinal
	// gives the usual one.
	Ordinal int
	// NVML describes devices; nil: OpenNVML is tried (and closed again),
	// falling back to the environment when it fails.
	NVML NVML
	// NoNVML skips NVML even when it is available.
	NoNVML bool
	Logger *slog.Logger // nil: logging.Default() (FAIRGO_LOG_LEVEL, warn without it)
}

// Describe returns this process's Member (Rank and WorldSize left for
// Discover to fill).
func (s Self) Describe() (Member, error) {
	log := s.Logger
	if log == nil {
		log = logging.Default()
	}
	id, err := MachineIdentity(s.Host)
	if err != nil {
		return Member{}, err
	}
	host, _ := s.Host.hostname()
	nv := s.NVML
	if nv == nil && !s.NoNVML {
		if lib, err := OpenNVML(); err == nil {
			defer lib.Close()
			nv = lib
		} else {
			log.Debug("topology: describing the device without NVML", "err", err)
		}
	}
	dev, err := DescribeDevice(s.Ordinal, s.Host.rawLookup, nv)
	if err != nil {
		return Member{}, err
	}
	return Member{MachineID: id.ID, MachineSource: id.Source, Hostname: host, Device: dev}, nil
}

// Discover publishes self as rank rank of worldSize through store and returns
// the layout every rank computes, once every rank has joined. Use a fresh
// store prefix (rendezvous.WithPrefix) for each discovery. When ctx ends
// first the error is an *IncompleteError listing who reported.
func Discover(ctx context.Context, store rendezvous.Store, rank, worldSize int, self Member) (*Layout, error) {
	if worldSize < 1 {
		return nil, &fairgo.ArgError{Arg: "world size", Value: worldSize, Reason: "must be at least 1"}
	}
	if rank < 0 || rank >= worldSize {
		return nil, &fairgo.ArgError{Arg: "rank", Value: rank, Reason: fmt.Sprintf("outside [0, %d)", worldSize)}
	}
	self.Rank, self.WorldSize = rank, worldSize
	blob, err := json.Marshal(self)
	if err != nil {
		return nil, fmt.Errorf("topology: encode member: %w", err)
	}
	fail := func(err error) (*Layout, error) {
		if ctx.Err() != nil {
			return nil, incomplete(ctx, store, worldSize)
		}
		return nil, fmt.Errorf("topology: rendezvous: %w", err)
	}
	if err := store.Set(ctx, keyMember+strconv.Itoa(rank), blob); err != nil {
		return fail(err)
	}
	n, err := store.Add(ctx, keyJoined, 1)
	if err != nil {
		return fail(err)
	}
	if n > int64(worldSize) {
		return nil, fmt.Errorf(
			"topology: %d ranks joined a world of %d: the store prefix was used before, or ranks disagree on the world size",
			n,
			worldSize,
		)
	}
	if n == int64(worldSize) {
		// The last to join gathers everyone (all members are in the store
		// before their Add) and publishes the list for all.
		all := make([]json.RawMessage, worldSize)
		for r := range worldSize {
			v, err := store.Get(ctx, keyMember+strconv.Itoa(r))
			if err != nil {
				return fail(err)
			}
			all[r] = v
		}
		list, err := json.Marshal(all)
		if err != nil {
			return nil, fmt.Errorf("topology: encode members: %w", err)
		}
		if err := store.Set(ctx, keyMembers, list); err != nil {
			return fail(err)
		}
	}
	list, err := store.Get(ctx, keyMembers)
	if err != nil {
		return fail(err)
	}
	var members []Member
	if err := json.Unmarshal(list, &members); err != nil {
		return nil, fmt.Errorf("topology: decode members: %w", err)
	}
	if len(members) != worldSize {
		return nil, fmt.Errorf(
			"topology: %d members published for a world of %d: ranks disagree on the world size",
			len(members),
			worldSize,
		)
	}
	return Build(members, rank)
}

// incomplete describes who reported, reading the store without blocking.
func incomplete(ctx context.Context, store rendezvous.Store, worldSize int) error {
	e := &IncompleteError{WorldSize: worldSize, Err: ctx.Err()}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), diagnoseTimeout)
	defer cancel()
	// CompareSet with an expected value nobody stores reads without
	// blocking: a missing key returns the expected value and stays missing.
	probe := []byte("\x00topology-probe\x00")
	var members []Member
	var missing []int
	for r := range worldSize {
		v, err := store.CompareSet(dctx, keyMember+strconv.Itoa(r), probe, probe)
		if err != nil {
			return e // the store is gone too: report what we know
		}
		var m Member
		if string(v) == string(probe) || json.Unmarshal(v, &m) != nil {
			missing = append(missing, r)
			continue
		}
		members = append(members, m)
	}
	e.Missing, e.Machines = missing, Reports(members)
	if e.Missing == nil {
		e.Missing = []int{}
	}
	return e
}
