package launch

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestTorchrunHabits: the flags torchrun users type, mapped onto fairrun's
// (a fixed number of nodes), and refused where fairrun cannot do what they
// ask, naming the flag as typed.
func TestTorchrunHabits(t *testing.T) {
	type want struct {
		nproc, nnodes, nodeRank, port, restarts int
		addr, backend, id                       string
		noPython                                bool
	}
	for _, tc := range []struct {
		name string
		args string
		want want
		flag string // the flag a UsageError names; "-": a usage error of the flag package
		msg  string // in the error's text
	}{
		{name: "one worker by default", args: "-- p",
			want: want{nproc: 1, nnodes: 1, addr: DefaultMasterAddr}},
		{name: "--no-python changes nothing", args: "--no-python --nproc-per-node 2 -- python3 train.py",
			want: want{nproc: 2, nnodes: 1, addr: DefaultMasterAddr, noPython: true}},
		{name: "--no_python", args: "--no_python -- p",
			want: want{nproc: 1, nnodes: 1, addr: DefaultMasterAddr, noPython: true}},
		{name: "max restarts", args: "--max-restarts 3 -- p",
			want: want{nproc: 1, nnodes: 1, addr: DefaultMasterAddr, restarts: 3}},
		{name: "max_restarts", args: "--max_restarts=2 -- p",
			want: want{nproc: 1, nnodes: 1, addr: DefaultMasterAddr, restarts: 2}},
		{name: "negative restarts", args: "--max-restarts -1 -- p", flag: "max-restarts", msg: "--max-restarts -1: negative"},
		{name: "a fixed range", args: "--nnodes 2:2 --node-rank 1 --master-addr h0 -- p",
			want: want{nproc: 1, nnodes: 2, nodeRank: 1, addr: "h0", port: DefaultMasterPort}},
		{name: "an elastic range", args: "--nnodes 1:2 -- p", flag: "-",
			msg: `invalid value "1:2" for flag --nnodes: elastic ranges MIN:MAX are not supported`},
		{name: "an elastic range, underscores", args: "--nnodes=1:4 -- p", flag: "-", msg: "(--nnodes 4, or 4:4)"},
		{name: "nodes not a number", args: "--nnodes two -- p", flag: "-", msg: "not a number of nodes"},
		{name: "c10d rendezvous", args: "--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint h0:29400 " +
			"--rdzv-id job7 -- p",
			want: want{nproc: 4, nnodes: 2, addr: "h0", port: 29400, backend: RdzvC10d, id: "job7"}},
		{name: "rdzv with underscores", args: "--nnodes 2 --node_rank 1 --rdzv_backend=static " +
			"--rdzv_endpoint 10.0.0.1:1234 -- p",
			want: want{nproc: 1, nnodes: 2, nodeRank: 1, addr: "10.0.0.1", port: 1234, backend: RdzvStatic}},
		{name: "endpoint without a port", args: "--nnodes 2 --rdzv-endpoint h0 -- p",
			want: want{nproc: 1, nnodes: 2, addr: "h0", port: DefaultRdzvPort}},
		{name: "IPv6 endpoint", args: "--nnodes 2 --rdzv-endpoint [fd00::1]:29400 -- p",
			want: want{nproc: 1, nnodes: 2, addr: "fd00::1", port: 29400}},
		{name: "one node on a free port", args: "--rdzv-backend c10d --rdzv-endpoint localhost:0 -- p",
			want: want{nproc: 1, nnodes: 1, addr: "localhost", backend: RdzvC10d}},
		{name: "several nodes on a free port", args: "--nnodes 2 --rdzv-endpoint h0:0 -- p", flag: "rdzv-endpoint",
			msg: "--rdzv-endpoint h0:0: port 0 (a free port) is for one node"},
		{name: "a port that is not one", args: "--rdzv-endpoint h0:x -- p", flag: "rdzv-endpoint",
			msg: "--rdzv-endpoint h0:x: the port is not a number in [0, 65534]"},
		{name: "etcd", args: "--rdzv-backend etcd -- p", flag: "-",
			msg: `invalid value "etcd" for flag --rdzv-backend: not one of c10d, static`},
		{name: "endpoint and master address", args: "--nnodes 2 --rdzv-endpoint h0:1 --master-addr h1 -- p",
			flag: "master-addr", msg: "not allowed with --rdzv-endpoint"},
		{name: "endpoint and standalone", args: "--standalone --rdzv-endpoint h0:1 -- p", flag: "rdzv-endpoint",
			msg: "not allowed with --standalone"},
		{name: "backend without endpoint", args: "--nnodes 2 --rdzv-backend c10d -- p", flag: "rdzv-backend",
			msg: "needs --rdzv-endpoint HOST:PORT"},
		{name: "endpoint without a host", args: "--nnodes 2 --rdzv-endpoint :29400 -- p", flag: "rdzv-endpoint",
			msg: "no host"},
		{name: "endpoint port too large", args: "--nnodes 2 --rdzv-endpoint h0:65535 -- p", flag: "rdzv-endpoint",
			msg: "--rdzv-endpoint h0:65535: the port"},
		{name: "an unknown flag as typed", args: "--bogus -- p", flag: "-", msg: "flag provided but not defined: --bogus"},
		{name: "one dash as typed", args: "-bogus -- p", flag: "-", msg: "flag provided but not defined: -bogus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseArgs(strings.Fields(tc.args))
			if tc.flag != "" {
				require.ErrorIs(t, err, ErrUsage)
				require.ErrorContains(t, err, tc.msg)
				if tc.flag != "-" {
					var ue *UsageError
					require.ErrorAs(t, err, &ue)
					require.Equal(t, tc.flag, ue.Flag)
				}
				return
			}
			require.NoError(t, err)
			got := want{
				nproc: c.NProcPerNode, nnodes: c.NNodes, nodeRank: c.NodeRank, port: c.MasterPort,
				restarts: c.MaxRestarts, addr: c.MasterAddr, backend: c.RdzvBackend, id: c.RdzvID, noPython: c.NoPython,
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestRdzvNodeRank: with --rdzv-endpoint and no --node-rank, the endpoint's
// host is node rank 0 and any other node is asked for its --node-rank.
func TestRdzvNodeRank(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		rank       int
		msg        string
	}{
		{name: "the endpoint's host", args: "--nnodes 2 --rdzv-endpoint 127.0.0.1:29400 -- p"},
		{name: "another node", args: "--nnodes 3 --rdzv-endpoint 192.0.2.1:29400 -- p",
			msg: "--rdzv-endpoint 192.0.2.1:29400: 192.0.2.1 is not this node, so it is not node rank 0: " +
				"give this node's --node-rank in [1, 3)"},
		{name: "another node with its rank", args: "--nnodes 3 --node-rank 2 --rdzv-endpoint 192.0.2.1:29400 -- p",
			rank: 2},
		{name: "the host as a second node", args: "--nnodes 2 --node-rank 1 --rdzv-endpoint 127.0.0.1 -- p", rank: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseArgs(strings.Fields(tc.args))
			require.NoError(t, err)
			c.Env = []string{}
			c, err = Resolve(c)
			if tc.msg != "" {
				require.ErrorIs(t, err, ErrUsage)
				require.EqualError(t, err, "fairrun: "+tc.msg+" (fairrun runs a fixed set of nodes and hands out no node ranks)")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.rank, c.NodeRank)
		})
	}
}

// TestRunMaxRestarts: after a worker fails the whole group starts again,
// up to --max-restarts times, each attempt told its count; without
// restarts left the failure's code is fairrun's.
func TestRunMaxRestarts(t *testing.T) {
	// Every worker prints its attempt; rank 1 fails the first two, once rank
	// 0 has printed its line (a marker file in $MARKS): on a loaded host the
	// group was torn down before rank 0's shell got to its echo.
	script := `echo "attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS id $TORCHELASTIC_RUN_ID"; ` +
		`[ "$RANK" != 0 ] || : > "$MARKS/$TORCHELASTIC_RESTART_COUNT"; ` +
		`[ "$RANK" != 1 ] || [ "$TORCHELASTIC_RESTART_COUNT" -ge 2 ] || { i=0; ` +
		`while [ ! -e "$MARKS/$TORCHELASTIC_RESTART_COUNT" ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; exit 3; }`
	for _, tc := range []struct {
		restarts, code, attempts int
	}{
		{restarts: 2, code: 0, attempts: 3},
		{restarts: 1, code: 3, attempts: 2},
		{restarts: 0, code: 3, attempts: 1},
	} {
		var so, se syncBuffer
		t.Setenv("MARKS", t.TempDir())
		c, err := ParseArgs([]string{
			"--nproc-per-node", "2", "--max-restarts", itoa(tc.restarts), "--rdzv-id", "j1", "--grace", "1s",
			"--", "sh", "-c", script,
		})
		require.NoError(t, err)
		c.Stdout, c.Stderr = &so, &se
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		code, err := Run(ctx, c)
		cancel()
		require.Equal(t, tc.code, code, "restarts %d: %v\n%s", tc.restarts, err, se.String())
		for a := range tc.attempts {
			require.Contains(t, so.String(), "[0] attempt "+itoa(a)+" of "+itoa(tc.restarts)+" id j1")
		}
		require.NotContains(t, so.String(), "attempt "+itoa(tc.attempts)+" ")
		require.Equal(t, tc.attempts-1, strings.Count(se.String(), "starting the group again"), se.String())
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
