package fairgo

import "fmt"

// Op is a reduction operator, with the names PyTorch's ReduceOp uses.
type Op int

// The reduction operators. Avg is Sum divided by the number of ranks; for
// integer types the division truncates toward zero after a wrapping sum, as
// NCCL's ncclAvg does. The zero value is invalid.
const (
	Sum Op = iota + 1
	Avg
	Max
	Min
	Prod
)

// Ops lists every valid operator.
var Ops = []Op{Sum, Avg, Max, Min, Prod}

var opNames = map[Op]string{Sum: "sum", Avg: "avg", Max: "max", Min: "min", Prod: "prod"}

// Valid reports whether o is one of the declared operators.
func (o Op) Valid() bool { _, ok := opNames[o]; return ok }

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// ParseOp reads an operator name as String prints it ("mean" and "product"
// are accepted too).
func ParseOp(s string) (Op, error) {
	for o, n := range opNames {
		if n == s {
			return o, nil
		}
	}
	switch s {
	case "mean":
		return Avg, nil
	case "product":
		return Prod, nil
	}
	return 0, &ArgError{Arg: "op", Value: s, Reason: "unknown reduction operator", Err: ErrUnknownOp}
}
