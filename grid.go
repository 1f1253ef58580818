package fairgo

import (
	"fmt"
)

// Grid is the M × D arrangement of ranks: Machines machines of Devices
// devices each, and this rank's place in it.
type Grid struct {
	Machines int // M
	Devices  int // D, devices per machine
	Machine  int // this rank's machine index m in [0, M)
	Local    int // this rank's local index d in [0, D)
}

// Size is the number of ranks, M × D.
func (g Grid) Size() int { return g.Machines * g.Devices }

// Rank is the rank's position in grid order, m·D + d: the block index of
// this rank in ReduceScatter inputs and AllGather outputs.
func (g Grid) Rank() int { return g.Machine*g.Devices + g.Local }

// Validate checks that the grid is well formed.
func (g Grid) Validate() error {
	switch {
	case g.Machines < 1:
		return &ArgError{Arg: "grid machines", Value: g.Machines, Reason: "must be at least 1"}
	case g.Devices < 1:
		return &ArgError{Arg: "grid devices", Value: g.Devices, Reason: "must be at least 1"}
	case g.Machine < 0 || g.Machine >= g.Machines:
		return &ArgError{
			Arg:    "grid machine index",
			Value:  g.Machine,
			Reason: fmt.Sprintf("outside [0, %d)", g.Machines),
		}
	case g.Local < 0 || g.Local >= g.Devices:
		return &ArgError{Arg: "grid local index", Value: g.Local, Reason: fmt.Sprintf("outside [0, %d)", g.Devices)}
	}
	return nil
}

func (g Grid) String() string {
	return fmt.Sprintf("%d×%d (machine %d, local %d)", g.Machines, g.Devices, g.Machine, g.Local)
}
