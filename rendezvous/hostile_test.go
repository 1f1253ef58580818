package rendezvous

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

// hostileKinds are the misbehaviours of TestStoreHoldsUnderHostileConnections;
// connection i behaves as hostileKinds[i % len].
var hostileKinds = []string{
	"garbage", "huge length word", "half hello", "idle", "wrong token", "no token",
	"authenticated, huge length word", "authenticated, garbage", "authenticated, half frame", "authenticated, idle",
}

// hostile opens one connection and misbehaves as kind k; it returns once
// the server closed the connection or after hold, and says what happened.
func hostile(addr, token string, k int, rng *rand.Rand, hold time.Duration) string {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "dial failed"
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(hold))
	write := func(b []byte) bool { _, err := conn.Write(b); return err == nil }
	garbage := func() []byte {
		b := make([]byte, 1+rng.IntN(300))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	hello := func(tok string) []byte { return appendFrame(nil, 0, uint8(opHello), []byte(helloMagic), []byte(tok)) }
	outcome := ""
	authenticate := func() bool {
		if !write(hello(token)) {
			return false
		}
		f, err := readFrame(bufio.NewReader(conn))
		if err == nil && f.code == statusError && len(f.fields) == 2 && len(f.fields[0]) == 1 {
			outcome = fmt.Sprintf("refused (code %d)", f.fields[0][0])
		}
		if err == nil && f.code == statusOK {
			outcome = "authenticated, "
			return true
		}
		return false
	}
	switch hostileKinds[k] {
	case "garbage":
		write(garbage())
	case "huge length word":
		word := []uint32{0xffffffff, MaxFrameLen, 32 << 20}[rng.IntN(3)]
		write(binary.BigEndian.AppendUint32(nil, word))
	case "half hello":
		h := hello(token)
		write(h[:4+rng.IntN(len(h)-5)])
	case "idle":
	case "wrong token":
		write(hello("not-" + token))
	case "no token":
		write(hello(""))
	case "authenticated, huge length word":
		if authenticate() {
			write(binary.BigEndian.AppendUint32(nil, MaxFrameLen))
			write(make([]byte, 8<<10))
		}
	case "authenticated, garbage":
		if authenticate() {
			write(garbage())
		}
	case "authenticated, half frame":
		if authenticate() {
			f := appendFrame(nil, 1, uint8(opSet), []byte("hostile"), make([]byte, 2000))
			write(f[:len(f)/2])
		}
	case "authenticated, idle":
		authenticate()
	}
	start := time.Now()
	br := bufio.NewReader(conn)
	for { // until the server closes the connection, or hold passes
		f, err := readFrame(br)
		if err == nil && f.code == statusError && len(f.fields) == 2 && len(f.fields[0]) == 1 {
			outcome = fmt.Sprintf("refused (code %d)", f.fields[0][0])
			continue
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return "held open until the end"
			}
			if outcome == "" || outcome == "authenticated, " {
				outcome += fmt.Sprintf("closed by the server after %.1fs", time.Since(start).Seconds())
			}
			return outcome
		}
	}
}

// heapWatch samples the heap in use until stopped and keeps the maximum.
type heapWatch struct {
	max  atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func watchHeap(every time.Duration) *heapWatch {
	w := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > w.max.Load() {
				w.max.Store(ms.HeapInuse)
			}
			select {
			case <-w.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	return w
}

func (w *heapWatch) Stop() uint64 {
	close(w.stop)
	<-w.done
	return w.max.Load()
}

func heapAfterGC() (inuse, alloc uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.HeapAlloc
}

// The acceptance test of the store's limits (issue 12 item 7): 1,000
// hostile connections, in every misbehaviour hostileKinds lists, arrive
// while honest clients work. The heap stays under 64 MiB during and after,
// every honest answer is right, and the store serves normally afterwards.
// The old server (no deadlines, buffers allocated at the announced length)
// grew to gigabytes on the "huge length word" connections alone.
func TestStoreHoldsUnderHostileConnections(t *testing.T) {
	const (
		token    = "job-7f3a-secret"
		hostiles = 1000
		waves    = 10 // the connections come in waves, 50ms apart
		heapCap  = 64 << 20
		honest   = 4
	)
	start := time.Now()
	base, _ := heapAfterGC()
	srv := serve(
		t,
		WithToken(token),
		WithHandshakeTimeout(500*time.Millisecond),
		WithIdleTimeout(2*time.Second),
		WithFrameTimeout(2*time.Second),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 18*time.Second)
	defer cancel()
	clients := make([]*Client, honest)
	for i := range clients {
		c, err := Dial(ctx, srv.Addr(), WithDialToken(token))
		require.NoError(t, err)
		defer c.Close()
		clients[i] = c
	}
	watch := watchHeap(5 * time.Millisecond)

	// The flood.
	attack := make(chan struct{})
	var flood sync.WaitGroup
	var omu sync.Mutex
	outcomes := map[string]int{}
	go func() {
		for i := range hostiles {
			if i%(hostiles/waves) == 0 {
				time.Sleep(50 * time.Millisecond)
			}
			flood.Add(1)
			go func() {
				defer flood.Done()
				o := hostile(
					srv.Addr(),
					token,
					i%len(hostileKinds),
					rand.New(rand.NewPCG(uint64(i), 99)),
					4*time.Second,
				)
				omu.Lock()
				outcomes[o]++
				omu.Unlock()
			}()
		}
		flood.Wait()
		close(attack)
	}()

	// Honest work during the flood: every answer checked.
	var adds atomic.Int64
	var g errgroup.Group
	for i, c := range clients {
		g.Go(func() error {
			for round := 0; ; round++ {
				select {
				case <-attack:
					if round > 0 {
						return nil
					}
				default:
				}
				k := fmt.Sprintf("honest/%d/%d", i, round)
				want := fmt.Sprintf("value %d %d", i, round)
				if err := c.Set(ctx, k, []byte(want)); err != nil {
					return err
				}
				v, err := c.Get(ctx, k)
				if err != nil {
					return err
				}
				if string(v) != want {
					return fmt.Errorf("get %s: %q, want %q", k, v, want)
				}
				if _, err := c.Add(ctx, "honest/adds", 1); err != nil {
					return err
				}
				adds.Add(1)
				if err := c.Wait(ctx, k); err != nil {
					return err
				}
			}
		})
	}
	// New honest clients get in during the flood (Dial retries while the
	// server refuses connections over its caps).
	for i := range honest {
		g.Go(func() error {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			c, err := Dial(ctx, srv.Addr(), WithDialToken(token), WithRetryInterval(50*time.Millisecond))
			if err != nil {
				return fmt.Errorf("honest dial during the flood: %w", err)
			}
			defer c.Close()
			if err := c.Set(ctx, fmt.Sprintf("late/%d", i), []byte("ok")); err != nil {
				return err
			}
			_, err = c.Get(ctx, fmt.Sprintf("late/%d", (i+1)%honest))
			return err
		})
	}
	require.NoError(t, g.Wait())
	<-attack
	during := watch.Stop()
	st := srv.stats()
	t.Logf(
		"flood of %d hostile connections over in %v; %d honest adds meanwhile; "+
			"server then held %d connections (%d in handshake), %d bytes reserved, %d held",
		hostiles,
		time.Since(start).Round(time.Millisecond),
		adds.Load(),
		st.conns,
		st.handshaking,
		st.reserved,
		st.held,
	)

	t.Logf(
		"what the hostile connections saw (codes: %d protocol, %d token, %d busy, %d too large): %v",
		codeProtocol,
		codeAuth,
		codeBusy,
		codeTooLarge,
		outcomes,
	)
	require.Zero(t, outcomes["held open until the end"], "connections the server never closed")
	require.Zero(t, outcomes["dial failed"])
	authed := 0
	for o, n := range outcomes {
		if strings.HasPrefix(o, "authenticated") {
			authed += n
		}
	}
	require.Greater(t, authed, 100, "the flood must reach the authenticated state too")

	// Afterwards: the hostile connections are gone, the budget is back, and
	// the store answers correctly (a large value included).
	waitFor(
		t,
		"hostile connections closed",
		func() bool { st := srv.stats(); return st.conns == honest && st.reserved == 0 && st.held == 0 },
	)
	c := clients[0]
	v, err := c.Get(ctx, "honest/adds")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprint(adds.Load()), string(v))
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i)
	}
	require.NoError(t, c.Set(ctx, "big", big))
	got, err := clients[1].Get(ctx, "big")
	require.NoError(t, err)
	require.Equal(t, big, got)
	ok, err := c.Delete(ctx, "hostile")
	require.NoError(t, err)
	require.False(t, ok, "a hostile half frame must not have been applied")
	after, afterAlloc := heapAfterGC()
	t.Logf("heap in use: %.1f MiB before, at most %.1f MiB during, %.1f MiB after (HeapAlloc %.1f MiB) in %v",
		mib(base), mib(during), mib(after), mib(afterAlloc), time.Since(start).Round(time.Millisecond))
	require.Less(t, during, uint64(heapCap), "heap during the flood")
	require.Less(t, after, uint64(heapCap), "heap after the flood")
	require.Less(t, time.Since(start), 20*time.Second)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
