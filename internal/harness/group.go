package harness

import (
	"context"
	"fmt"
	"strconv"

	"github.com/fairgo/fairgo/rendezvous"
)

// group is the processes of one job meeting through a store: one rank per
// process, rank in [0, size).
type group struct {
	store      rendezvous.Store
	rank, size int
	barriers   int
}

// barrier returns once every process has called it as often as this one.
func (g *group) barrier(ctx context.Context) error {
	g.barriers++
	key := "barrier/" + strconv.Itoa(g.barriers)
	n, err := g.store.Add(ctx, key, 1)
	if err != nil {
		return fmt.Errorf("testbed: barrier: %w", err)
	}
	if n == int64(g.size) {
		if err := g.store.Set(ctx, key+"/done", nil); err != nil {
			return fmt.Errorf("testbed: barrier: %w", err)
		}
	}
	if err := g.store.Wait(ctx, key+"/done"); err != nil {
		return fmt.Errorf("testbed: barrier: %w", err)
	}
	return nil
}

// gather publishes blob under key; the root (or every process, when all)
// gets every process's blob in process order, the others nil.
func (g *group) gather(ctx context.Context, key string, blob []byte, all bool) ([][]byte, error) {
	if err := g.store.Set(ctx, fmt.Sprintf("gather/%s/%d", key, g.rank), blob); err != nil {
		return nil, fmt.Errorf("testbed: gather %s: %w", key, err)
	}
	if !all && g.rank != 0 {
		return nil, nil
	}
	out := make([][]byte, g.size)
	for p := range out {
		v, err := g.store.Get(ctx, fmt.Sprintf("gather/%s/%d", key, p))
		if err != nil {
			return nil, fmt.Errorf("testbed: gather %s from process %d: %w", key, p, err)
		}
		out[p] = v
	}
	return out, nil
}
