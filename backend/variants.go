package backend

import "context"

// NCCLAlgo names one of NCCL's allreduce algorithms, as NCCL_ALGO spells it
// after "allreduce:".
type NCCLAlgo string

// The algorithms a world variant can be fixed to.
const (
	AlgoRing NCCLAlgo = "ring"
	AlgoTree NCCLAlgo = "tree"
)

// Variants makes, on demand, copies of a rank's world communicator on
// which NCCL runs its allreduce with one algorithm only: Auto's candidates
// beside NCCL's own choice. A backend without such a thing leaves
// Rank.Variants nil.
type Variants interface {
	// World returns a new communicator of the world's ranks, in the world's
	// order, on which NCCL's allreduce uses algo only (NCCL_ALGO set to
	// allreduce:algo while NCCL initialises it). It is collective: every
	// rank of the world calls it with the same algo, at the same place
	// among its calls that make or use communicators. The caller closes
	// the communicator it gets.
	World(ctx context.Context, algo NCCLAlgo) (Comm, error)
}
