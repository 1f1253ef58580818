package streams

import (
	"errors"
	"fmt"
)

// Stage names one of the five pipeline stages of a slice.
type Stage int

// The stages, in pipeline order.
const (
	ReduceScatter Stage = iota // intra-machine reduce-scatter
	Collect                    // rail all-to-all of the machine-local sums
	Add                        // reduction of the received shards
	Diffuse                    // rail all-to-all of the reduced shard
	AllGather                  // intra-machine all-gather
	NumStages
)

var stageNames = [...]string{"reduce-scatter", "collect", "add", "diffuse", "all-gather"}

func (s Stage) String() string {
	if s >= 0 && s < NumStages {
		return stageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// Factory creates the streams and events a Chain needs; a device implements it.
type Factory interface {
	NewStream() (Stream, error)
	NewEvent() (Event, error)
}

// Chain owns one stream per stage and one event per hand-off between
// consecutive stages. The hand-off events are reused across slices: a wait
// captures the event's state when it is enqueued, so re-recording the event
// for the next slice does not disturb the waits of the previous one.
type Chain struct {
	streams  [NumStages]Stream
	handoffs [NumStages - 1]Event
}

// NewChain creates the five streams and four hand-off events.
func NewChain(f Factory) (*Chain, error) {
	c := &Chain{}
	for i := range c.streams {
		s, err := f.NewStream()
		if err != nil {
			return nil, fmt.Errorf("streams: creating the %s stream: %w", Stage(i), err)
		}
		c.streams[i] = s
	}
	for i := range c.handoffs {
		e, err := f.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("streams: creating the %s hand-off event: %w", Stage(i), err)
		}
		c.handoffs[i] = e
	}
	return c, nil
}

// Release destroys the chain's streams and events where the backend offers
// a Close or Destroy method. The work on them must be complete. A nil
// Chain has nothing to release.
func (c *Chain) Release() error {
	if c == nil {
		return nil
	}
	var errs []error
	for _, s := range c.streams {
		errs = append(errs, Release(s))
	}
	for _, e := range c.handoffs {
		errs = append(errs, Release(e))
	}
	return errors.Join(errs...)
}

// Release destroys a stream or event if its backend can (a Close() error or
// Destroy() error method); otherwise it does nothing.
func Release(x any) error {
	switch v := x.(type) {
	case interface{ Close() error }:
		return v.Close()
	case interface{ Destroy() error }:
		return v.Destroy()
	}
	return nil
}

// Stream returns the stream of a stage.
func (c *Chain) Stream(s Stage) Stream { return c.streams[s] }

// Record records the hand-off event at the end of stage from.
func (c *Chain) Record(from Stage) error {
	if from < 0 || from >= NumStages-1 {
		return fmt.Errorf("streams: no stage after %s", from)
	}
	if err := c.handoffs[from].Record(c.streams[from]); err != nil {
		return fmt.Errorf("streams: recording the %s hand-off: %w", from, err)
	}
	return nil
}

// RecordOn records the hand-off event at the end of stage from on s: a
// call may run a stage on another stage's stream (the rail's two
// exchanges on one stream), and then hands off from there.
func (c *Chain) RecordOn(from Stage, s Stream) error {
	if from < 0 || from >= NumStages-1 {
		return fmt.Errorf("streams: no stage after %s", from)
	}
	if err := c.handoffs[from].Record(s); err != nil {
		return fmt.Errorf("streams: recording the %s hand-off: %w", from, err)
	}
	return nil
}

// WaitOn makes s, the stream that runs stage to, wait on the hand-off event
// of the stage before it.
func (c *Chain) WaitOn(to Stage, s Stream) error {
	if to < 1 || to >= NumStages {
		return fmt.Errorf("streams: no stage before %s", to)
	}
	if err := s.WaitEvent(c.handoffs[to-1]); err != nil {
		return fmt.Errorf("streams: %s waiting on %s: %w", to, to-1, err)
	}
	return nil
}

// Wait makes stage to's stream wait on the hand-off event of the stage before it.
func (c *Chain) Wait(to Stage) error {
	if to < 1 || to >= NumStages {
		return fmt.Errorf("streams: no stage before %s", to)
	}
	if err := c.streams[to].WaitEvent(c.handoffs[to-1]); err != nil {
		return fmt.Errorf("streams: %s waiting on %s: %w", to, to-1, err)
	}
	return nil
}
