package topology

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// genWorld draws an M × D world whose global ranks are spread over machines
// in a random order, with device ids in a random order on each machine.
func genWorld(t *rapid.T) (m, d int, members []Member, machineOf []string) {
	m = rapid.IntRange(1, 6).Draw(t, "machines")
	d = rapid.IntRange(1, 6).Draw(t, "devices")
	perm := rapid.Permutation(seq(m*d)).Draw(t, "rank order")
	ids := rapid.Permutation(seq(m)).Draw(t, "machine ids")
	machineOf = make([]string, m*d)
	for mi := range m {
		devs := rapid.Permutation(seq(d)).Draw(t, fmt.Sprint("devices of machine ", mi))
		for di := range d {
			r := perm[mi*d+di]
			mid := fmt.Sprintf("host-%d", ids[mi])
			machineOf[r] = mid
			members = append(members, Member{Rank: r, WorldSize: m * d, MachineID: mid, Hostname: mid,
				Device: Device{ID: fmt.Sprintf("GPU-%d", devs[di]), Index: devs[di]}})
		}
	}
	return m, d, members, machineOf
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func TestPropertyGridConsistent(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m, d, members, machineOf := genWorld(t)
		w := m * d
		var first *Layout
		for self := range w {
			// Every rank sees the members in its own order.
			shuffled := rapid.Permutation(members).Draw(t, fmt.Sprint("members seen by ", self))
			l, err := Build(shuffled, self)
			require.NoError(t, err)
			g := l.Grid
			require.NoError(t, g.Validate())
			require.Equal(t, m, g.Machines)
			require.Equal(t, d, g.Devices)
			require.Equal(t, self, l.RankAt(g.Machine, g.Local))
			require.Equal(t, g.Machine*d+g.Local, g.Rank())
			if first == nil {
				first = l
				continue
			}
			require.Equal(t, first.Machines, l.Machines, "rank %d computed another grid", self)
			for r := range w {
				require.Equal(t, first.GridOf(r), l.GridOf(r))
			}
		}

		// Every (m, d) exactly once, and the coordinates agree with the lists.
		seen := map[[2]int]int{}
		for r := range w {
			g := first.GridOf(r)
			k := [2]int{g.Machine, g.Local}
			_, dup := seen[k]
			require.False(t, dup, "cell %v twice", k)
			seen[k] = r
		}
		require.Len(t, seen, w)

		// Machines ordered by smallest rank; ranks within a machine
		// ascending; every machine is one reported machine, whole.
		for mi, mc := range first.Machines {
			require.True(t, slices.IsSorted(mc.Ranks))
			if mi > 0 {
				require.Less(t, first.Machines[mi-1].Ranks[0], mc.Ranks[0])
			}
			for _, r := range mc.Ranks {
				require.Equal(t, mc.ID, machineOf[r])
			}
		}

		// Intra and rail lists are the rows and columns of one matrix, and
		// the split colors and keys match them.
		for mi := range m {
			intra := first.Intra(mi)
			require.Len(t, intra, d)
			for di, r := range intra {
				require.Equal(t, r, first.Rail(di)[mi])
				l, err := Build(members, r)
				require.NoError(t, err)
				c, k := l.IntraSplit()
				require.Equal(t, [2]int{mi, di}, [2]int{c, k})
				c, k = l.RailSplit()
				require.Equal(t, [2]int{di, mi}, [2]int{c, k})
				require.Equal(t, intra, l.IntraRanks())
				require.Equal(t, first.Rail(di), l.RailRanks())
			}
		}
	})
}

// Removing one rank of a multi-device world leaves an irregular one, which
// every rank rejects naming each machine.
func TestPropertyIrregular(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m, d, members, _ := genWorld(t)
		if m < 2 || d < 2 {
			t.Skip("needs two machines of two")
		}
		drop := rapid.IntRange(0, len(members)-1).Draw(t, "dropped")
		gone := members[drop].Rank
		var rest []Member
		for _, mb := range members {
			if mb.Rank == gone {
				continue
			}
			if mb.Rank > gone {
				mb.Rank--
			}
			mb.WorldSize--
			rest = append(rest, mb)
		}
		_, err := Build(rest, 0)
		require.ErrorIs(t, err, ErrIrregular)
		var ie *IrregularError
		require.ErrorAs(t, err, &ie)
		require.Len(t, ie.Machines, m)
	})
}

// Two ranks of one machine with one device id are always caught.
func TestPropertyDuplicateDevice(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		_, d, members, _ := genWorld(t)
		if d < 2 {
			t.Skip("needs two devices per machine")
		}
		i := rapid.IntRange(0, len(members)-1).Draw(t, "victim")
		// Copy the device of another rank of the same machine.
		for j, mb := range members {
			if j != i && mb.MachineID == members[i].MachineID {
				members[i].Device = mb.Device
				break
			}
		}
		_, err := Build(members, 0)
		require.ErrorIs(t, err, ErrDuplicateDevice)
	})
}

// Ranks that share GPUs but each give FAIRGO_DEVICE_ID an identity of
// their own make the same grid as ranks on GPUs of their own; an identity
// claimed twice on one machine is refused naming exactly those ranks; a
// machine where one rank lacks the variable is refused.
func TestPropertyExplicitDeviceIDs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m, d, members, _ := genWorld(t)
		want, err := Build(members, 0)
		require.NoError(t, err)
		gpus := rapid.IntRange(1, d).Draw(t, "GPUs per machine")
		local := map[string]int{}
		byRank := slices.Clone(members)
		slices.SortFunc(byRank, func(a, b Member) int { return a.Rank - b.Rank })
		shared := make([]Member, len(members))
		for _, mb := range byRank {
			l := local[mb.MachineID]
			local[mb.MachineID]++
			gpu := l % gpus
			mb.Device = Device{ID: fmt.Sprintf("%d/r%d", gpu, l), Index: gpu, Source: SourceExplicit + SourceVisible}
			shared[mb.Rank] = mb
		}
		got, err := Build(rapid.Permutation(shared).Draw(t, "members seen"), 0)
		require.NoError(t, err)
		require.Equal(t, want.Machines, got.Machines)
		require.Equal(
			t,
			fairgo.Grid{Machines: m, Devices: d},
			fairgo.Grid{Machines: got.Grid.Machines, Devices: got.Grid.Devices},
		)
		if d < 2 {
			return
		}

		// One rank takes the identity of another rank of its machine.
		victim := rapid.IntRange(0, len(shared)-1).Draw(t, "victim")
		var donor int
		for _, mb := range shared {
			if mb.Rank != victim && mb.MachineID == shared[victim].MachineID {
				donor = mb.Rank
				break
			}
		}
		dup := slices.Clone(shared)
		dup[victim].Device.ID = dup[donor].Device.ID
		_, err = Build(dup, 0)
		require.ErrorIs(t, err, ErrDuplicateDevice)
		var de *DuplicateDeviceError
		require.ErrorAs(t, err, &de)
		require.Equal(t, shared[victim].MachineID, de.Machine)
		require.Equal(t, []int{min(victim, donor), max(victim, donor)}, de.Ranks)

		// One rank of a machine describes its GPU instead.
		mixed := slices.Clone(shared)
		mixed[victim].Device = Device{ID: "GPU-x", Index: 0, Source: SourceNVML}
		_, err = Build(mixed, 0)
		require.ErrorIs(t, err, ErrBadMember)
		require.ErrorContains(t, err, EnvDeviceID)
	})
}
