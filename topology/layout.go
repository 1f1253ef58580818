package topology

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fairgo/fairgo"
)

// Member is what one rank publishes about itself.
type Member struct {
	Rank          int    `json:"rank"`
	WorldSize     int    `json:"world"`
	MachineID     string `json:"machine"`
	MachineSource string `json:"machine_source,omitempty"`
	Hostname      string `json:"host,omitempty"`
	Device        Device `json:"device"`
}

// Machine is one machine of a Layout.
type Machine struct {
	ID    string // the machine identity its ranks reported
	Ranks []int  // global ranks, by local index
}

// Layout is the grid every rank computes from the same members. Machines
// are ordered by the smallest global rank on each; ranks within a machine
// (their local index) by global rank.
type Layout struct {
	Rank     int         // the rank this layout was built for
	Grid     fairgo.Grid // its coordinates
	Members  []Member    // by global rank
	Machines []Machine   // by machine index
	coords   []fairgo.Grid
}

// Sentinels of the typed errors; test with errors.Is.
var (
	ErrIrregular       = errors.New("topology: machines have different device counts")
	ErrDuplicateDevice = errors.New("topology: two ranks claim one device on one machine")
	ErrIncomplete      = errors.New("topology: not every rank joined")
	ErrBadMember       = errors.New("topology: invalid member")
)

// MachineReport is what the ranks of one machine reported, for errors.
type MachineReport struct {
	ID        string
	Hostnames []string
	Ranks     []int
	Devices   []string // device ids, parallel to Ranks
}

func (r MachineReport) String() string {
	return fmt.Sprintf("machine %q (hosts %s): %d ranks %v devices [%s]",
		r.ID, strings.Join(r.Hostnames, ","), len(r.Ranks), r.Ranks, strings.Join(r.Devices, " "))
}

func reportLines(rs []MachineReport) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString("\n  ")
		b.WriteString(r.String())
	}
	return b.String()
}

// Reports groups members by machine, machines by smallest rank, ranks
// ascending.
func Reports(members []Member) []MachineReport {
	ms := slices.Clone(members)
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Rank, b.Rank) })
	var out []MachineReport
	at := map[string]int{}
	for _, m := range ms {
		i, ok := at[m.MachineID]
		if !ok {
			i = len(out)
			at[m.MachineID] = i
			out = append(out, MachineReport{ID: m.MachineID})
		}
		r := &out[i]
		r.Ranks = append(r.Ranks, m.Rank)
		r.Devices = append(r.Devices, m.Device.ID)
		if m.Hostname != "" && !slices.Contains(r.Hostnames, m.Hostname) {
			r.Hostnames = append(r.Hostnames, m.Hostname)
		}
	}
	return out
}

// IrregularError: machines hold different numbers of ranks.
type IrregularError struct{ Machines []MachineReport }

func (e *IrregularError) Error() string {
	return fmt.Sprintf(
		"%v (every machine must hold the same number of ranks):%s",
		ErrIrregular,
		reportLines(e.Machines),
	)
}
func (e *IrregularError) Unwrap() error { return ErrIrregular }

// DuplicateDeviceError: ranks on one machine reported the same device.
type DuplicateDeviceError struct {
	Machine  string
	Device   string
	Ranks    []int
	Machines []MachineReport
}

func (e *DuplicateDeviceError) Error() string {
	return fmt.Sprintf(
		"%v: ranks %v on machine %q all use device %s (ranks that share a GPU need different machine "+
			"identities, or device identities of their own in %s):%s",
		ErrDuplicateDevice,
		e.Ranks,
		e.Machine,
		e.Device,
		EnvDeviceID,
		reportLines(e.Machines),
	)
}
func (e *DuplicateDeviceError) Unwrap() error { return ErrDuplicateDevice }

// MemberError: a member's fields are invalid or contradict the others.
type MemberError struct {
	Rank   int
	Reason string
}

func (e *MemberError) Error() string {
	return fmt.Sprintf("%v: rank %d: %s", ErrBadMember, e.Rank, e.Reason)
}
func (e *MemberError) Unwrap() error { return ErrBadMember }

// Build computes the layout of members (one per global rank, in any order)
// for rank self. Every rank given the same members computes the same grid.
func Build(members []Member, self int) (*Layout, error) {
	w := len(members)
	if w == 0 {
		return nil, &MemberError{Rank: self, Reason: "no members"}
	}
	byRank := make([]Member, w)
	seen := make([]bool, w)
	for _, m := range members {
		switch {
		case m.Rank < 0 || m.Rank >= w:
			return nil, &MemberError{Rank: m.Rank, Reason: fmt.Sprintf("outside [0, %d)", w)}
		case seen[m.Rank]:
			return nil, &MemberError{Rank: m.Rank, Reason: "reported twice"}
		case m.WorldSize != 0 && m.WorldSize != w:
			return nil, &MemberError{
				Rank:   m.Rank,
				Reason: fmt.Sprintf("started with world size %d, but %d ranks joined", m.WorldSize, w),
			}
		case m.MachineID == "":
			return nil, &MemberError{Rank: m.Rank, Reason: "empty machine identity"}
		case m.Device.ID == "":
			return nil, &MemberError{Rank: m.Rank, Reason: "empty device identity"}
		}
		seen[m.Rank] = true
		byRank[m.Rank] = m
	}
	if self < 0 || self >= w {
		return nil, &MemberError{Rank: self, Reason: fmt.Sprintf("this rank is outside [0, %d)", w)}
	}
	reports := Reports(byRank)
	if err := explicitOnWholeMachines(byRank); err != nil {
		return nil, err
	}
	for _, r := range reports {
		owned := map[string]bool{}
		for _, dev := range r.Devices {
			if owned[dev] {
				var ranks []int
				for k, d := range r.Devices {
					if d == dev {
						ranks = append(ranks, r.Ranks[k])
					}
				}
				return nil, &DuplicateDeviceError{Machine: r.ID, Device: dev, Ranks: ranks, Machines: reports}
			}
			owned[dev] = true
		}
	}
	d := len(reports[0].Ranks)
	for _, r := range reports[1:] {
		if len(r.Ranks) != d {
			return nil, &IrregularError{Machines: reports}
		}
	}
	l := &Layout{Rank: self, Members: byRank, coords: make([]fairgo.Grid, w)}
	for mi, r := range reports {
		l.Machines = append(l.Machines, Machine{ID: r.ID, Ranks: r.Ranks})
		for di, rank := range r.Ranks {
			l.coords[rank] = fairgo.Grid{Machines: len(reports), Devices: d, Machine: mi, Local: di}
		}
	}
	l.Grid = l.coords[self]
	return l, nil
}

// explicitOnWholeMachines refuses a machine where some ranks took their
// device identity from FAIRGO_DEVICE_ID and others from their GPU: an
// explicit identity cannot be compared with a GPU's, so two such ranks
// could share a GPU unnoticed.
func explicitOnWholeMachines(byRank []Member) error {
	explicit := map[string][]int{}
	physical := map[string][]int{}
	for _, m := range byRank {
		if m.Device.ExplicitID() {
			explicit[m.MachineID] = append(explicit[m.MachineID], m.Rank)
		} else {
			physical[m.MachineID] = append(physical[m.MachineID], m.Rank)
		}
	}
	for _, m := range byRank { // by rank: the same error on every rank
		if e, p := explicit[m.MachineID], physical[m.MachineID]; len(e) > 0 && len(p) > 0 {
			return &MemberError{
				Rank: p[0],
				Reason: fmt.Sprintf(
					"machine %q: ranks %v give %s and ranks %v do not; set it on every rank of a machine or on none",
					m.MachineID,
					e,
					EnvDeviceID,
					p,
				),
			}
		}
	}
	return nil
}

// WorldSize is the number of ranks.
func (l *Layout) WorldSize() int { return len(l.Members) }

// GridOf returns the coordinates of a global rank.
func (l *Layout) GridOf(rank int) fairgo.Grid { return l.coords[rank] }

// RankAt returns the global rank at machine m, local index d.
func (l *Layout) RankAt(m, d int) int { return l.Machines[m].Ranks[d] }

// Intra returns the global ranks of machine m, by local index.
func (l *Layout) Intra(m int) []int { return slices.Clone(l.Machines[m].Ranks) }

// Rail returns the global ranks of local index d, by machine index.
func (l *Layout) Rail(d int) []int {
	out := make([]int, len(l.Machines))
	for m, mc := range l.Machines {
		out[m] = mc.Ranks[d]
	}
	return out
}

// IntraRanks returns this rank's machine, by local index.
func (l *Layout) IntraRanks() []int { return l.Intra(l.Grid.Machine) }

// RailRanks returns this rank's rail, by machine index.
func (l *Layout) RailRanks() []int { return l.Rail(l.Grid.Local) }

func (l *Layout) String() string {
	g := l.Grid
	return fmt.Sprintf("grid %dx%d machine %d local %d rank %d", g.Machines, g.Devices, g.Machine, g.Local, l.Rank)
}
