package rendezvous

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func lookupMap(m map[string]string) LookupFunc {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromLookup(t *testing.T) {
	torch := func(over map[string]string) map[string]string {
		m := map[string]string{
			"RANK":             "3",
			"WORLD_SIZE":       "8",
			"LOCAL_RANK":       "1",
			"LOCAL_WORLD_SIZE": "2",
			"MASTER_ADDR":      "10.0.0.1",
			"MASTER_PORT":      "1234",
		}
		for k, v := range over {
			if v == "-" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Launch
		errVar  string // the variable the error must name; "" : no error
		errText string
	}{
		{name: "torchrun", env: torch(nil),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:1235", Source: "torchrun", Launcher: "env", StoreKind: StoreRank0}},
		{name: "torchrun with agent store", env: torch(map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "True",
			"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "none"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:1234", Source: "torchrun", Launcher: "torchrun",
				StoreKind: StoreC10d, AgentStore: true, RestartCount: 2}},
		{name: "torchrun without agent store", env: torch(map[string]string{
			"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RUN_ID": "x",
		}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:1235", Source: "torchrun", Launcher: "torchrun",
				StoreKind: StoreRank0}},
		{name: "agent store flag is exactly True", env: torch(map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "true"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:1235", Source: "torchrun", Launcher: "torchrun",
				StoreKind: StoreRank0}},
		{name: "FAIRGO_STORE_PORT", env: torch(map[string]string{"FAIRGO_STORE_PORT": "7000"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:7000", Source: "torchrun", Launcher: "env", StoreKind: StoreRank0}},
		{name: "token", env: torch(map[string]string{"FAIRGO_STORE_TOKEN": "s3 cret"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1",
				MasterPort: 1234, StoreAddr: "10.0.0.1:1235", StoreToken: "s3 cret", Source: "torchrun",
				Launcher: "env", StoreKind: StoreRank0}},
		{name: "MASTER_PORT 65535 leaves no port for the store",
			env: torch(map[string]string{"MASTER_PORT": "65535"}), errVar: "MASTER_PORT",
			errText: "FAIRGO_STORE_PORT"},
		{name: "bad FAIRGO_STORE_PORT", env: torch(map[string]string{"FAIRGO_STORE_PORT": "0"}), errVar: "FAIRGO_STORE_PORT"},
		{name: "torchrun with FAIRGO_STORE_ADDR", env: torch(map[string]string{"FAIRGO_STORE_ADDR": "[::1]:999",
			"MASTER_ADDR": "-", "MASTER_PORT": "-"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "::1", MasterPort: 999,
				StoreAddr: "[::1]:999", Source: "torchrun", Launcher: "fairrun", StoreKind: StoreFairgo}},
		{name: "torchrun missing RANK", env: torch(map[string]string{"RANK": "-"}), errVar: "RANK", errText: "missing"},
		{name: "torchrun empty RANK", env: torch(map[string]string{"RANK": " "}), errVar: "RANK", errText: "missing"},
		{name: "torchrun missing LOCAL_WORLD_SIZE", env: torch(map[string]string{"LOCAL_WORLD_SIZE": "-"}),
			errVar: "LOCAL_WORLD_SIZE"},
		{name: "torchrun unparsable WORLD_SIZE", env: torch(map[string]string{"WORLD_SIZE": "eight"}),
			errVar: "WORLD_SIZE", errText: "not an integer"},
		{name: "RANK >= WORLD_SIZE", env: torch(map[string]string{"RANK": "8"}), errVar: "RANK",
			errText: "outside [0, WORLD_SIZE=8)"},
		{name: "negative RANK", env: torch(map[string]string{"RANK": "-1"}), errVar: "RANK"},
		{name: "WORLD_SIZE zero", env: torch(map[string]string{"WORLD_SIZE": "0", "RANK": "0"}), errVar: "WORLD_SIZE"},
		{name: "LOCAL_RANK >= LOCAL_WORLD_SIZE", env: torch(map[string]string{"LOCAL_RANK": "2"}), errVar: "LOCAL_RANK"},
		{name: "LOCAL_WORLD_SIZE > WORLD_SIZE", env: torch(map[string]string{"LOCAL_WORLD_SIZE": "16"}),
			errVar: "LOCAL_WORLD_SIZE"},
		{name: "torchrun missing MASTER_ADDR", env: torch(map[string]string{"MASTER_ADDR": "-"}), errVar: "MASTER_ADDR"},
		{name: "torchrun missing MASTER_PORT", env: torch(map[string]string{"MASTER_PORT": "-"}), errVar: "MASTER_PORT"},
		{name: "MASTER_PORT out of range", env: torch(map[string]string{"MASTER_PORT": "70000"}), errVar: "MASTER_PORT"},
		{name: "bad FAIRGO_STORE_ADDR", env: torch(map[string]string{"FAIRGO_STORE_ADDR": "nohost"}),
			errVar: "FAIRGO_STORE_ADDR"},
		{name: "openmpi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
			"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MASTER_ADDR": "h0"},
			want: Launch{Rank: 5, WorldSize: 6, LocalRank: 2, LocalWorldSize: 3, MasterAddr: "h0",
				MasterPort: DefaultMasterPort, StoreAddr: "h0:29501", Source: "openmpi", Launcher: "openmpi",
				StoreKind: StoreRank0}},
		{name: "openmpi without address",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
				"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
			errVar: "MASTER_ADDR", errText: "mpirun -x MASTER_ADDR"},
		{name: "openmpi rank too large",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "6",
				"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "h"},
			errVar: "OMPI_COMM_WORLD_RANK"},
		{name: "slurm per-node count", env: map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "8",
			"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "4", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1",
			"MASTER_PORT": "4000"},
			want: Launch{Rank: 4, WorldSize: 8, LocalRank: 0, LocalWorldSize: 4, MasterAddr: "10.1.1.1",
				MasterPort: 4000, StoreAddr: "10.1.1.1:4001", Source: "slurm", Launcher: "slurm", StoreKind: StoreRank0}},
		{name: "slurm address and port derived", env: map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "8",
			"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_ID": "123456",
			"SLURM_JOB_NODELIST": "gpu[01-03,07],login1", "SLURM_LAUNCH_NODE_IPADDR": "10.9.9.9"},
			want: Launch{Rank: 1, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "gpu01",
				MasterPort: 13456, StoreAddr: "gpu01:13457", Source: "slurm", Launcher: "slurm", StoreKind: StoreRank0}},
		{name: "slurm step node list first", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
			"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[3-4]",
			"SLURM_JOB_NODELIST": "n[1-4]"},
			want: Launch{Rank: 0, WorldSize: 2, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "n3", MasterPort: 10007,
				StoreAddr: "n3:10008", Source: "slurm", Launcher: "slurm", StoreKind: StoreRank0}},
		{name: "slurm MASTER_ADDR wins", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2",
			"SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-4]",
			"MASTER_ADDR": "m", "MASTER_PORT": "555"},
			want: Launch{Rank: 0, WorldSize: 2, LocalRank: 0, LocalWorldSize: 1, MasterAddr: "m", MasterPort: 555,
				StoreAddr: "m:556", Source: "slurm", Launcher: "slurm", StoreKind: StoreRank0}},
		{name: "slurm bad node list",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
				"SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "n[1-"},
			errVar: "SLURM_JOB_NODELIST"},
		{name: "slurm bad job id",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
				"SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "x"},
			errVar: "SLURM_JOB_ID"},
		{name: "slurm compressed tasks per node", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "7",
			"SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2", "MASTER_ADDR": "m"},
			want: Launch{Rank: 5, WorldSize: 7, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "m",
				MasterPort: DefaultMasterPort, StoreAddr: "m:29501", Source: "slurm", Launcher: "slurm",
				StoreKind: StoreRank0}},
		{name: "slurm bad tasks per node",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
				"SLURM_TASKS_PER_NODE": "2(x", "MASTER_ADDR": "m"},
			errVar: "SLURM_TASKS_PER_NODE"},
		{name: "slurm node id out of range",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
				"SLURM_TASKS_PER_NODE": "2,1", "SLURM_NODEID": "2", "MASTER_ADDR": "m"},
			errVar: "SLURM_NODEID"},
		{name: "slurm without tasks per node",
			env:    map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "MASTER_ADDR": "m"},
			errVar: "SLURM_NTASKS_PER_NODE"},
		{name: "slurm without address",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
				"SLURM_NTASKS_PER_NODE": "1"},
			errVar: "MASTER_ADDR", errText: "SLURM_LAUNCH_NODE_IPADDR"},
		{name: "slurm local id too large",
			env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2",
				"SLURM_NTASKS_PER_NODE": "2", "MASTER_ADDR": "m"},
			errVar: "SLURM_LOCALID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromLookup(lookupMap(tc.env))
			if tc.errVar == "" {
				require.NoError(t, err)
				require.NotEmpty(t, got.Vars)
				got.Vars = nil // checked in TestFromLookupVars
				require.Equal(t, tc.want, got)
				return
			}
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalidEnv)
			var ee *EnvError
			require.ErrorAs(t, err, &ee)
			require.Equal(t, tc.errVar, ee.Var, "error: %v", err)
			require.Contains(t, err.Error(), tc.errVar)
			if tc.errText != "" {
				require.Contains(t, err.Error(), tc.errText)
			}
		})
	}
	_, err := FromLookup(lookupMap(nil))
	require.ErrorIs(t, err, ErrNoLaunchEnv)
}

func TestParseSlurmTasksPerNode(t *testing.T) {
	for in, want := range map[string][]int{"4": {4}, "2(x3),1": {2, 2, 2, 1}, "1,3(x2)": {1, 3, 3}} {
		got, err := parseSlurmTasksPerNode(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "x", "0", "2(x0)", "2(x", "-1"} {
		_, err := parseSlurmTasksPerNode(in)
		require.Error(t, err, in)
	}
}

// Launch.Vars records what was read, the token's value hidden.
func TestFromLookupVars(t *testing.T) {
	l, err := FromLookup(
		lookupMap(
			map[string]string{
				"SLURM_PROCID":          "1",
				"SLURM_NTASKS":          "2",
				"SLURM_LOCALID":         "0",
				"SLURM_NTASKS_PER_NODE": "1",
				"SLURM_JOB_NODELIST":    "gpu[01-02]",
				"FAIRGO_STORE_TOKEN":    "very-secret",
			},
		),
	)
	require.NoError(t, err)
	s := l.VarsString()
	for _, want := range []string{`SLURM_PROCID="1"`, `SLURM_JOB_NODELIST="gpu[01-02]"`, "MASTER_ADDR unset",
		"MASTER_PORT unset", `FAIRGO_STORE_TOKEN="(hidden)"`} {
		require.Contains(t, s, want)
	}
	require.NotContains(t, s, "very-secret")
	require.Equal(t, "very-secret", l.StoreToken)
}

func TestSlurmHostlist(t *testing.T) {
	for in, want := range map[string][]string{
		"gpu01":                 {"gpu01"},
		"gpu[01-03,07],login1":  {"gpu01", "gpu02", "gpu03", "gpu07", "login1"},
		"n[8-10]":               {"n8", "n9", "n10"},
		"n[08-10]":              {"n08", "n09", "n10"},
		"r[1-2]n[1-2]":          {"r1n1", "r1n2", "r2n1", "r2n2"},
		"a,b[1],c[2-3]-ib":      {"a", "b1", "c2-ib", "c3-ib"},
		" node-[5,3] ":          {"node-5", "node-3"},
		"host.example.com,h[1]": {"host.example.com", "h1"},
	} {
		got, err := SlurmHostlist(in, 0)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		first, err := SlurmHostlist(in, 1)
		require.NoError(t, err, in)
		require.Equal(t, want[:1], first, in)
	}
	for _, in := range []string{"", "a,,b", "n[1-", "n1]", "n[[1]]", "n[3-1]", "n[]", "n[a-b]", "n[1-2-3]",
		"n[0-99999999]"} {
		_, err := SlurmHostlist(in, 0)
		require.Error(t, err, in)
	}
}

// Compressing random host lists the way Slurm prints them and expanding
// them again gives the hosts back.
func TestSlurmHostlistProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var parts, want []string
		for range rapid.IntRange(1, 4).Draw(t, "items") {
			prefix := rapid.StringMatching(`[a-z][a-z0-9-]{0,6}[a-z]`).Draw(t, "prefix")
			if !rapid.Bool().Draw(t, "bracket") {
				parts, want = append(parts, prefix), append(want, prefix)
				continue
			}
			width := rapid.IntRange(1, 4).Draw(t, "width")
			var ranges []string
			for range rapid.IntRange(1, 3).Draw(t, "ranges") {
				lo := rapid.IntRange(0, 50).Draw(t, "lo")
				hi := lo + rapid.IntRange(0, 5).Draw(t, "span")
				for n := lo; n <= hi; n++ {
					want = append(want, fmt.Sprintf("%s%0*d", prefix, width, n))
				}
				if lo == hi {
					ranges = append(ranges, fmt.Sprintf("%0*d", width, lo))
				} else {
					ranges = append(ranges, fmt.Sprintf("%0*d-%0*d", width, lo, width, hi))
				}
			}
			parts = append(parts, prefix+"["+strings.Join(ranges, ",")+"]")
		}
		list := strings.Join(parts, ",")
		got, err := SlurmHostlist(list, 0)
		if err != nil {
			t.Fatalf("%q: %v", list, err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%q: got %v, want %v", list, got, want)
		}
		k := rapid.IntRange(1, len(want)).Draw(t, "limit")
		got, err = SlurmHostlist(list, k)
		if err != nil || !slices.Equal(got, want[:k]) {
			t.Fatalf("%q limit %d: got %v, %v", list, k, got, err)
		}
	})
}
