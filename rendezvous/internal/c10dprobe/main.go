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
	me, world := l.Rank, l.WorldSize
	key := func(p string, r int) string { return fmt.Sprintf("%s/%d", p, r) }
	all := func(p string) []string {
		ks := make([]string, world)
		for r := range ks {
			ks[r] = key(p, r)
		}
		return ks
	}
	// Count, then announce; once every rank announced, the count is final.
	if _, err := st.Add(ctx, "count", 1); err != nil {
		return fmt.Errorf("add: %w", err)
	}
	if err := st.Set(ctx, key("rank", me), []byte(fmt.Sprintf("hello from %d", me))); err != nil {
		return fmt.Errorf("set: %w", err)
	}
	if err := st.Wait(ctx, all("rank")...); err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	for r := range world {
		v, err := st.Get(ctx, key("rank", r))
		if err != nil {
			return fmt.Errorf("get: %w", err)
		}
		if want := fmt.Sprintf("hello from %d", r); string(v) != want {
			return fmt.Errorf("get %s: %q, want %q", key("rank", r), v, want)
		}
	}
	v, err := st.Get(ctx, "count")
	if err != nil {
		return err
	}
	if string(v) != strconv.Itoa(world) {
		return fmt.Errorf("count %q, want %d", v, world)
	}
	// Every rank races to set the leader; all must agree on the winner.
	won, err := st.CompareSet(ctx, "leader", nil, []byte(strconv.Itoa(me)))
	if err != nil {
		return fmt.Errorf("compare-set: %w", err)
	}
	if err := st.Set(ctx, key("seen", me), won); err != nil {
		return err
	}
	if err := st.Wait(ctx, all("seen")...); err != nil {
		return err
	}
	for r := range world {
		v, err := st.Get(ctx, key("seen", r))
		if err != nil {
			return err
		}
		if string(v) != string(won) {
			return fmt.Errorf("rank %d saw leader %q, this rank %q", r, v, won)
		}
	}
	// A Get whose ctx ends returns ctx.Err() and leaves the client usable.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = st.Get(short, key("never", me))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("get with a short deadline: %v, want %v", err, context.DeadlineExceeded)
	}
	if err := st.Set(ctx, key("never", me), []byte("now")); err != nil {
		return err
	}
	if v, err := st.Get(ctx, key("never", me)); err != nil || string(v) != "now" {
		return fmt.Errorf("get after a cancelled get: %q, %v", v, err)
	}
	ok, err := st.Delete(ctx, key("never", me))
	if err != nil || !ok {
		return fmt.Errorf("delete: %v, %v", ok, err)
	}
	// Everyone is done reading before anyone moves on.
	if n, err := st.Add(ctx, "done", 1); err != nil {
		return err
	} else if n == int64(world) {
		if err := st.Set(ctx, "all-done", nil); err != nil {
			return err
		}
	}
	return st.Wait(ctx, "all-done")
}
