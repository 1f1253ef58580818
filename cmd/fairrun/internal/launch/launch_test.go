package launch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/cmd/fairrun/internal/netbed"
	tbinfo "github.com/fairgo/fairgo/internal/harness"
	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

// Binaries built once for the package's tests.
var (
	buildOnce             sync.Once
	buildErr              error
	workerBin, fairrunBin string
)

func binaries(t *testing.T) (worker, fairrun string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fairrun-test")
		if err != nil {
			buildErr = err
			return
		}
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "go"
		}
		workerBin, fairrunBin = filepath.Join(dir, "gridworker"), filepath.Join(dir, "fairrun")
		for bin, pkg := range map[string]string{
			workerBin:  "github.com/fairgo/fairgo/internal/gridworker",
			fairrunBin: "github.com/fairgo/fairgo/cmd/fairrun",
		} {
			out, err := exec.Command(goBin, "build", "-o", bin, pkg).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	require.NoError(t, buildErr)
	return workerBin, fairrunBin
}

func TestMain(m *testing.M) {
	if role := os.Getenv(envRole); role != "" {
		os.Exit(runRole(role))
	}
	code := m.Run()
	if workerBin != "" {
		os.RemoveAll(filepath.Dir(workerBin))
	}
	os.Exit(code)
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args string
		want Config
		flag string // the flag a UsageError must name; "-": any usage error
	}{
		{name: "minimal", args: "--nproc-per-node 2 -- prog a -b",
			want: Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "prog", Args: []string{"a", "-b"}}},
		{name: "no dashes", args: "-nproc-per-node=1 prog",
			want: Config{NProcPerNode: 1, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "prog", Args: []string{}}},
		{name: "everything", args: "--nproc-per-node 4 --nnodes 2 --node-rank 1 --master-addr h0 " +
			"--master-port 1234 --emulate-machines 2 --gpus 2 --shuffle-ranks 9 --grace 2s -- p",
			want: Config{NProcPerNode: 4, NNodes: 2, NodeRank: 1, MasterAddr: "h0", MasterPort: 1234,
				EmulateMachines: 2, GPUs: 2, Shuffle: true, ShuffleSeed: 9, Grace: 2 * time.Second, MPS: MPSAuto,
				Program: "p", Args: []string{}}},
		{name: "several nodes default port", args: "--nproc-per-node 1 --nnodes 2 --master-addr h0 -- p",
			want: Config{NProcPerNode: 1, NNodes: 2, MasterAddr: "h0", MasterPort: DefaultMasterPort,
				Grace: DefaultGrace, MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "one worker when --nproc-per-node is left out", args: "-- p",
			want: Config{NProcPerNode: 1, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "no workers", args: "--nproc-per-node 0 -- p", flag: "nproc-per-node"},
		{name: "no program", args: "--nproc-per-node 2 --", flag: "-"},
		{name: "unknown flag", args: "--nproc 2 -- p", flag: "-"},
		{name: "bad seed", args: "--nproc-per-node 2 --shuffle-ranks x -- p", flag: "-"},
		{name: "node rank too large", args: "--nproc-per-node 2 --nnodes 2 --master-addr h0 --node-rank 2 -- p",
			flag: "node-rank"},
		{name: "free port with several nodes",
			args: "--nproc-per-node 2 --nnodes 2 --master-addr h0 --master-port 0 -- p", flag: "master-port"},
		{name: "port out of range", args: "--nproc-per-node 2 --master-port 70000 -- p", flag: "master-port"},
		{name: "indivisible emulation", args: "--nproc-per-node 6 --emulate-machines 4 -- p", flag: "emulate-machines"},
		{name: "negative gpus", args: "--nproc-per-node 2 --gpus -1 -- p", flag: "gpus"},
		{name: "testbed", args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 10 --nic-latency 50us --mps on -- p",
			want: Config{NProcPerNode: 4, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2,
				NICGbit: 10, NICLatency: 50 * time.Microsecond, MPS: MPSOn, Grace: DefaultGrace,
				Program: "p", Args: []string{}}},
		{name: "fractional rate, mps off", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 0.5 --mps off -- p",
			want: Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2, NICGbit: 0.5,
				MPS: MPSOff, Grace: DefaultGrace, Program: "p", Args: []string{}}},
		{name: "store bind", args: "--nproc-per-node 2 --nnodes 2 --master-addr 10.0.0.1 --store-bind 0.0.0.0 -- p",
			want: Config{NProcPerNode: 2, NNodes: 2, MasterAddr: "10.0.0.1", MasterPort: DefaultMasterPort,
				StoreBind: "0.0.0.0", MPS: MPSAuto, Grace: DefaultGrace, Program: "p", Args: []string{}}},
		{name: "zero rate", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 0 -- p", flag: "nic-gbit"},
		{name: "negative rate", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit -1 -- p", flag: "nic-gbit"},
		{name: "rate too high", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10000 -- p", flag: "nic-gbit"},
		{name: "rate not a number", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit fast -- p", flag: "-"},
		{name: "NaN rate", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit NaN -- p", flag: "nic-gbit"},
		{name: "nic without emulation", args: "--nproc-per-node 2 --nic-gbit 10 -- p", flag: "nic-gbit"},
		{name: "nic on several nodes",
			args: "--nproc-per-node 2 --nnodes 2 --emulate-machines 2 --nic-gbit 10 -- p", flag: "nic-gbit"},
		{name: "nic with master addr",
			args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --master-addr 127.0.0.1 -- p",
			flag: "master-addr"},
		{name: "nic with store bind",
			args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --store-bind 127.0.0.1 -- p",
			flag: "store-bind"},
		{name: "too many nic machines", args: "--nproc-per-node 254 --emulate-machines 254 --nic-gbit 10 -- p",
			flag: "emulate-machines"},
		{name: "negative latency",
			args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-latency -1ms -- p",
			flag: "nic-latency"},
		{name: "latency too large",
			args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-latency 2s -- p", flag: "nic-latency"},
		{name: "latency without nic", args: "--nproc-per-node 2 --emulate-machines 2 --nic-latency 1ms -- p",
			flag: "nic-latency"},
		{name: "queue and rto_min", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 2.5 --nic-queue 16ms " +
			"--nic-rto-min 0 -- p",
			want: Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2, NICGbit: 2.5,
				NICQueue: 16 * time.Millisecond, MPS: MPSAuto, Grace: DefaultGrace, Program: "p", Args: []string{}}},
		{name: "zero queue", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-queue 0 -- p",
			flag: "nic-queue"},
		{name: "queue too long", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-queue 2s -- p",
			flag: "nic-queue"},
		{name: "queue without nic", args: "--nproc-per-node 2 --emulate-machines 2 --nic-queue 8ms -- p",
			flag: "nic-queue"},
		{name: "rto_min not whole ms",
			args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-rto-min 2500us -- p", flag: "nic-rto-min"},
		{name: "negative rto_min", args: "--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-rto-min -5ms -- p",
			flag: "nic-rto-min"},
		{name: "rto_min without nic", args: "--nproc-per-node 2 --emulate-machines 2 --nic-rto-min 5ms -- p",
			flag: "nic-rto-min"},
		{name: "bad mps", args: "--nproc-per-node 2 --mps yes -- p", flag: "-"},
		{name: "shaped loopback", args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 " +
			"--nvlink-gbit 20 --mps on -- p",
			want: Config{NProcPerNode: 4, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2,
				NICGbit: 2.5, NVLinkGbit: 20, MPS: MPSOn, Grace: DefaultGrace, Program: "p", Args: []string{}}},
		{name: "loopback without nic", args: "--nproc-per-node 4 --emulate-machines 2 --nvlink-gbit 20 -- p",
			flag: "nvlink-gbit"},
		{name: "zero loopback rate",
			args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 --nvlink-gbit 0 -- p", flag: "nvlink-gbit"},
		{name: "negative loopback rate",
			args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 --nvlink-gbit -1 -- p", flag: "nvlink-gbit"},
		{name: "NaN loopback rate",
			args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 --nvlink-gbit NaN -- p",
			flag: "nvlink-gbit"},
		{name: "loopback rate too high",
			args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 --nvlink-gbit 2000 -- p",
			flag: "nvlink-gbit"},
		{name: "loopback rate not a number",
			args: "--nproc-per-node 4 --emulate-machines 2 --nic-gbit 2.5 --nvlink-gbit fast -- p", flag: "-"},
		{name: "store bind with port", args: "--nproc-per-node 2 --store-bind 127.0.0.1:80 -- p", flag: "store-bind"},
		{name: "help", args: "--help", flag: "help"},
		{name: "h", args: "-h -- p", flag: "help"},
		{name: "torchrun's underscores", args: "--nproc_per_node 4 --nnodes 2 --node_rank 1 --master_addr h0 " +
			"--master_port 1234 --emulate_machines 2 --gpus 2 --shuffle_ranks 9 --grace 2s -- p",
			want: Config{NProcPerNode: 4, NNodes: 2, NodeRank: 1, MasterAddr: "h0", MasterPort: 1234,
				EmulateMachines: 2, GPUs: 2, Shuffle: true, ShuffleSeed: 9, Grace: 2 * time.Second, MPS: MPSAuto,
				Program: "p", Args: []string{}}},
		{name: "underscores of the testbed", args: "--nproc_per_node 4 --emulate_machines 2 --nic_gbit 2.5 " +
			"--nic_latency 1ms --nvlink_gbit 20 --store_bind= -- p",
			want: Config{NProcPerNode: 4, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2, NICGbit: 2.5,
				NICLatency: time.Millisecond, NVLinkGbit: 20,
				MPS: MPSAuto, Grace: DefaultGrace, Program: "p", Args: []string{}}},
		{name: "underscore checks as hyphen", args: "--nproc_per_node 2 --emulate_machines 2 --nic_gbit 0 -- p",
			flag: "nic-gbit"},
		{name: "standalone", args: "--standalone --nproc_per_node 2 -- p a",
			want: Config{NProcPerNode: 2, NNodes: 1, Standalone: true, MasterAddr: DefaultMasterAddr,
				Grace: DefaultGrace, MPS: MPSAuto, Program: "p", Args: []string{"a"}}},
		{name: "standalone, one node said", args: "--standalone --nnodes 1 --nproc-per-node 2 " +
			"--emulate-machines 2 --nic-gbit 10 -- p",
			want: Config{NProcPerNode: 2, NNodes: 1, Standalone: true, MasterAddr: DefaultMasterAddr,
				EmulateMachines: 2, NICGbit: 10, Grace: DefaultGrace, MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "standalone on several nodes", args: "--standalone --nnodes 2 --nproc-per-node 2 -- p", flag: "nnodes"},
		{name: "standalone with a master", args: "--standalone --master_addr 10.0.0.1 --nproc-per-node 2 -- p",
			flag: "master-addr"},
		{name: "standalone with the default master said",
			args: "--standalone --master-addr 127.0.0.1 --nproc-per-node 2 -- p", flag: "master-addr"},
		{name: "standalone with a port", args: "--standalone --master_port 29500 --nproc-per-node 2 -- p",
			flag: "master-port"},
		{name: "standalone=false", args: "--standalone=false --nnodes 2 --master-addr h0 --nproc-per-node 1 -- p",
			want: Config{NProcPerNode: 1, NNodes: 2, MasterAddr: "h0", MasterPort: DefaultMasterPort,
				Grace: DefaultGrace, MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "unknown underscore", args: "--nproc_per_nodes 2 -- p", flag: "-"},
		{name: "one worker per GPU", args: "--nproc_per_node gpu -- p",
			want: Config{NProcFrom: NProcGPU, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "auto", args: "--nproc-per-node=auto --emulate-machines 2 -- p",
			want: Config{NProcFrom: NProcAuto, NNodes: 1, MasterAddr: DefaultMasterAddr, EmulateMachines: 2,
				Grace: DefaultGrace, MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "cpu", args: "--nproc-per-node cpu -- p",
			want: Config{NProcFrom: NProcCPU, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "a number after auto wins", args: "--nproc-per-node auto --nproc_per_node 3 -- p",
			want: Config{NProcPerNode: 3, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: DefaultGrace,
				MPS: MPSAuto, Program: "p", Args: []string{}}},
		{name: "not a count", args: "--nproc-per-node gpus -- p", flag: "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(strings.Fields(tc.args))
			if tc.flag == "help" {
				require.ErrorIs(t, err, ErrHelp)
				require.NotErrorIs(t, err, ErrUsage)
				return
			}
			if tc.flag == "" {
				require.NoError(t, err)
				got.given = nil // the text of each flag, for Resolve's errors
				want := tc.want // with the defaults of the NIC's queue and rto_min where the case gives none
				if want.NICQueue == 0 {
					want.NICQueue = netbed.DefaultQueue
				}
				if !strings.Contains(tc.args, "rto-min") {
					want.NICRtoMin = DefaultNICRtoMin
				}
				require.Equal(t, want, got)
				return
			}
			require.ErrorIs(t, err, ErrUsage)
			if tc.flag != "-" {
				var ue *UsageError
				require.ErrorAs(t, err, &ue)
				require.Equal(t, tc.flag, ue.Flag)
				require.Contains(t, err.Error(), "--"+tc.flag)
			}
		})
	}
}

// A usage error echoes the value as the user wrote it, whatever the
// spelling of the flag.
func TestParseArgsEchoesValuesAsGiven(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"--nproc-per-node 2 --emulate-machines 2 --nic-gbit 10 --nic-latency 2000ms -- p",
			"--nic-latency 2000ms: must be in [0, 1s]"},
		{"--nproc-per-node 2 --emulate-machines 2 --nic-gbit 1e4 -- p", "--nic-gbit 1e4: must be in (0, 1000] Gbit/s"},
		{"--nproc_per_node 2 --grace -1500ms -- p", "--grace -1500ms: negative"},
		{"--nproc_per_node 2 --master_addr= -- p", `--master-addr "": empty`},
		{"--nproc-per-node 2 --emulate-machines 3 -- p", "--emulate-machines 3: does not divide --nproc-per-node=2"},
	} {
		_, err := ParseArgs(strings.Fields(tc.args))
		require.ErrorIs(t, err, ErrUsage, tc.args)
		require.Equal(t, "fairrun: "+tc.want, err.Error(), tc.args)
	}
}

// A Config made in code is checked the same way as the command line.
func TestValidateStandalone(t *testing.T) {
	ok := Config{NProcPerNode: 2, NNodes: 1, Standalone: true, MasterAddr: DefaultMasterAddr, Program: "p"}
	require.NoError(t, ok.Validate())
	for flag, c := range map[string]func(*Config){
		"nnodes":      func(c *Config) { c.NNodes, c.MasterPort = 2, DefaultMasterPort },
		"master-addr": func(c *Config) { c.MasterAddr = "10.0.0.1" },
		"master-port": func(c *Config) { c.MasterPort = 1234 },
	} {
		bad := ok
		c(&bad)
		var ue *UsageError
		require.ErrorAs(t, bad.Validate(), &ue, flag)
		require.Equal(t, flag, ue.Flag)
		require.Contains(t, ue.Error(), "not allowed with --standalone")
	}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestPlan(t *testing.T) {
	base := []string{"PATH=/bin", "RANK=99", "HOME=/root"}
	host, _ := os.Hostname()

	t.Run("plain", func(t *testing.T) {
		c := Config{NProcPerNode: 3, NNodes: 2, NodeRank: 1, MasterAddr: "h0", MasterPort: 555, Program: "p"}
		ws, err := Plan(c, base, "h0:555", nil, Extras{})
		require.NoError(t, err)
		require.Len(t, ws, 3)
		for i, w := range ws {
			e := envMap(w.Env)
			require.Equal(t, strconv.Itoa(3+i), e["RANK"])
			require.Equal(t, "6", e["WORLD_SIZE"])
			require.Equal(t, strconv.Itoa(i), e["LOCAL_RANK"])
			require.Equal(t, "3", e["LOCAL_WORLD_SIZE"])
			require.Equal(t, "h0", e["MASTER_ADDR"])
			require.Equal(t, "555", e["MASTER_PORT"])
			require.Equal(t, "h0:555", e["FAIRGO_STORE_ADDR"])
			require.Equal(t, "0", e["NCCL_NVLS_ENABLE"])
			require.Equal(t, "/bin", e["PATH"], "the rest of the environment passes through")
			require.NotContains(t, e, "CUDA_VISIBLE_DEVICES")
			require.NotContains(t, e, "NCCL_HOSTID")
			require.Equal(t, "1", e["GROUP_RANK"])
			require.Equal(t, "PATH=/bin", w.Env[0], "order kept")
		}
	})

	t.Run("MASTER_PORT left to the trainer", func(t *testing.T) {
		// fairgo's store on another port than MASTER_PORT; with emulated
		// NICs, MASTER_ADDR is the machine of global rank 0 (shuffled here).
		c := Config{
			NProcPerNode:    4,
			NNodes:          1,
			MasterAddr:      "127.0.0.1",
			EmulateMachines: 2,
			Shuffle:         true,
			ShuffleSeed:     3,
			Program:         "p",
		}
		ws, err := Plan(
			c,
			base,
			"10.77.0.1:4001",
			[]string{"0"},
			Extras{MasterPort: "4000", NetNS: true, MachineAddrs: []string{"10.77.0.2", "10.77.0.3"}},
		)
		require.NoError(t, err)
		var rank0Machine int
		for _, w := range ws {
			if w.Rank == 0 {
				rank0Machine = w.Machine
			}
		}
		for _, w := range ws {
			e := envMap(w.Env)
			require.Equal(t, "4000", e["MASTER_PORT"])
			require.Equal(t, "10.77.0.1:4001", e["FAIRGO_STORE_ADDR"])
			require.Equal(t, []string{"10.77.0.2", "10.77.0.3"}[rank0Machine], e["MASTER_ADDR"])
		}
	})

	t.Run("store token", func(t *testing.T) {
		c := Config{NProcPerNode: 2, NNodes: 1, MasterAddr: "a", Program: "p"}
		ws, err := Plan(c, base, "a:1", nil, Extras{StoreToken: "0123abcd"})
		require.NoError(t, err)
		for _, w := range ws {
			require.Equal(t, "0123abcd", envMap(w.Env)[EnvStoreToken])
		}
		ws, err = Plan(c, base, "a:1", nil, Extras{})
		require.NoError(t, err)
		require.NotContains(t, envMap(ws[0].Env), EnvStoreToken)
	})

	t.Run("NVLS kept when set", func(t *testing.T) {
		c := Config{NProcPerNode: 1, NNodes: 1, MasterAddr: "a", Program: "p"}
		ws, err := Plan(c, append(slices.Clone(base), "NCCL_NVLS_ENABLE=1"), "a:1", nil, Extras{})
		require.NoError(t, err)
		require.Equal(t, "1", envMap(ws[0].Env)["NCCL_NVLS_ENABLE"])
	})

	t.Run("emulated and shuffled", func(t *testing.T) {
		c := Config{
			NProcPerNode:    8,
			NNodes:          1,
			MasterAddr:      "127.0.0.1",
			EmulateMachines: 4,
			Shuffle:         true,
			ShuffleSeed:     3,
			Program:         "p",
		}
		ws, err := Plan(c, base, "127.0.0.1:9", []string{"0", "1", "2"}, Extras{})
		require.NoError(t, err)
		var ranks []int
		for i, w := range ws {
			e := envMap(w.Env)
			ranks = append(ranks, w.Rank)
			require.Equal(t, strconv.Itoa(w.Rank), e["RANK"])
			require.Equal(t, "8", e["WORLD_SIZE"])
			require.Equal(t, strconv.Itoa(i%2), e["LOCAL_RANK"])
			require.Equal(t, "2", e["LOCAL_WORLD_SIZE"])
			id := fmt.Sprintf("%s-emu%d", host, i/2)
			require.Equal(t, id, e["NCCL_HOSTID"])
			require.Equal(t, id, e["FAIRGO_MACHINE_ID"])
			require.Equal(t, strconv.Itoa(i%3), e["CUDA_VISIBLE_DEVICES"], "round-robin over GPUs")
			require.Equal(t, "lo", e["NCCL_SOCKET_IFNAME"])
			require.Equal(t, i/2, w.Machine)
		}
		require.NotEqual(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, ranks, "seed 3 permutes")
		slices.Sort(ranks)
		require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, ranks)
		again, err := Plan(c, base, "127.0.0.1:9", []string{"0", "1", "2"}, Extras{})
		require.NoError(t, err)
		require.Equal(t, ws, again, "the seed fixes the permutation")
	})

	t.Run("emulated, without sharing: one host id per machine, no device id", func(t *testing.T) {
		c := Config{NProcPerNode: 4, NNodes: 1, MasterAddr: "127.0.0.1", EmulateMachines: 2, Program: "p"}
		ws, err := Plan(c, base, "127.0.0.1:9", []string{"0", "1"}, Extras{})
		require.NoError(t, err)
		for i, w := range ws {
			e := envMap(w.Env)
			id := fmt.Sprintf("%s-emu%d", host, i/2)
			require.Equal(t, id, e["NCCL_HOSTID"])
			require.Equal(t, id, e["FAIRGO_MACHINE_ID"])
			require.NotContains(t, e, "FAIRGO_DEVICE_ID")
			require.Equal(t, "nvlink", e["FAIRGO_TESTBED_INTRA"])
			require.Equal(t, "0", e["FAIRGO_TESTBED_NVLINK_GBIT"])
		}
	})

	t.Run("not emulated: no intra-machine link told", func(t *testing.T) {
		ws, err := Plan(Config{NProcPerNode: 2, NNodes: 1, MasterAddr: "a", Program: "p"}, base, "a:1", nil, Extras{})
		require.NoError(t, err)
		for _, w := range ws {
			e := envMap(w.Env)
			require.NotContains(t, e, "FAIRGO_TESTBED_INTRA")
			require.NotContains(t, e, "FAIRGO_DEVICE_ID")
			require.Equal(t, "0", e["FAIRGO_TESTBED_NVLINK_GBIT"])
		}
	})

	t.Run("gpu list", func(t *testing.T) {
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		require.Equal(t, []string{"4", "6"}, GPUList(Config{}, []string{"CUDA_VISIBLE_DEVICES=4, 6"}, log))
		require.Equal(t, []string{"4"}, GPUList(Config{GPUs: 1}, []string{"CUDA_VISIBLE_DEVICES=4,6"}, log))
		require.Equal(t, []string{"0", "1", "2"}, GPUList(Config{GPUs: 3}, nil, log))
		require.NotEmpty(t, GPUList(Config{}, nil, log))
	})
}

// The environment of every worker when the ranks of an emulated machine
// would share a GPU: each rank its own NCCL host and device identity, the
// machine identity per machine; and when they do not (4 × 2 on 2 GPUs).
func TestPlanRanksSharingAGPU(t *testing.T) {
	host, _ := os.Hostname()
	base := []string{"PATH=/bin", "NCCL_HOSTID=outer"}
	// want is one worker's emulation variables.
	type want struct{ hostID, machineID, deviceID, gpu, intra string }
	emu := func(m int) string { return fmt.Sprintf("%s-emu%d", host, m) }
	shared := func(m, local int, gpu string) want {
		return want{fmt.Sprintf("%s-d%d", emu(m), local), emu(m), fmt.Sprintf("%s/r%d", gpu, local), gpu, "loopback"}
	}
	alone := func(m int, gpu string) want { return want{emu(m), emu(m), "", gpu, "nvlink"} }
	for _, tc := range []struct {
		name     string
		machines int
		nproc    int
		gpus     []string
		netns    bool
		nvlink   float64
		want     []want // by slot
	}{
		{name: "2 machines × 2 ranks on 1 GPU", machines: 2, nproc: 4, gpus: []string{"0"}, netns: true, nvlink: 20,
			want: []want{shared(0, 0, "0"), shared(0, 1, "0"), shared(1, 0, "0"), shared(1, 1, "0")}},
		{name: "2 machines × 4 ranks on 1 GPU", machines: 2, nproc: 8, gpus: []string{"3"},
			want: []want{shared(0, 0, "3"), shared(0, 1, "3"), shared(0, 2, "3"), shared(0, 3, "3"),
				shared(1, 0, "3"), shared(1, 1, "3"), shared(1, 2, "3"), shared(1, 3, "3")}},
		{name: "4 machines × 2 ranks on 2 GPUs: one rank per GPU in each machine", machines: 4, nproc: 8,
			gpus: []string{"0", "1"}, netns: true,
			want: []want{alone(0, "0"), alone(0, "1"), alone(1, "0"), alone(1, "1"), alone(2, "0"), alone(2, "1"),
				alone(3, "0"), alone(3, "1")}},
		{name: "2 machines × 4 ranks on 2 GPUs: two ranks of a machine on each", machines: 2, nproc: 8,
			gpus: []string{"0", "1"}, netns: true, nvlink: 2.5,
			want: []want{shared(0, 0, "0"), shared(0, 1, "1"), shared(0, 2, "0"), shared(0, 3, "1"),
				shared(1, 0, "0"), shared(1, 1, "1"), shared(1, 2, "0"), shared(1, 3, "1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{
				NProcPerNode:    tc.nproc,
				NNodes:          1,
				MasterAddr:      "127.0.0.1",
				EmulateMachines: tc.machines,
				Program:         "p",
			}
			x := Extras{MPS: &MPSEnv{PipeDir: "/p", LogDir: "/l"}}
			if tc.netns {
				c.NICGbit, c.NVLinkGbit = 2.5, tc.nvlink
				x.NetNS = true
			}
			require.Equal(t, tc.want[0].intra == "loopback", RanksShareGPUs(c, tc.gpus))
			ws, err := Plan(c, base, "10.77.0.1:9", tc.gpus, x)
			require.NoError(t, err)
			require.Len(t, ws, len(tc.want))
			hostIDs := map[string]bool{}
			for slot, w := range ws {
				e := envMap(w.Env)
				got := want{
					e["NCCL_HOSTID"],
					e["FAIRGO_MACHINE_ID"],
					e["FAIRGO_DEVICE_ID"],
					e["CUDA_VISIBLE_DEVICES"],
					e["FAIRGO_TESTBED_INTRA"],
				}
				require.Equal(t, tc.want[slot], got, "slot %d", slot)
				if got.deviceID == "" {
					require.NotContains(t, e, "FAIRGO_DEVICE_ID", "slot %d", slot)
				}
				hostIDs[got.hostID] = true
				require.Equal(t, slot/(tc.nproc/tc.machines), w.Machine)
				require.Equal(t, strconv.Itoa(slot%(tc.nproc/tc.machines)), e["LOCAL_RANK"])
				require.Equal(t, strconv.Itoa(tc.nproc/tc.machines), e["LOCAL_WORLD_SIZE"])
				require.Equal(t, strconv.Itoa(tc.machines), e["FAIRGO_TESTBED_MACHINES"], "machines, not NCCL hosts")
				require.Equal(t, strconv.FormatFloat(c.NVLinkGbit, 'g', -1, 64), e["FAIRGO_TESTBED_NVLINK_GBIT"])
				require.Equal(t, "1", e["FAIRGO_TESTBED_MPS"])
				require.Equal(t, "/p", e["CUDA_MPS_PIPE_DIRECTORY"])
				want := "lo"
				if tc.netns {
					want = "eth0"
				}
				require.Equal(t, want, e["NCCL_SOCKET_IFNAME"])
			}
			if tc.want[0].intra == "loopback" {
				require.Len(t, hostIDs, tc.nproc, "every rank is an NCCL host of its own")
			} else {
				require.Len(t, hostIDs, tc.machines, "one NCCL host per machine")
			}
		})
	}
}

// What fairrun tells the workers is what their readers read: topology's
// identities, and the testbed the benchmark records (machines M, not the
// NCCL hosts; the intra-machine link and its rate).
func TestWorkersReadWhatPlanWrites(t *testing.T) {
	require.Equal(t, topology.EnvMachineID, EnvMachineID)
	require.Equal(t, topology.EnvNCCLHostID, EnvNCCLHostID)
	require.Equal(t, topology.EnvDeviceID, EnvDeviceID)
	require.Equal(t, tbinfo.IntraNVLink, IntraNVLink)
	require.Equal(t, tbinfo.IntraLoopback, IntraLoopback)
	c := Config{
		NProcPerNode:    8,
		NNodes:          1,
		MasterAddr:      "127.0.0.1",
		EmulateMachines: 2,
		NICGbit:         2.5,
		NICRtoMin:       5 * time.Millisecond,
		NVLinkGbit:      20,
		Program:         "p",
	}
	ws, err := Plan(
		c,
		nil,
		"10.77.0.1:9",
		[]string{"0"},
		Extras{NetNS: true, MPS: &MPSEnv{PipeDir: "/p", LogDir: "/l"}},
	)
	require.NoError(t, err)
	for _, w := range ws {
		e := envMap(w.Env)
		lookup := func(k string) (string, bool) { v, ok := e[k]; return v, ok }
		emu, err := tbinfo.EmulationFromEnv(lookup)
		require.NoError(t, err)
		require.Equal(
			t,
			tbinfo.Emulation{
				Machines:  2,
				NICGbit:   2.5,
				NICQueue:  netbed.DefaultQueue,
				NICRtoMin: 5 * time.Millisecond,
				MPS:       true,
				// fairrun turns TCP's slow start after idle off unless told
				NICSlowStartAfterIdle: new(bool),
				NetNS:                 true,
				Intra:                 tbinfo.IntraLoopback,
				NVLinkGbit:            20,
			},
			emu,
		)
		dev, err := topology.DescribeDevice(0, lookup, nil)
		require.NoError(t, err)
		require.True(t, dev.ExplicitID())
		require.Equal(t, e[EnvDeviceID], dev.ID)
		id, err := topology.MachineIdentity(topology.Host{Lookup: lookup})
		require.NoError(t, err)
		require.Equal(t, e[EnvMachineID], id.ID, "the machine, not the rank's NCCL host")
	}
}

// Resolve counts the workers of --nproc-per-node gpu, auto and cpu from
// what this node has, and refuses, naming the flag with its value as
// given, what the node cannot do: gpu without a GPU, --emulate-machines
// that does not divide the count, --nvlink-gbit where the ranks of each
// machine have GPUs of their own. It starts nothing.
func TestResolve(t *testing.T) {
	cpus := runtime.NumCPU()
	for _, tc := range []struct {
		name    string
		args    string
		visible string // CUDA_VISIBLE_DEVICES
		nproc   int    // resolved
		gpus    []string
		err     string // the error, exactly; "": none
	}{
		{name: "a number stays", args: "--nproc-per-node 3 -- p", visible: "0,1", nproc: 3},
		{name: "gpu: one per visible GPU", args: "--nproc_per_node gpu -- p", visible: "0,1", nproc: 2},
		{name: "gpu: UUIDs count", args: "--nproc_per_node gpu -- p", visible: "GPU-8e2c,GPU-77aa,GPU-01ff", nproc: 3},
		{name: "gpu: CUDA stops at a negative index", args: "--nproc_per_node gpu -- p", visible: "3,-1,2", nproc: 1},
		{name: "gpu without a GPU", args: "--nproc_per_node gpu -- p", visible: "",
			err: `fairrun: --nproc-per-node gpu: no GPU is visible (CUDA_VISIBLE_DEVICES=""); ` +
				`auto starts one worker per CPU then, cpu always`},
		{name: "auto with GPUs", args: "--nproc-per-node auto -- p", visible: "4,5,6,7", nproc: 4},
		{name: "auto without a GPU: one per CPU", args: "--nproc-per-node auto -- p", visible: "", nproc: cpus},
		{name: "cpu with GPUs", args: "--nproc-per-node cpu -- p", visible: "0", nproc: cpus},
		{name: "auto and emulated machines", args: "--nproc-per-node auto --emulate-machines 2 -- p",
			visible: "0,1", nproc: 2, gpus: []string{"0", "1"}},
		{name: "machines that do not divide the GPUs", args: "--nproc-per-node gpu --emulate-machines 3 -- p", visible: "0,1",
			err: "fairrun: --emulate-machines 3: does not divide --nproc-per-node=2"},
		{name: "shaped loopback of ranks sharing a GPU", args: "--nproc-per-node 4 --emulate-machines 2 " +
			"--nic-gbit 2.5 --nvlink-gbit 20 -- p", visible: "0",
			nproc: 4, gpus: []string{"0"}},
		{name: "shaped loopback of ranks with GPUs of their own", args: "--nproc-per-node 4 --emulate-machines " +
			"2 --nic-gbit 2.5 --nvlink-gbit 20.0 -- p", visible: "0,1",
			err: "fairrun: --nvlink-gbit 20.0: the ranks of each emulated machine have GPUs of their own (2 per " +
				"machine, 2 GPUs) and talk GPU to GPU, which tbf cannot shape; " +
				"it shapes the loopback that ranks sharing a GPU talk over (more ranks per machine than GPUs: " +
				"lower --gpus or raise --nproc-per-node)"},
		{name: "--gpus makes them share", args: "--nproc-per-node 4 --emulate-machines 2 --gpus 1 " +
			"--nic-gbit 2.5 --nvlink-gbit 20 -- p", visible: "0,1",
			nproc: 4, gpus: []string{"0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseArgs(strings.Fields(tc.args))
			require.NoError(t, err)
			var log bytes.Buffer
			c.Env, c.Stderr = []string{"CUDA_VISIBLE_DEVICES=" + tc.visible}, &log
			got, err := Resolve(c)
			if tc.err != "" {
				require.ErrorIs(t, err, ErrUsage)
				require.EqualError(t, err, tc.err)
				var ue *UsageError
				require.ErrorAs(t, err, &ue)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.nproc, got.NProcPerNode)
			require.Equal(t, tc.gpus, got.gpus)
			require.True(t, got.resolved)
			ws, err := Plan(got, got.Env, "127.0.0.1:9", got.gpus, Extras{})
			require.NoError(t, err)
			require.Len(t, ws, tc.nproc)
		})
	}
}

// Plan refuses a count that Resolve has not decided yet.
func TestPlanNeedsAResolvedCount(t *testing.T) {
	c, err := ParseArgs(strings.Fields("--nproc-per-node gpu -- p"))
	require.NoError(t, err)
	_, err = Plan(c, nil, "127.0.0.1:9", nil, Extras{})
	require.ErrorContains(t, err, "--nproc-per-node gpu is not resolved")
}

// Run resolves a configuration itself, and a bad one is ExitUsage with
// nothing started.
func TestRunRefusesWhatResolveRefuses(t *testing.T) {
	dir := t.TempDir()
	c, err := ParseArgs([]string{"--nproc-per-node", "gpu", "--", "touch", filepath.Join(dir, "started")})
	require.NoError(t, err)
	c.Env, c.Stdout, c.Stderr = []string{"CUDA_VISIBLE_DEVICES="}, io.Discard, io.Discard
	code, err := Run(context.Background(), c)
	require.Equal(t, ExitUsage, code)
	require.ErrorIs(t, err, ErrUsage)
	_, serr := os.Stat(filepath.Join(dir, "started"))
	require.ErrorIs(t, serr, os.ErrNotExist, "a worker was started")
}

// --nvlink-gbit needs --nic-gbit and says so.
func TestNVLinkGbitNeedsNICGbit(t *testing.T) {
	_, err := ParseArgs(strings.Fields("--nproc-per-node 4 --emulate-machines 2 --nvlink-gbit 20 -- p"))
	var ue *UsageError
	require.ErrorAs(t, err, &ue)
	require.Equal(t, "nvlink-gbit", ue.Flag)
	require.EqualError(
		t,
		err,
		"fairrun: --nvlink-gbit 20: needs --nic-gbit (it shapes the loopback of each emulated machine's network namespace)",
	)
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var gridLine = regexp.MustCompile(
	`^\[(\d+)\] grid (\d+)x(\d+) machine (\d+) local (\d+) rank (\d+) ` +
		`intra \[([\d ]+)\] rail \[([\d ]+)\] machine-id (\S+) device (\S+)$`,
)

type gridReport struct {
	rank, machines, devices, machine, local int
	intra, rail, machineID, device          string
}

func parseGrid(t *testing.T, out string) map[int]gridReport {
	t.Helper()
	reps := map[int]gridReport{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		m := gridLine.FindStringSubmatch(line)
		require.NotNil(t, m, "unexpected line %q", line)
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		require.Equal(t, n(1), n(6), "prefix and rank agree: %q", line)
		_, dup := reps[n(1)]
		require.False(t, dup, "rank %d printed twice", n(1))
		reps[n(1)] = gridReport{n(6), n(2), n(3), n(4), n(5), m[7], m[8], m[9], m[10]}
	}
	return reps
}

func runConfig(t *testing.T, n int, extra func(*Config), args ...string) (code int, err error, stdout, stderr string) {
	worker, _ := binaries(t)
	var so, se syncBuffer
	c := Config{
		NProcPerNode: n,
		NNodes:       1,
		MasterAddr:   DefaultMasterAddr,
		Grace:        5 * time.Second,
		Program:      worker,
		Args:         args,
		Stdout:       &so,
		Stderr:       &se,
	}
	if extra != nil {
		extra(&c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, err = Run(ctx, c)
	return code, err, so.String(), se.String()
}

// Every worker prints the same grid and its own coordinates, for emulated
// machines and shuffled global ranks.
//
// With fewer GPUs than ranks per machine, ranks of one machine share GPUs:
// topology accepts them through the device identities fairrun gives them
// (FAIRGO_DEVICE_ID; it would refuse two ranks of one machine on one GPU
// otherwise), and still groups them into the emulated machines.
func TestRunEmulatedShuffled(t *testing.T) {
	for _, tc := range []struct {
		n, machines, gpus int // gpus 0: one per rank of a machine
		seed              uint64
	}{{4, 2, 0, 1}, {6, 3, 0, 42}, {4, 4, 0, 7}, {3, 1, 0, 5}, {4, 2, 1, 3}, {8, 2, 2, 9}, {8, 4, 1, 4}} {
		gpus := tc.gpus
		if gpus == 0 {
			gpus = tc.n / tc.machines
		}
		t.Run(fmt.Sprintf("%dx%d on %d GPUs", tc.machines, tc.n/tc.machines, gpus), func(t *testing.T) {
			code, err, out, errOut := runConfig(t, tc.n, func(c *Config) {
				c.EmulateMachines, c.GPUs, c.Shuffle, c.ShuffleSeed = tc.machines, gpus, true, tc.seed
			})
			require.NoError(t, err, errOut)
			require.Equal(t, 0, code)
			reps := parseGrid(t, out)
			require.Len(t, reps, tc.n)
			d := tc.n / tc.machines
			cells := map[[2]int]int{}
			machineOf := map[string]int{}
			for r, g := range reps {
				require.Equal(t, tc.machines, g.machines, "rank %d", r)
				require.Equal(t, d, g.devices, "rank %d", r)
				cells[[2]int{g.machine, g.local}] = r
				if m, ok := machineOf[g.machineID]; ok {
					require.Equal(t, m, g.machine, "one emulated machine, one index")
				}
				machineOf[g.machineID] = g.machine
			}
			require.Len(t, cells, tc.n, "every (machine, local) exactly once")
			require.Len(t, machineOf, tc.machines)
			// Devices: a GPU's own identity when every rank of a machine has
			// a GPU of its own, else <gpu>/r<local rank>, local rank l of
			// emulated machine k (host-emuK) on GPU (k·D + l) mod G:
			// contiguous slots, GPUs round-robin.
			devices := map[string][]string{}
			for r, g := range reps {
				if d <= gpus {
					require.Regexp(t, `^cuda:\d+$`, g.device, "rank %d", r)
				}
				devices[g.machineID] = append(devices[g.machineID], g.device)
			}
			for id, got := range devices {
				if d <= gpus {
					continue
				}
				k, err := strconv.Atoi(regexp.MustCompile(`-emu(\d+)$`).FindStringSubmatch(id)[1])
				require.NoError(t, err)
				var want []string
				for l := range d {
					want = append(want, fmt.Sprintf("%d/r%d", (k*d+l)%gpus, l))
				}
				require.ElementsMatch(t, want, got, "machine %s", id)
			}
			// Intra and rail lists agree with the coordinates.
			for r, g := range reps {
				var intra, rail []string
				for l := range d {
					intra = append(intra, strconv.Itoa(cells[[2]int{g.machine, l}]))
				}
				for m := range tc.machines {
					rail = append(rail, strconv.Itoa(cells[[2]int{m, g.local}]))
				}
				require.Equal(t, strings.Join(intra, " "), g.intra, "rank %d", r)
				require.Equal(t, strings.Join(rail, " "), g.rail, "rank %d", r)
			}
			// Machines are ordered by their smallest rank.
			require.Equal(t, 0, reps[0].machine)
			require.Equal(t, 0, reps[0].local)
		})
	}
}

func pidsOf(t *testing.T, dir string, n int) []int {
	t.Helper()
	var pids []int
	for r := range n {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)))
		require.NoError(t, err)
		pid, err := strconv.Atoi(string(b))
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	return pids
}

func requireGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		err := syscall.Kill(pid, 0)
		require.ErrorIs(t, err, syscall.ESRCH, "worker pid %d still exists", pid)
	}
}

// One worker exits 3: fairrun exits 3 and the others are killed at once.
func TestRunFailFast(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	code, err, out, errOut := runConfig(t, 4, nil, "-fail-rank", "2", "-fail-code", "3", "-hang", "-pid-dir", dir)
	require.Equal(t, 3, code, "stderr: %s", errOut)
	require.ErrorContains(t, err, "rank 2")
	require.Less(t, time.Since(start), 4*time.Second, "the hanging workers were not given the whole grace period")
	require.Contains(t, errOut, "[2] failing on purpose with code 3")
	require.Len(t, parseGrid(t, out), 4)
	requireGone(t, pidsOf(t, dir, 4))
}

// A worker that ignores SIGTERM is killed after the grace period.
func TestRunKillAfterGrace(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	code, err, _, errOut := runConfig(t, 2, func(c *Config) { c.Grace = 300 * time.Millisecond },
		"-fail-rank", "0", "-fail-code", "5", "-hang", "-ignore-term", "-pid-dir", dir)
	require.Equal(t, 5, code, "stderr: %s", errOut)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.Contains(t, errOut, "ignored SIGTERM")
	requireGone(t, pidsOf(t, dir, 2))
}

// Cancelling Run's context with a signal cause stops every worker and gives
// 128 + the signal.
func TestRunCancelled(t *testing.T) {
	worker, _ := binaries(t)
	dir := t.TempDir()
	var so, se syncBuffer
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _ := Run(ctx, Config{NProcPerNode: 3, NNodes: 1, MasterAddr: DefaultMasterAddr, Grace: 5 * time.Second,
			Program: worker, Args: []string{"-hang", "-pid-dir", dir}, Stdout: &so, Stderr: &se})
		done <- code
	}()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(so.String(), "grid ") < 3 {
		require.True(t, time.Now().Before(deadline), "workers never reported: %s", se.String())
		time.Sleep(10 * time.Millisecond)
	}
	cancel(&SignalError{Signal: syscall.SIGINT})
	select {
	case code := <-done:
		require.Equal(t, 130, code)
	case <-time.After(4 * time.Second):
		t.Fatal("Run did not stop the workers")
	}
	requireGone(t, pidsOf(t, dir, 3))
}

func TestRunStartFailure(t *testing.T) {
	var se syncBuffer
	code, err := Run(context.Background(), Config{NProcPerNode: 2, NNodes: 1, MasterAddr: DefaultMasterAddr,
		Program: filepath.Join(t.TempDir(), "missing"), Stdout: io.Discard, Stderr: &se})
	require.Equal(t, ExitStartFailure, code)
	require.Error(t, err)
}

// SIGTERM to the fairrun process kills its workers; fairrun exits 143.
func TestFairrunSignal(t *testing.T) {
	worker, fairrun := binaries(t)
	dir := t.TempDir()
	cmd := exec.Command(
		fairrun,
		"--nproc-per-node",
		"4",
		"--emulate-machines",
		"2",
		"--gpus",
		"2",
		"--shuffle-ranks",
		"11",
		"--",
		worker,
		"-hang",
		"-pid-dir",
		dir,
	)
	var se syncBuffer
	cmd.Stderr = &se
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var out []string
	timeout := time.After(30 * time.Second)
	for len(out) < 4 {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "fairrun ended early: %s", se.String())
			out = append(out, l)
		case <-timeout:
			t.Fatalf("workers never reported; stderr: %s", se.String())
		}
	}
	reps := parseGrid(t, strings.Join(out, "\n"))
	require.Len(t, reps, 4)
	for _, g := range reps {
		require.Equal(t, 2, g.machines)
		require.Equal(t, 2, g.devices)
	}
	pids := pidsOf(t, dir, 4)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	waited := make(chan error, 1)
	go func() {
		for range lines {
		}
		waited <- cmd.Wait()
	}()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		require.True(t, errors.As(err, &ee), "fairrun exit: %v", err)
		require.Equal(t, 128+int(syscall.SIGTERM), ee.ExitCode(), "stderr: %s", se.String())
	case <-time.After(4 * time.Second):
		t.Fatalf("fairrun did not exit after SIGTERM; stderr: %s", se.String())
	}
	requireGone(t, pids)
}

// fairrun --help and -h print every flag on stdout and exit 0; usage errors
// exit 2 with the synopsis on stderr.
func TestFairrunHelp(t *testing.T) {
	_, fairrun := binaries(t)
	var flags []string
	newFlagSet(&Config{}).VisitAll(func(f *flag.Flag) { flags = append(flags, f.Name) })
	require.Contains(t, flags, "nic-gbit")
	for _, tc := range []struct {
		args   []string
		code   int
		stdout []string // every one must appear
		stderr []string
	}{
		{args: []string{"--help"}, code: 0,
			stdout: append(slices.Clone(flags), "bounds the sum of all intra-machine traffic", "FAIRGO_DEVICE_ID")},
		{args: []string{"-h"}, code: 0, stdout: flags},
		{args: []string{"-help", "--", "prog"}, code: 0, stdout: flags},
		{args: []string{"--nproc-per-node", "2"}, code: 2, stderr: []string{"no worker program", "usage:", "fairrun --help"}},
		{args: []string{"--bogus", "--", "p"}, code: 2, stderr: []string{"-bogus", "usage:"}},
		{args: []string{"--nproc-per-node", "2", "--nic-gbit", "10", "--", "p"}, code: 2,
			stderr: []string{"--nic-gbit 10", "--emulate-machines"}},
		{args: []string{"--nproc-per-node", "4", "--emulate-machines", "2", "--nvlink-gbit", "20", "--", "p"},
			code: 2, stderr: []string{"--nvlink-gbit 20", "needs --nic-gbit"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.Command(fairrun, tc.args...)
			var so, se syncBuffer
			cmd.Stdout, cmd.Stderr = &so, &se
			err := cmd.Run()
			if tc.code == 0 {
				require.NoError(t, err, "stderr: %s", se.String())
				require.Empty(t, se.String())
			} else {
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee)
				require.Equal(t, tc.code, ee.ExitCode())
				require.Empty(t, so.String())
			}
			for _, f := range tc.stdout {
				if strings.Contains(f, " ") || strings.ToUpper(f) == f { // a phrase, not a flag
					require.Contains(t, strings.Join(strings.Fields(so.String()), " "), f)
					continue
				}
				require.Regexp(t, "\n  --"+regexp.QuoteMeta(f)+"( |\n)", so.String(), "flag %s is not documented", f)
			}
			for _, s := range tc.stderr {
				require.Contains(t, se.String(), s)
			}
		})
	}
}

// freePortPair returns a port p free on 127.0.0.1 with p+1 free on every
// interface: a job of several nodes serves fairgo's store on MASTER_PORT+1.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", fmt.Sprintf(":%d", p+1))
		ln.Close()
		if err == nil {
			next.Close()
			return p
		}
	}
	t.Fatal("no pair of free ports")
	return 0
}

// The store listens on --master-addr (or --store-bind), not on every
// interface, also for a job of several nodes.
func TestRunStoreBind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nnodes int
		bind   string
		want   string // the listening socket's address in /proc/net/tcp{,6}
	}{
		{name: "one node", nnodes: 1, want: "0100007F"},
		{name: "several nodes", nnodes: 2, want: "0100007F"},
		{name: "several nodes, every interface asked", nnodes: 2, bind: "0.0.0.0", want: "0+"}, // Go listens on [::] then
		{name: "one node, bind given", nnodes: 1, bind: "127.0.0.1", want: "0100007F"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePortPair(t)
			var so, se syncBuffer
			c := Config{
				NProcPerNode: 1,
				NNodes:       tc.nnodes,
				MasterAddr:   "127.0.0.1",
				MasterPort:   port,
				StoreBind:    tc.bind,
				Grace:        time.Second,
				Program:      "/bin/sh",
				Env:          append(os.Environ(), EnvStoreToken+"=shared"),
				Args: []string{
					"-c",
					`awk -v p="$(printf ':%04X' "${FAIRGO_STORE_ADDR##*:}")" '$2 ~ p"$" && $4 == "0A" {print $2}' ` +
						`/proc/net/tcp /proc/net/tcp6`,
				},
				Stdout: &so,
				Stderr: &se,
			}
			if tc.nnodes == 1 {
				c.MasterPort = 0
			}
			code, err := Run(context.Background(), c)
			require.NoError(t, err, "stderr: %s", se.String())
			require.Equal(t, 0, code)
			out := strings.TrimSpace(so.String())
			require.Regexp(t, `^\[0\] ([0-9A-F]{8}|[0-9A-F]{32}):[0-9A-F]{4}$`, out, "stderr: %s", se.String())
			addr, _, _ := strings.Cut(strings.Fields(out)[1], ":")
			require.Regexp(t, "^"+tc.want+"$", addr, "listening address")
		})
	}
}

// Every job gets a fresh random store token (or the one the environment
// gives, which a job of several nodes must), every worker gets it, and the
// store refuses a client without it.
func TestRunStoreToken(t *testing.T) {
	run := func(t *testing.T, nnodes int, env []string, script string) (int, error, string) {
		t.Helper()
		var so, se syncBuffer
		c := Config{NProcPerNode: 2, NNodes: nnodes, MasterAddr: "127.0.0.1", Grace: time.Second,
			Program: "/bin/sh", Args: []string{"-c", script}, Env: env, Stdout: &so, Stderr: &se}
		if nnodes > 1 {
			c.MasterPort = DefaultMasterPort + 7
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		code, err := Run(ctx, c)
		return code, err, so.String()
	}
	tokenOf := func(t *testing.T, out string) string {
		t.Helper()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2)
		var tok string
		for _, l := range lines {
			_, v, _ := strings.Cut(l, " ")
			if tok != "" {
				require.Equal(t, tok, v, "every worker gets the same token")
			}
			tok = v
		}
		return tok
	}
	env := []string{"PATH=/usr/bin:/bin"}
	const print = `echo "$FAIRGO_STORE_TOKEN"`

	t.Run("fresh per job", func(t *testing.T) {
		code, err, out := run(t, 1, env, print)
		require.NoError(t, err)
		require.Equal(t, 0, code)
		first := tokenOf(t, out)
		require.Regexp(t, `^[0-9a-f]{32}$`, first)
		_, _, out = run(t, 1, env, print)
		require.NotEqual(t, first, tokenOf(t, out))
	})
	t.Run("from the environment", func(t *testing.T) {
		_, err, out := run(t, 1, append(slices.Clone(env), EnvStoreToken+"=s3cret"), print)
		require.NoError(t, err)
		require.Equal(t, "s3cret", tokenOf(t, out))
	})
	t.Run("too long", func(t *testing.T) {
		code, err, _ := run(
			t,
			1,
			append(slices.Clone(env), EnvStoreToken+"="+strings.Repeat("x", rendezvous.MaxTokenLen+1)),
			print,
		)
		require.Equal(t, ExitLaunchFailure, code)
		require.ErrorContains(t, err, EnvStoreToken)
	})
	t.Run("several nodes need it", func(t *testing.T) {
		dir := t.TempDir()
		code, err, _ := run(t, 2, env, "touch "+filepath.Join(dir, "started"))
		require.Equal(t, ExitLaunchFailure, code)
		require.ErrorIs(t, err, ErrNoStoreToken)
		_, serr := os.Stat(filepath.Join(dir, "started"))
		require.True(t, errors.Is(serr, os.ErrNotExist), "a worker was started")
	})
	t.Run("store refuses a client without it", func(t *testing.T) {
		dir := t.TempDir()
		done := filepath.Join(dir, "done")
		script := `echo "$FAIRGO_STORE_ADDR" > ` + filepath.Join(dir, "addr.$RANK") +
			`; while [ ! -e ` + done + ` ]; do sleep 0.02; done`
		result := make(chan error, 1)
		go func() { _, err, _ := run(t, 1, env, script); result <- err }()
		ended := false
		t.Cleanup(func() { // Run must end before the next test starts processes
			if !ended {
				os.WriteFile(done, nil, 0o644)
				<-result
			}
		})
		addr := strings.TrimSpace(waitFiles(t, dir, "addr.0")[0])
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		cl, err := rendezvous.Dial(ctx, addr)
		if err == nil {
			err = cl.Set(ctx, "k", []byte("v"))
			cl.Close()
		}
		require.Error(t, err, "a client without the token was served")
		require.NoError(t, os.WriteFile(done, nil, 0o644))
		ended = true
		require.NoError(t, <-result)
	})
}
