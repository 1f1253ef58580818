package fairgo

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

var opNames = names[Op]{Sum: "sum", Avg: "avg", Max: "max", Min: "min", Prod: "prod"}

// opAliases are the other names ParseOp accepts.
var opAliases = map[string]Op{"mean": Avg, "product": Prod}

// Valid reports whether o is one of the declared operators.
func (o Op) Valid() bool { return opNames.has(o) }

func (o Op) String() string { return opNames.of(o, "Op") }

// ParseOp reads an operator name as String prints it ("mean" and "product"
// are accepted too).
func ParseOp(s string) (Op, error) {
	if o, ok := opNames.parse(s, opAliases); ok {
		return o, nil
	}
	return 0, &ArgError{Arg: "op", Value: s, Reason: "unknown reduction operator", Err: ErrUnknownOp}
}
