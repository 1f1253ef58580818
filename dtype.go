package fairgo

// DType is the element type of a tensor.
type DType int

// The element types fairgo reduces. The zero value is invalid, so a forgotten
// field is caught by validation instead of being read as float16.
const (
	Float16 DType = iota + 1
	BFloat16
	Float32
	Float64
	Int8
	Uint8
	Int32
	Uint32
	Int64
	Uint64
)

// DTypes lists every valid element type, in declaration order.
var DTypes = []DType{Float16, BFloat16, Float32, Float64, Int8, Uint8, Int32, Uint32, Int64, Uint64}

var dtypeNames = names[DType]{
	Float16: "float16", BFloat16: "bfloat16", Float32: "float32", Float64: "float64",
	Int8: "int8", Uint8: "uint8", Int32: "int32", Uint32: "uint32", Int64: "int64", Uint64: "uint64",
}

// dtypeAliases are the other names ParseDType accepts.
var dtypeAliases = map[string]DType{
	"fp16": Float16, "half": Float16, "bf16": BFloat16,
	"fp32": Float32, "float": Float32, "fp64": Float64, "double": Float64,
}

// Valid reports whether d is one of the declared element types: exactly
// those have a size (every call validates its tensor's type, so this is a
// switch, not a lookup in the names).
func (d DType) Valid() bool { return d.Size() > 0 }

// Size is the size of one element in bytes, or 0 for an invalid type.
func (d DType) Size() int {
	switch d {
	case Int8, Uint8:
		return 1
	case Float16, BFloat16:
		return 2
	case Float32, Int32, Uint32:
		return 4
	case Float64, Int64, Uint64:
		return 8
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float16 || d == BFloat16 || d == Float32 || d == Float64
}

// IsSigned reports whether d is a signed integer type.
func (d DType) IsSigned() bool { return d == Int8 || d == Int32 || d == Int64 }

// Epsilon is the unit roundoff of a floating-point type (half the distance
// from 1 to the next representable number), and 0 for integer types.
func (d DType) Epsilon() float64 {
	switch d {
	case Float16:
		return 1.0 / (1 << 11)
	case BFloat16:
		return 1.0 / (1 << 8)
	case Float32:
		return 1.0 / (1 << 24)
	case Float64:
		return 1.0 / (1 << 53)
	}
	return 0
}

func (d DType) String() string { return dtypeNames.of(d, "DType") }

// ParseDType reads a type name as String prints it ("bf16", "fp32", "half",
// "float" and "double" are accepted too).
func ParseDType(s string) (DType, error) {
	if d, ok := dtypeNames.parse(s, dtypeAliases); ok {
		return d, nil
	}
	return 0, &ArgError{Arg: "dtype", Value: s, Reason: "unknown element type", Err: ErrUnknownDType}
}
