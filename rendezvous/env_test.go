package rendezvous

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func lookupMap(m map[string]string) LookupFunc {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromLookup(t *testing.T) {
	torch := func(over map[string]string) map[string]string {
		m := map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
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
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "10.0.0.1", MasterPort: 1234, StoreAddr: "10.0.0.1:1234", Source: "torchrun"}},
		{name: "torchrun with FAIRGO_STORE_ADDR", env: torch(map[string]string{"FAIRGO_STORE_ADDR": "[::1]:999", "MASTER_ADDR": "-", "MASTER_PORT": "-"}),
			want: Launch{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "::1", MasterPort: 999, StoreAddr: "[::1]:999", Source: "torchrun"}},
		{name: "torchrun missing RANK", env: torch(map[string]string{"RANK": "-"}), errVar: "RANK", errText: "missing"},
		{name: "torchrun empty RANK", env: torch(map[string]string{"RANK": " "}), errVar: "RANK", errText: "missing"},
		{name: "torchrun missing LOCAL_WORLD_SIZE", env: torch(map[string]string{"LOCAL_WORLD_SIZE": "-"}), errVar: "LOCAL_WORLD_SIZE"},
		{name: "torchrun unparsable WORLD_SIZE", env: torch(map[string]string{"WORLD_SIZE": "eight"}), errVar: "WORLD_SIZE", errText: "not an integer"},
		{name: "RANK >= WORLD_SIZE", env: torch(map[string]string{"RANK": "8"}), errVar: "RANK", errText: "outside [0, WORLD_SIZE=8)"},
		{name: "negative RANK", env: torch(map[string]string{"RANK": "-1"}), errVar: "RANK"},
		{name: "WORLD_SIZE zero", env: torch(map[string]string{"WORLD_SIZE": "0", "RANK": "0"}), errVar: "WORLD_SIZE"},
		{name: "LOCAL_RANK >= LOCAL_WORLD_SIZE", env: torch(map[string]string{"LOCAL_RANK": "2"}), errVar: "LOCAL_RANK"},
		{name: "LOCAL_WORLD_SIZE > WORLD_SIZE", env: torch(map[string]string{"LOCAL_WORLD_SIZE": "16"}), errVar: "LOCAL_WORLD_SIZE"},
		{name: "torchrun missing MASTER_ADDR", env: torch(map[string]string{"MASTER_ADDR": "-"}), errVar: "MASTER_ADDR"},
		{name: "torchrun missing MASTER_PORT", env: torch(map[string]string{"MASTER_PORT": "-"}), errVar: "MASTER_PORT"},
		{name: "MASTER_PORT out of range", env: torch(map[string]string{"MASTER_PORT": "70000"}), errVar: "MASTER_PORT"},
		{name: "bad FAIRGO_STORE_ADDR", env: torch(map[string]string{"FAIRGO_STORE_ADDR": "nohost"}), errVar: "FAIRGO_STORE_ADDR"},
		{name: "openmpi", env: map[string]string{"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MASTER_ADDR": "h0"},
			want: Launch{Rank: 5, WorldSize: 6, LocalRank: 2, LocalWorldSize: 3, MasterAddr: "h0", MasterPort: DefaultMasterPort, StoreAddr: "h0:29500", Source: "openmpi"}},
		{name: "openmpi without address", env: map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, errVar: "MASTER_ADDR"},
		{name: "openmpi rank too large", env: map[string]string{"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "h"}, errVar: "OMPI_COMM_WORLD_RANK"},
		{name: "slurm per-node count", env: map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "4", "SLURM_LAUNCH_NODE_IPADDR": "10.1.1.1", "MASTER_PORT": "4000"},
			want: Launch{Rank: 4, WorldSize: 8, LocalRank: 0, LocalWorldSize: 4, MasterAddr: "10.1.1.1", MasterPort: 4000, StoreAddr: "10.1.1.1:4000", Source: "slurm"}},
		{name: "slurm compressed tasks per node", env: map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "2", "MASTER_ADDR": "m"},
			want: Launch{Rank: 5, WorldSize: 7, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "m", MasterPort: DefaultMasterPort, StoreAddr: "m:29500", Source: "slurm"}},
		{name: "slurm bad tasks per node", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2(x", "MASTER_ADDR": "m"}, errVar: "SLURM_TASKS_PER_NODE"},
		{name: "slurm node id out of range", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "2,1", "SLURM_NODEID": "2", "MASTER_ADDR": "m"}, errVar: "SLURM_NODEID"},
		{name: "slurm without tasks per node", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "MASTER_ADDR": "m"}, errVar: "SLURM_NTASKS_PER_NODE"},
		{name: "slurm without address", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "1"}, errVar: "MASTER_ADDR", errText: "SLURM_LAUNCH_NODE_IPADDR"},
		{name: "slurm local id too large", env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "2", "MASTER_ADDR": "m"}, errVar: "SLURM_LOCALID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromLookup(lookupMap(tc.env))
			if tc.errVar == "" {
				require.NoError(t, err)
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
