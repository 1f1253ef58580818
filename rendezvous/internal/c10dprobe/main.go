// Command c10dprobe checks rendezvous.C10dClient and rendezvous.Open under a
// real launcher. Run it as every rank of a job, for instance on a machine
// with PyTorch:
//
//	go build -o /tmp/c10dprobe ./rendezvous/internal/c10dprobe
//	python3 -m torch.distributed.run --nproc-per-node 2 --no-python /tmp/c10dprobe
//
// With torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) it first
// talks to that store with the c10d client directly, then through
// rendezvous.Open; without one, only through Open (rank 0 then hosts a
// fairgo store on MASTER_PORT+1). Each pass sets, adds, waits, reads every
// rank's key, races a compare-set, checks that a Get whose ctx ends leaves
// the client usable, and deletes. With -py it also reads the key
// "py/<rank>" that interop.py set through PyTorch's own TCPStore and sets
// "go/<rank>" for it. Every rank prints one "ok" line per pass, or an error
// and exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/fairgo/fairgo/rendezvous"
)

func main() {
	mode := flag.String("mode", "auto", "auto: c10d (when torchrun has an agent store) then open; c10d; open")
	py := flag.Bool("py", false, "also exchange keys with interop.py through the agent store")
	timeout := flag.Duration("timeout", 60*time.Second, "bound on the whole probe")
	flag.Parse()
	if err := run(*mode, *py, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "c10dprobe:", err)
		os.Exit(1)
	}
}

func run(mode string, py bool, timeout time.Duration) error {
	l, err := rendezvous.FromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	who := fmt.Sprintf("rank %d/%d", l.Rank, l.WorldSize)
	if mode == "c10d" || (mode == "auto" && l.AgentStore) {
		addr := net.JoinHostPort(l.MasterAddr, strconv.Itoa(l.MasterPort))
		c, err := rendezvous.DialC10d(ctx, addr)
		if err != nil {
			return err
		}
		st := rendezvous.WithPrefix(c, fmt.Sprintf("c10dprobe/attempt_%d", l.RestartCount))
		if err := exercise(ctx, st, l); err != nil {
			return fmt.Errorf("c10d client on %s: %w", addr, err)
		}
		if py {
			v, err := c.Get(ctx, fmt.Sprintf("py/%d", l.Rank))
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("from python %d", l.Rank); string(v) != want {
				return fmt.Errorf("py/%d: %q, want %q", l.Rank, v, want)
			}
			if err := c.Set(ctx, fmt.Sprintf("go/%d", l.Rank), []byte(fmt.Sprintf("from go %d", l.Rank))); err != nil {
				return err
			}
			fmt.Printf("c10dprobe: %s: read %q that Python's TCPStore set\n", who, v)
		}
		n, err := c.NumKeys(ctx)
		if err != nil {
			return err
		}
		if err := c.Close(); err != nil {
			return err
		}
		fmt.Printf(
			"c10dprobe: %s: c10d ok (agent store at %s, launcher %s, %d keys in the store)\n",
			who,
			addr,
			l.Launcher,
			n,
		)
	}
	if mode == "open" || mode == "auto" {
		s, err := rendezvous.Open(ctx, l)
		if err != nil {
			return err
		}
		if err := exercise(ctx, rendezvous.WithPrefix(s, "c10dprobe-open"), l); err != nil {
			s.Close()
			return fmt.Errorf("open (%s at %s): %w", s.Kind, s.Addr, err)
		}
		if err := s.Leave(ctx); err != nil {
			return err
		}
		fmt.Printf(
			"c10dprobe: %s: open ok (launcher %s, store %s at %s, hosting %v)\n",
			who,
			l.Launcher,
			s.Kind,
			s.Addr,
			s.Hosting(),
		)
	}
	return nil
}

// exercise runs the checks every rank does on st.
func exercise(ctx context.Context, st rendezvous.Store, l rendezvous.Launch) error {
	p := probe{ctx: ctx, st: st, me: l.Rank, world: l.WorldSize}
	for _, step := range []func() error{p.greet, p.electLeader, p.getAfterCancel, p.finish} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// probe is one rank's run of the checks on a store.
type probe struct {
	ctx       context.Context
	st        rendezvous.Store
	me, world int // this rank, and the number of ranks
}

// key is rank r's key under prefix.
func (p probe) key(prefix string, r int) string { return fmt.Sprintf("%s/%d", prefix, r) }

// all is every rank's key under prefix.
func (p probe) all(prefix string) []string {
	ks := make([]string, p.world)
	for r := range ks {
		ks[r] = p.key(prefix, r)
	}
	return ks
}

// greet counts the ranks, then announces this one; once every rank
// announced, it reads every rank's greeting and checks the count is final.
func (p probe) greet() error {
	ctx, st := p.ctx, p.st
	if _, err := st.Add(ctx, "count", 1); err != nil {
		return fmt.Errorf("add: %w", err)
	}
	if err := st.Set(ctx, p.key("rank", p.me), []byte(fmt.Sprintf("hello from %d", p.me))); err != nil {
		return fmt.Errorf("set: %w", err)
	}
	if err := st.Wait(ctx, p.all("rank")...); err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	for r := range p.world {
		v, err := st.Get(ctx, p.key("rank", r))
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if want := fmt.Sprintf("hello from %d", r); string(v) != want {
			return fmt.Errorf("get %s: %q, want %q", p.key("rank", r), v, want)
		}
	}
	v, err := st.Get(ctx, "count")
	if err != nil {
		return err
	}
	if string(v) != strconv.Itoa(p.world) {
		return fmt.Errorf("count %q, want %d", v, p.world)
	}
	return nil
}

// electLeader has every rank race to set the leader with a compare-set;
// all must agree on the winner.
func (p probe) electLeader() error {
	ctx, st := p.ctx, p.st
	won, err := st.CompareSet(ctx, "leader", nil, []byte(strconv.Itoa(p.me)))
	if err != nil {
		return fmt.Errorf("compare-set: %w", err)
	}
	if err := st.Set(ctx, p.key("seen", p.me), won); err != nil {
		return err
	}
	if err := st.Wait(ctx, p.all("seen")...); err != nil {
		return err
	}
	for r := range p.world {
		v, err := st.Get(ctx, p.key("seen", r))
		if err != nil {
			return err
		}
		if string(v) != string(won) {
			return fmt.Errorf("rank %d saw leader %q, this rank %q", r, v, won)
		}
	}
	return nil
}

// getAfterCancel checks that a Get whose ctx ends returns ctx.Err() and
// leaves the client usable: set, get and delete still work.
func (p probe) getAfterCancel() error {
	ctx, st, key := p.ctx, p.st, p.key("never", p.me)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := st.Get(short, key)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("get with a short deadline: %v, want %v", err, context.DeadlineExceeded)
	}
	if err := st.Set(ctx, key, []byte("now")); err != nil {
		return err
	}
	if v, err := st.Get(ctx, key); err != nil || string(v) != "now" {
		return fmt.Errorf("get after a cancelled get: %q, %v", v, err)
	}
	ok, err := st.Delete(ctx, key)
	if err != nil || !ok {
		return fmt.Errorf("delete: %v, %v", ok, err)
	}
	return nil
}

// finish waits until every rank is done reading before anyone moves on.
func (p probe) finish() error {
	if n, err := p.st.Add(p.ctx, "done", 1); err != nil {
		return err
	} else if n == int64(p.world) {
		if err := p.st.Set(p.ctx, "all-done", nil); err != nil {
			return err
		}
	}
	return p.st.Wait(p.ctx, "all-done")
}
