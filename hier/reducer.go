package hier

import (
	"context"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/streams"
)

// CallOption adjusts one call.
type CallOption func(*callConfig)

type callConfig struct {
	after streams.Stream
}

// After makes the call's first stage wait for the work enqueued on s before
// the call (an event is recorded on s during the call, so later work on s is
// not waited for). Use it with the stream that produced the gradients.
func After(s streams.Stream) CallOption { return func(c *callConfig) { c.after = s } }

// Reducer runs fairgo's collectives for one rank (one device).
type Reducer struct {
	// filled in by the engine
}

// NewReducer builds the engine of one rank from its device, grid and
// communicators. Sim clusters and hier.New call it; trainers usually do not.
func NewReducer(ctx context.Context, r Rank, opts ...Option) (*Reducer, error) {
	_ = ctx
	_ = r
	_ = opts
	return nil, fairgo.ErrClosed
}

// AllReduce reduces t in place across all ranks.
func (r *Reducer) AllReduce(ctx context.Context, t fairgo.Tensor, op fairgo.Op, opts ...CallOption) *Work {
	return failedWork(fairgo.ErrClosed)
}

// Close releases the engine.
func (r *Reducer) Close() error { return nil }
