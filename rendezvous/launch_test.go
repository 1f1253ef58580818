package rendezvous_test

// Multi-process launch tests: the test binary re-executes itself as the
// ranks of a job, with the environment torchrun (with and without agent
// store), Slurm's srun, Open MPI's mpirun and fairrun would give them, and
// every rank must reach the same layout through the store rendezvous.Open
// finds for it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo/rendezvous"
	"github.com/fairgo/fairgo/topology"
)

// childEnv switches the test binary into a rank of a launch test.
const childEnv = "FAIRGO_LAUNCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "launch test child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// report is what each rank prints.
type report struct {
	Rank     int
	Launcher string
	Kind     string
	Hosting  bool
	Machines []topology.Machine
	Grid     grid
	Peers    []string // the value every rank set, read back
	Count    int64
}

// grid is a rank's coordinates (the fields of the layout's Grid).
type grid struct{ Machines, Devices, Machine, Local int }

// child is one rank: open the store, discover the layout, exchange a key
// with every rank, count, and leave.
func child() error {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := rendezvous.Open(ctx, l)
	if err != nil {
		return err
	}
	self, err := topology.Self{NoNVML: true, Ordinal: l.LocalRank}.Describe()
	if err != nil {
		return err
	}
	layout, err := topology.Discover(ctx, rendezvous.WithPrefix(s, "discover"), l.Rank, l.WorldSize, self)
	if err != nil {
		return err
	}
	// Count, then announce: once every rank's key exists, the count is final.
	st := rendezvous.WithPrefix(s, "launchtest")
	if _, err := st.Add(ctx, "count", 1); err != nil {
		return err
	}
	if err := st.Set(ctx, "rank/"+strconv.Itoa(l.Rank), []byte(fmt.Sprintf("hello from %d", l.Rank))); err != nil {
		return err
	}
	keys := make([]string, l.WorldSize)
	for r := range keys {
		keys[r] = "rank/" + strconv.Itoa(r)
	}
	if err := st.Wait(ctx, keys...); err != nil {
		return err
	}
	rep := report{Rank: l.Rank, Launcher: l.Launcher, Kind: s.Kind, Hosting: s.Hosting(), Machines: layout.Machines,
		Grid: grid{layout.Grid.Machines, layout.Grid.Devices, layout.Grid.Machine, layout.Grid.Local}}
	for _, k := range keys {
		v, err := st.Get(ctx, k)
		if err != nil {
			return err
		}
		rep.Peers = append(rep.Peers, string(v))
	}
	v, err := st.Get(ctx, "count")
	if err != nil {
		return err
	}
	if rep.Count, err = strconv.ParseInt(string(v), 10, 64); err != nil {
		return err
	}
	b, _ := json.Marshal(rep)
	fmt.Printf("LAUNCHTEST %s\n", b)
	return s.Leave(ctx)
}

// launch runs one process per env and returns their reports by rank.
func launch(t *testing.T, envs []map[string]string) []report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reports := make([]report, len(envs))
	var wg sync.WaitGroup
	errs := make([]error, len(envs))
	for i, vars := range envs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = []string{childEnv + "=1", "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		for k, v := range vars {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var out, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &stderr
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				errs[i] = fmt.Errorf("process %d: %v\nstderr:\n%s", i, err, stderr.String())
				return
			}
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "LAUNCHTEST "); ok {
					var r report
					if err := json.Unmarshal([]byte(line), &r); err != nil {
						errs[i] = err
						return
					}
					reports[i] = r
					return
				}
			}
			errs[i] = fmt.Errorf(
				"process %d printed no report; stdout:\n%s\nstderr:\n%s",
				i,
				out.String(),
				stderr.String(),
			)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return reports
}

// checkAgree checks that every rank saw the same 2 × 2 layout, every
// rank's key and the full count.
func checkAgree(t *testing.T, reports []report, launcher, kind string) {
	t.Helper()
	world := len(reports)
	want := []topology.Machine{{ID: "m0", Ranks: []int{0, 1}}, {ID: "m1", Ranks: []int{2, 3}}}
	var peers []string
	for r := range world {
		peers = append(peers, fmt.Sprintf("hello from %d", r))
	}
	for i, rep := range reports {
		require.Equal(t, i, rep.Rank)
		require.Equal(t, launcher, rep.Launcher, "rank %d", i)
		require.Equal(t, kind, rep.Kind, "rank %d", i)
		require.Equal(t, want, rep.Machines, "rank %d", i)
		require.Equal(t, grid{Machines: 2, Devices: 2, Machine: i / 2, Local: i % 2}, rep.Grid, "rank %d", i)
		require.Equal(t, peers, rep.Peers, "rank %d", i)
		require.EqualValues(t, world, rep.Count, "rank %d", i)
		require.Equal(t, kind == rendezvous.StoreRank0 && i == 0, rep.Hosting, "rank %d", i)
	}
}

// portsGiven are the ports freePorts handed out, so that two of the
// package's parallel tests never get overlapping pairs: one test's p+1 was
// another's p, and a bind failed with "address already in use" in CI.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// freePorts returns a port p in [10000, 29999) such that p and p+1 were
// both free (the range of SlurmPort) and neither was handed out before.
func freePorts(t *testing.T) int {
	t.Helper()
	portsMu.Lock() // the package's parallel tests never get overlapping pairs
	defer portsMu.Unlock()
	for range 200 {
		p := 10000 + rand.IntN(19998)
		if portsGiven[p] || portsGiven[p+1] {
			continue
		}
		a, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		b, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		a.Close()
		if err == nil {
			b.Close()
			portsGiven[p], portsGiven[p+1] = true, true
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// torchrunEnv is what torchrun's LocalElasticAgent gives worker rank of a
// 2 nodes × 2 job (the machine identity stands in for the node).
func torchrunEnv(rank int, masterPort int, agentStore bool) map[string]string {
	return map[string]string{
		"RANK": strconv.Itoa(rank), "GROUP_RANK": strconv.Itoa(rank / 2),
		"ROLE_RANK": strconv.Itoa(rank), "ROLE_NAME": "default",
		"LOCAL_RANK": strconv.Itoa(rank % 2), "LOCAL_WORLD_SIZE": "2",
		"WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "4",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(masterPort),
		"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "launchtest",
		"TORCHELASTIC_USE_AGENT_STORE": pyBool(agentStore), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		"FAIRGO_MACHINE_ID": fmt.Sprintf("m%d", rank/2),
	}
}

// pyBool is Python's str(bool), as the agent writes it.
func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func TestLaunchTorchrunAgentStore(t *testing.T) {
	t.Parallel()
	addr, get := rendezvous.StartFakeC10dForTest(t, "") // torchrun's agent
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	envs := make([]map[string]string, 4)
	for r := range envs {
		envs[r] = torchrunEnv(r, p, true)
	}
	checkAgree(t, launch(t, envs), rendezvous.LauncherTorchrun, rendezvous.StoreC10d)
	// The keys are in the agent's store, as PyTorch's TCPStore would name them.
	v, ok := get("/fairgo/attempt_0/launchtest/count")
	require.True(t, ok)
	require.Equal(t, "4", string(v))
}

func TestLaunchTorchrunWithoutAgentStore(t *testing.T) {
	t.Parallel()
	// A Python rank 0 would serve PyTorch's own TCPStore on MASTER_PORT:
	// fairgo's goes on the next port and both coexist. The port was free
	// when freePorts saw it, but another process may take it before the
	// fake listens (CI once failed so): another pair then.
	var p int
	var torchKeys func(string) ([]byte, bool)
	for attempt := 1; torchKeys == nil; attempt++ {
		p = freePorts(t)
		var err error
		if torchKeys, err = rendezvous.TryFakeC10dForTest(t, "127.0.0.1:"+strconv.Itoa(p)); err != nil && attempt == 10 {
			t.Fatal(err)
		}
	}
	envs := make([]map[string]string, 4)
	for r := range envs {
		envs[r] = torchrunEnv(r, p, false)
	}
	checkAgree(t, launch(t, envs), rendezvous.LauncherTorchrun, rendezvous.StoreRank0)
	_, ok := torchKeys("/launchtest/count")
	require.False(t, ok)
}

func TestLaunchSlurm(t *testing.T) {
	t.Parallel()
	// MASTER_ADDR and MASTER_PORT derived: the first node of the list, and
	// a port from the job id (the store on the next one).
	p := freePorts(t)
	jobID := 40000 + p - 10000 // SlurmPort(jobID) == p
	require.Equal(t, p, rendezvous.SlurmPort(uint64(jobID)))
	envs := make([]map[string]string, 4)
	for r := range envs {
		envs[r] = map[string]string{
			"SLURM_PROCID": strconv.Itoa(r), "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
			"SLURM_LOCALID": strconv.Itoa(r % 2), "SLURM_NODEID": strconv.Itoa(r / 2), "SLURM_NNODES": "2",
			"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
			"SLURM_JOB_ID": strconv.Itoa(jobID), "SLURM_STEP_ID": "0",
			"SLURM_JOB_NODELIST": "localhost,node[02]", "SLURM_STEP_NODELIST": "localhost,node[02]",
			"SLURM_NODELIST": "localhost,node[02]", "SLURM_LAUNCH_NODE_IPADDR": "192.0.2.7",
			"SLURMD_NODENAME": []string{"localhost", "node02"}[r/2], "FAIRGO_MACHINE_ID": fmt.Sprintf("m%d", r/2),
		}
	}
	checkAgree(t, launch(t, envs), rendezvous.LauncherSlurm, rendezvous.StoreRank0)
}

func TestLaunchOpenMPI(t *testing.T) {
	t.Parallel()
	p := freePorts(t)
	envs := make([]map[string]string, 4)
	for r := range envs {
		envs[r] = map[string]string{
			"OMPI_COMM_WORLD_RANK": strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE": "4",
			"OMPI_COMM_WORLD_LOCAL_RANK": strconv.Itoa(r % 2),
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": strconv.Itoa(r % 2), "OMPI_UNIVERSE_SIZE": "4",
			"PMIX_RANK": strconv.Itoa(r),
			// mpirun -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=p -x FAIRGO_STORE_TOKEN=...
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(p), "FAIRGO_STORE_TOKEN": "mpi-job-token",
			"FAIRGO_MACHINE_ID": fmt.Sprintf("m%d", r/2),
		}
	}
	checkAgree(t, launch(t, envs), rendezvous.LauncherOpenMPI, rendezvous.StoreRank0)
}

func TestLaunchFairrun(t *testing.T) {
	t.Parallel()
	srv, err := rendezvous.Listen("127.0.0.1:0", rendezvous.WithToken("fairrun-token"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); <-served })
	envs := make([]map[string]string, 4)
	for r := range envs {
		envs[r] = torchrunEnv(r, 29500, false)
		for _, k := range []string{"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
			"TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "ROLE_RANK", "ROLE_NAME", "GROUP_WORLD_SIZE",
			"ROLE_WORLD_SIZE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"} {
			delete(envs[r], k)
		}
		envs[r]["FAIRGO_STORE_ADDR"] = srv.Addr()
		envs[r]["FAIRGO_STORE_TOKEN"] = "fairrun-token"
	}
	checkAgree(t, launch(t, envs), rendezvous.LauncherFairrun, rendezvous.StoreFairgo)
}
