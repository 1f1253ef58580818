package rendezvous

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/fairgo/fairgo"
)

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) (string, int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr, ln.Addr().(*net.TCPAddr).Port
}

func TestOpenMemory(t *testing.T) {
	ctx := testCtx(t)
	for _, l := range []Launch{
		{WorldSize: 1, LocalWorldSize: 1},
		{WorldSize: 1, LocalWorldSize: 1, StoreKind: StoreRank0, StoreAddr: "127.0.0.1:1"},
	} {
		s, err := Open(ctx, l)
		require.NoError(t, err)
		require.Equal(t, StoreMemory, s.Kind)
		require.NoError(t, s.Set(ctx, "k", []byte("v")))
		require.NoError(t, s.Leave(ctx))
		require.ErrorIs(t, s.Set(ctx, "k", nil), ErrClosed)
	}
	// A Launch made by hand for several processes needs an address.
	_, err := Open(ctx, Launch{WorldSize: 2, LocalWorldSize: 1})
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = Open(ctx, Launch{Rank: 2, WorldSize: 2, LocalWorldSize: 1})
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	//lint:ignore SA1012 a nil ctx is what is tested
	_, err = Open(nil, Launch{WorldSize: 1}) //nolint:staticcheck
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
	_, err = Open(ctx, Launch{WorldSize: 2, StoreAddr: "127.0.0.1:1"}, WithDialOptions(WithRetryInterval(-1)))
	require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
}

// Four ranks in one process, rank 0 hosting: they meet, and Leave keeps
// the server up until every other rank has left.
func TestOpenRank0AndLeave(t *testing.T) {
	ctx := testCtx(t)
	_, port := deadAddr(t)
	const world = 4
	env := func(r int) map[string]string {
		return map[string]string{
			"RANK":             strconv.Itoa(r),
			"WORLD_SIZE":       strconv.Itoa(world),
			"LOCAL_RANK":       "0",
			"LOCAL_WORLD_SIZE": "1",
			"MASTER_ADDR":      "127.0.0.1",
			"MASTER_PORT":      "1",
			EnvStorePort:       strconv.Itoa(port),
			EnvStoreToken:      "tok",
		}
	}
	stores := make([]*LaunchStore, world)
	var g errgroup.Group
	for r := range world {
		g.Go(func() error {
			l, err := FromLookup(lookupMap(env(r)))
			if err != nil {
				return err
			}
			stores[r], err = Open(ctx, l, WithOpenLogger(quiet))
			return err
		})
	}
	require.NoError(t, g.Wait())
	require.True(t, stores[0].Hosting())
	require.NotNil(t, stores[0].Server())
	for r, s := range stores {
		require.Equal(t, StoreRank0, s.Kind)
		require.Equal(t, r == 0, s.Hosting())
		_, err := s.Add(ctx, "n", 1)
		require.NoError(t, err)
	}
	v, err := stores[3].Get(ctx, "n")
	require.NoError(t, err)
	require.Equal(t, "4", string(v))

	// The host leaves first: it keeps serving while ranks 1 and 2 still work.
	left := make(chan error, 1)
	go func() { left <- stores[0].Leave(ctx) }()
	for _, r := range []int{1, 2} {
		require.NoError(t, stores[r].Set(ctx, "still", []byte("here")))
		require.NoError(t, stores[r].Leave(ctx))
	}
	select {
	case err := <-left:
		t.Fatalf("the host left before rank 3: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	v, err = stores[3].Get(ctx, "still")
	require.NoError(t, err)
	require.Equal(t, "here", string(v))
	require.NoError(t, stores[3].Leave(ctx))
	require.NoError(t, <-left)
	waitFor(t, "the server to stop", func() bool { return stores[0].Server().isClosed() })
}

// A rank that cannot reach its store fails before its ctx ends, saying
// where it tried, what launched it and what it read.
func TestOpenErrorWhenNothingAnswers(t *testing.T) {
	dead, port := deadAddr(t)
	ps := strconv.Itoa(port)
	torch := func(extra map[string]string) map[string]string {
		m := map[string]string{
			"RANK":             "1",
			"WORLD_SIZE":       "2",
			"LOCAL_RANK":       "1",
			"LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR":      "127.0.0.1",
			"MASTER_PORT":      ps,
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	storePort := strconv.Itoa(port + 1)
	for _, tc := range []struct {
		name     string
		env      map[string]string
		addr     string
		launcher string
		kind     string
		mentions []string
	}{
		{"torchrun agent store", torch(map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "True",
			"TORCHELASTIC_RUN_ID": "r"}), dead, "torchrun", StoreC10d,
			[]string{"torchrun's agent store", `TORCHELASTIC_USE_AGENT_STORE="True"`, `MASTER_PORT="` + ps + `"`}},
		{"torchrun without agent store", torch(map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "False",
			"TORCHELASTIC_RUN_ID": "r", EnvStorePort: storePort}), "127.0.0.1:" + storePort, "torchrun", StoreRank0,
			[]string{"the store rank 0 hosts", `FAIRGO_STORE_PORT="` + storePort + `"`}},
		{"env", torch(nil), "127.0.0.1:" + strconv.Itoa(port+1), "env", StoreRank0,
			[]string{`RANK="1"`, "TORCHELASTIC_USE_AGENT_STORE unset"}},
		{"fairrun", torch(map[string]string{EnvStoreAddr: dead, EnvStoreToken: "secret"}), dead, "fairrun", StoreFairgo,
			[]string{"the fairgo store", `FAIRGO_STORE_ADDR="` + dead + `"`, `FAIRGO_STORE_TOKEN="(hidden)"`}},
		{"slurm", map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
			"SLURM_NTASKS_PER_NODE": "1", "SLURM_NODELIST": "127.0.0.1",
			"MASTER_PORT": ps}, "127.0.0.1:" + strconv.Itoa(port+1), "slurm", StoreRank0, []string{
			`SLURM_NODELIST="127.0.0.1"`, "MASTER_ADDR unset",
		}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
			"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": ps}, "127.0.0.1:" + strconv.Itoa(port+1), "openmpi",
			StoreRank0, []string{`OMPI_COMM_WORLD_RANK="1"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, err := FromLookup(lookupMap(tc.env))
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			_, err = Open(ctx, l, WithOpenLogger(quiet), WithDialOptions(WithRetryInterval(20*time.Millisecond)))
			require.Error(t, err)
			require.NoError(t, ctx.Err(), "Open must fail before its ctx ends (took %v)", time.Since(start))
			var oe *OpenError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, tc.addr, oe.Addr)
			require.Equal(t, tc.launcher, oe.Launcher)
			require.Equal(t, tc.kind, oe.Kind)
			require.ErrorIs(t, err, ErrUnreachable)
			require.ErrorIs(t, err, fairgo.ErrTimeout)
			msg := err.Error()
			require.Contains(t, msg, tc.addr)
			require.Contains(t, msg, "launcher "+tc.launcher)
			require.Contains(t, msg, "rank 1 of 2")
			require.Contains(t, msg, "variables read:")
			require.Contains(t, msg, "connection refused")
			for _, m := range tc.mentions {
				require.Contains(t, msg, m)
			}
			require.NotContains(t, msg, "secret")
		})
	}
}

func TestOpenHostErrors(t *testing.T) {
	ctx := testCtx(t)
	// The port is taken.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	l, err := FromLookup(
		lookupMap(map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(taken - 1)}),
	)
	require.NoError(t, err)
	_, err = Open(ctx, l, WithOpenLogger(quiet))
	var oe *OpenError
	require.ErrorAs(t, err, &oe)
	require.True(t, oe.Hosting)
	require.Contains(t, err.Error(), "could not host the store at 127.0.0.1:"+strconv.Itoa(taken))
	require.Contains(t, err.Error(), EnvStorePort)

	// MASTER_ADDR is not this machine (TEST-NET-1, RFC 5737).
	l.MasterAddr, l.StoreAddr = "192.0.2.1", "192.0.2.1:29501"
	_, err = Open(ctx, l, WithOpenLogger(quiet))
	require.ErrorAs(t, err, &oe)
	require.Contains(t, err.Error(), "MASTER_ADDR must name rank 0's machine")
	// WithBindHost listens elsewhere.
	_, free := deadAddr(t)
	l.StoreAddr = net.JoinHostPort("192.0.2.1", strconv.Itoa(free))
	s, err := Open(ctx, l, WithOpenLogger(quiet), WithBindHost("127.0.0.1"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:"+strconv.Itoa(free), s.Addr)
	require.NoError(t, s.Close())
}

// A rank with the wrong token is refused at once, not at its deadline.
func TestOpenWrongToken(t *testing.T) {
	ctx := testCtx(t)
	_, port := deadAddr(t)
	env := func(r int, tok string) map[string]string {
		return map[string]string{
			"OMPI_COMM_WORLD_RANK":       strconv.Itoa(r),
			"OMPI_COMM_WORLD_SIZE":       "2",
			"OMPI_COMM_WORLD_LOCAL_RANK": "0",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "1",
			"MASTER_ADDR":                "127.0.0.1",
			EnvStorePort:                 strconv.Itoa(port),
			EnvStoreToken:                tok,
		}
	}
	l0, err := FromLookup(lookupMap(env(0, "right")))
	require.NoError(t, err)
	host, err := Open(ctx, l0, WithOpenLogger(quiet))
	require.NoError(t, err)
	defer host.Close()
	l1, err := FromLookup(lookupMap(env(1, "wrong")))
	require.NoError(t, err)
	start := time.Now()
	_, err = Open(ctx, l1, WithOpenLogger(quiet))
	require.ErrorIs(t, err, ErrUnauthorized)
	require.NotErrorIs(t, err, ErrUnreachable)
	require.Less(t, time.Since(start), 2*time.Second)
	var oe *OpenError
	require.ErrorAs(t, err, &oe)
	require.Contains(t, err.Error(), `FAIRGO_STORE_TOKEN="(hidden)"`)
}
