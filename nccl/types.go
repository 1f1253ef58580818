package nccl

import (
	"fmt"

	"github.com/fairgo/fairgo"
)

// Result is an ncclResult_t.
type Result int

// NCCL's result codes, with NCCL's numeric values.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

var resultNames = map[Result]string{
	Success: "ncclSuccess", UnhandledCudaError: "ncclUnhandledCudaError", SystemError: "ncclSystemError",
	InternalError: "ncclInternalError", InvalidArgument: "ncclInvalidArgument", InvalidUsage: "ncclInvalidUsage",
	RemoteError: "ncclRemoteError", InProgress: "ncclInProgress", Timeout: "ncclTimeout",
}

func (r Result) String() string {
	if s, ok := resultNames[r]; ok {
		return s
	}
	return fmt.Sprintf("ncclResult(%d)", int(r))
}

// DataType is an ncclDataType_t.
type DataType int

// NCCL's element types, with NCCL's numeric values.
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	BFloat16 DataType = 9
)

// RedOp is an ncclRedOp_t.
type RedOp int

// NCCL's built-in reduction operators, with NCCL's numeric values.
const (
	Sum  RedOp = 0
	Prod RedOp = 1
	Max  RedOp = 2
	Min  RedOp = 3
	Avg  RedOp = 4
)

// VersionCode encodes a version the way NCCL_VERSION does for 2.9 and later
// (major·10000 + minor·100 + patch).
func VersionCode(major, minor, patch int) int { return major*10000 + minor*100 + patch }

// SplitVersion decodes a code returned by ncclGetVersion, including the
// pre-2.9 encoding (major·1000 + minor·100 + patch).
func SplitVersion(code int) (major, minor, patch int) {
	if code < 10000 {
		return code / 1000, (code % 1000) / 100, code % 100
	}
	return code / 10000, (code % 10000) / 100, code % 100
}

// Minimum versions, as version codes.
const (
	// MinVersion is the oldest NCCL the package loads (2.12: ncclGetLastError,
	// ncclAvg and bfloat16 are all there).
	MinVersion = 21200
	// ConfigMinVersion is the first NCCL with ncclCommInitRankConfig (2.14).
	ConfigMinVersion = 21400
	// SplitMinVersion is the first NCCL with ncclCommSplit (2.18).
	SplitMinVersion = 21800
)

type dtypeMapping struct {
	nccl DataType
	min  int // first NCCL version that has it
}

var dtypeTable = map[fairgo.DType]dtypeMapping{
	fairgo.Int8:     {Int8, 0},
	fairgo.Uint8:    {Uint8, 0},
	fairgo.Int32:    {Int32, 0},
	fairgo.Uint32:   {Uint32, 0},
	fairgo.Int64:    {Int64, 0},
	fairgo.Uint64:   {Uint64, 0},
	fairgo.Float16:  {Float16, 0},
	fairgo.Float32:  {Float32, 0},
	fairgo.Float64:  {Float64, 0},
	fairgo.BFloat16: {BFloat16, VersionCode(2, 10, 0)},
}

type opMapping struct {
	nccl RedOp
	min  int
}

var opTable = map[fairgo.Op]opMapping{
	fairgo.Sum:  {Sum, 0},
	fairgo.Prod: {Prod, 0},
	fairgo.Max:  {Max, 0},
	fairgo.Min:  {Min, 0},
	fairgo.Avg:  {Avg, VersionCode(2, 10, 0)},
}

// DataTypeOf maps a fairgo element type to NCCL's, and returns the first NCCL
// version that supports it (0 when every version does).
func DataTypeOf(dt fairgo.DType) (DataType, int, error) {
	m, ok := dtypeTable[dt]
	if !ok {
		return 0, 0, &fairgo.ArgError{
			Arg:    "dtype",
			Value:  dt,
			Reason: "no NCCL equivalent",
			Err:    fairgo.ErrUnknownDType,
		}
	}
	return m.nccl, m.min, nil
}

// RedOpOf maps a fairgo operator to NCCL's, and returns the first NCCL
// version that supports it (0 when every version does).
func RedOpOf(op fairgo.Op) (RedOp, int, error) {
	m, ok := opTable[op]
	if !ok {
		return 0, 0, &fairgo.ArgError{Arg: "op", Value: op, Reason: "no NCCL equivalent", Err: fairgo.ErrUnknownOp}
	}
	return m.nccl, m.min, nil
}

// UniqueIDBytes is the size of an ncclUniqueId.
const UniqueIDBytes = 128

// UniqueID is an ncclUniqueId: the rendezvous token rank 0 creates and every
// rank passes to CommInitRank.
type UniqueID [UniqueIDBytes]byte

// Bytes returns a copy of the id, for a rendezvous store.
func (id UniqueID) Bytes() []byte { return append([]byte(nil), id[:]...) }

// UniqueIDFromBytes reads an id written by Bytes.
func UniqueIDFromBytes(b []byte) (UniqueID, error) {
	var id UniqueID
	if len(b) != UniqueIDBytes {
		return id, &fairgo.ArgError{
			Arg:    "nccl unique id",
			Value:  fmt.Sprintf("%d bytes", len(b)),
			Reason: fmt.Sprintf("must be %d bytes", UniqueIDBytes),
		}
	}
	copy(id[:], b)
	return id, nil
}

// Config holds the communicator options fairgo sets; a zero field leaves
// NCCL's default (and NCCL's environment variables) in charge.
type Config struct {
	CGAClusterSize int
	MinCTAs        int
	MaxCTAs        int
	NetName        string // network plugin to use, e.g. "Socket"
	CommName       string // shows up in NCCL's logs (NCCL 2.20+)
	SplitShare     bool   // children made by Split share the parent's resources
}
