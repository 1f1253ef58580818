package hier

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/fairgo/fairgo"
)

// Every IPv4 address and port survives the gather buffer's packing, as a
// positive int64 (the collective takes the maximum over the ranks' words,
// the others' zeros).
func TestRelayAddressPacking(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var b [4]byte
		for i := range b {
			b[i] = byte(rapid.IntRange(0, 255).Draw(rt, "byte"))
		}
		ap := netip.AddrPortFrom(netip.AddrFrom4(b), uint16(rapid.IntRange(1, 65535).Draw(rt, "port")))
		v := packAddr(ap)
		require.Positive(rt, v)
		require.Less(rt, v, int64(1)<<48)
		require.Equal(rt, ap, unpackAddr(v))
	})
}

// The relay's address: the option's, else the interface NCCL_SOCKET_IFNAME
// names (prefix or exact), else none where it names none here.
func TestRelayHost(t *testing.T) {
	require.Equal(t, "10.1.2.3", relayHost("10.1.2.3"))
	for _, tc := range []struct{ spec, want string }{
		{"lo", "127.0.0.1"},
		{"=lo", "127.0.0.1"},
		{"l", "127.0.0.1"},
		{"=l", ""},
		{"no-such-interface", ""},
		{"no-such-interface,lo", "127.0.0.1"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			t.Setenv("NCCL_SOCKET_IFNAME", tc.spec)
			require.Equal(t, tc.want, relayHost(""))
		})
	}
	// Exclusions: the first interface up, not a loopback and not excluded.
	first := relayHost("")
	t.Run("^lo", func(t *testing.T) {
		t.Setenv("NCCL_SOCKET_IFNAME", "^lo")
		require.Equal(t, first, relayHost(""))
	})
	if first == "" {
		t.Log("no interface here but the loopback: the exclusion of the first one is not tested")
		return
	}
	ifs, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range ifs {
		if ipv4Of(ifc) == first {
			t.Run("^="+ifc.Name, func(t *testing.T) {
				t.Setenv("NCCL_SOCKET_IFNAME", "^="+ifc.Name)
				require.NotEqual(t, first, relayHost(""), "the excluded interface's address")
			})
		}
	}
}

func TestCheckHostMustBeIPv4(t *testing.T) {
	for _, host := range []string{"::1", "localhost", "10.0.0", "10.0.0.1:80"} {
		err := ValidateOptions(WithCheckHost(host))
		var ae *fairgo.ArgError
		require.ErrorAs(t, err, &ae, host)
		require.Equal(t, "WithCheckHost", ae.Arg)
	}
	require.NoError(t, ValidateOptions(WithCheckHost("10.0.0.1")))
}

// A peer's address that reaches a process other than its relay (an
// interface that exists on every host, a port reused) fails the start,
// which makes every rank keep the collective check, instead of leaving
// the peer without this rank's images.
func TestRelayStartNeedsThePeersAcknowledgement(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(c net.Conn)
	}{
		{"closed at once", func(c net.Conn) { _ = c.Close() }},
		{"a wrong answer", func(c net.Conn) {
			_, _ = c.Write(make([]byte, 8))
			_, _ = io.Copy(io.Discard, c)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := serveTCP(t, tc.serve)
			rl, err := newRelay("127.0.0.1", 0, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			defer func() { require.NoError(t, rl.close()) }()
			words := make([]uint64, hostWords(2))
			start := time.Now()
			err = rl.start(words, 2, 7, map[int]int64{1: other})
			require.ErrorContains(t, err, "rank 1")
			require.Less(t, time.Since(start), relayDial/2, "a refusal is not a timeout")
		})
	}
}

// serveTCP listens on loopback until the test ends, serving each
// connection on a goroutine of its own, and returns the address packed.
func serveTCP(t *testing.T, serve func(c net.Conn)) int64 {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return packAddr(netip.MustParseAddrPort(ln.Addr().String()))
}

// A Reducer that closes while its relay starts abandons the start: a
// peer that accepted the connection and never acknowledges its hello (it
// has not started, or is not a relay), or one not dialled yet, holds the
// start no longer, and the start fails as with a peer out of reach.
func TestRelayAbandonEndsTheStart(t *testing.T) {
	silent := serveTCP(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }) // holds the connection open, says nothing
	peer := map[int]int64{1: silent}
	for _, tc := range []struct {
		name  string
		early bool // abandoned before the start
	}{{"while it waits", false}, {"before it", true}} {
		early := tc.early
		t.Run(tc.name, func(t *testing.T) {
			rl, err := newRelay("127.0.0.1", 0, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			if early {
				rl.abandon()
			}
			started := make(chan error, 1)
			start := time.Now()
			go func() { started <- rl.start(make([]uint64, hostWords(2)), 2, 7, peer) }()
			if !early {
				select {
				case err := <-started:
					t.Fatalf("the start ended before the peer answered: %v", err)
				case <-time.After(100 * time.Millisecond):
				}
				rl.abandon()
			}
			select {
			case err := <-started:
				require.ErrorContains(t, err, "rank 1")
			case <-time.After(relayDial / 2):
				t.Fatal("abandon did not end the start")
			}
			require.Less(t, time.Since(start), relayDial/2)
			rl.abandon() // again: nothing
			require.NoError(t, rl.close())
		})
	}
}

// relayPair is two started relays on loopback, world ranks 0 and 1 of a
// job of two machines, each with a region of its own; post writes rank
// 0's image of a call and notes it posted, arrived reports whether rank
// 1's region holds it.
func relayPair(t *testing.T) (a *relay, post func(seq uint64), arrived func(seq uint64) bool) {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	a, err := newRelay("127.0.0.1", 0, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.close()) })
	b, err := newRelay("127.0.0.1", 1, logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.close()) })
	wa, wb := make([]uint64, hostWords(2)), make([]uint64, hostWords(2))
	errs := make(chan error, 2)
	go func() { errs <- a.start(wa, 2, 7, map[int]int64{1: b.addr}) }()
	go func() { errs <- b.start(wb, 2, 7, map[int]int64{0: a.addr}) }()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	a.startSending(hostFirstCall)
	post = func(seq uint64) {
		s := (&hostCheck{words: wa}).slot(0, seq)
		s[1] = seq * 3
		atomic.StoreUint64(&s[0], seq)
		a.notePosted(seq)
	}
	arrived = func(seq uint64) bool {
		s := (&hostCheck{words: wb}).slot(0, seq)
		return atomic.LoadUint64(&s[0]) == seq && atomic.LoadUint64(&s[1]) == seq*3
	}
	return a, post, arrived
}

// A Wait's flush sends what was posted, unless another flush is under
// way (the watcher's, which turns to the call and sends it then): it never
// blocks the Wait behind the other's writes.
func TestRelayTryFlushSendsOrSkips(t *testing.T) {
	a, post, arrived := relayPair(t)
	post(hostFirstCall)
	a.flushMu.Lock() // another flush under way
	done := make(chan struct{})
	go func() { a.tryFlush(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("tryFlush waited for the other flush")
	}
	a.flushMu.Unlock()
	time.Sleep(20 * time.Millisecond)
	require.False(t, arrived(hostFirstCall), "a skipped flush sent the image")

	a.tryFlush()
	require.Eventually(t, func() bool { return arrived(hostFirstCall) }, 5*time.Second, time.Millisecond)
	post(hostFirstCall + 1)
	a.tryFlush()
	require.Eventually(t, func() bool { return arrived(hostFirstCall + 1) }, 5*time.Second, time.Millisecond)
}

// A Wait sends the images posted so far while its call runs, with no
// watcher and no help: one call at a time, the peers need not wait for
// the watcher's next wake-up.
func TestWaitSendsThePostedImages(t *testing.T) {
	a, post, arrived := relayPair(t)
	r := &Reducer{}
	r.relay.Store(a)
	w := &Work{}
	w.r = r // not helpable: the Wait only looks, and flushes
	post(hostFirstCall)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		for !arrived(hostFirstCall) && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		w.finish(nil)
	}()
	require.NoError(t, w.Wait(ctx), "the image never left")
	require.True(t, arrived(hostFirstCall))
}

// relayStar is m started relays on loopback, world ranks 0 to m−1 of a
// job of m machines of one rank (a star from relayMeshMachines + 1
// machines on: rank 0 the hub), each with a region of its own; post
// writes rank g's image of a call and flushes it, arrived reports whether
// rank g's region holds origin o's image of the call.
func relayStar(t *testing.T, m int) (rls []*relay, post func(g int, seq uint64), arrived func(g, o int, seq uint64) bool) {
	t.Helper()
	logger := slog.New(slog.DiscardHandler)
	words := make([][]uint64, m)
	for g := range m {
		rl, err := newRelay("127.0.0.1", g, logger)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, rl.close()) })
		rls = append(rls, rl)
		words[g] = make([]uint64, hostWords(m))
	}
	errs := make(chan error, m)
	for g, rl := range rls {
		peers := map[int]int64{}
		for o, other := range rls {
			if o != g {
				peers[o] = other.addr
			}
		}
		go func() { errs <- rl.start(words[g], m, 7, peers) }()
	}
	for range m {
		require.NoError(t, <-errs)
	}
	for _, rl := range rls {
		rl.startSending(hostFirstCall)
	}
	post = func(g int, seq uint64) {
		s := (&hostCheck{words: words[g]}).slot(g, seq)
		s[1] = seq*3 + uint64(g)
		atomic.StoreUint64(&s[0], seq)
		rls[g].notePosted(seq)
		rls[g].flush(false)
	}
	arrived = func(g, o int, seq uint64) bool {
		s := (&hostCheck{words: words[g]}).slot(o, seq)
		return atomic.LoadUint64(&s[0]) == seq && atomic.LoadUint64(&s[1]) == seq*3+uint64(o)
	}
	return rls, post, arrived
}

// From relayMeshMachines + 1 machines on, every rank of a rail sends its
// images to the rail's hub only and hears the whole rail's from it: every
// region gets every rank's image of every call, in whatever order the
// ranks post, and each rank's last cursor; the hub sends the rest of the
// rail one message a call that every rank has posted.
func TestRelayStarBringsEveryImage(t *testing.T) {
	const m = relayMeshMachines + 2
	rls, post, arrived := relayStar(t, m)
	for _, rl := range rls {
		require.Equal(t, 0, rl.hub)
	}
	for _, rl := range rls[1:] {
		require.Len(t, rl.out, 1, "rank %d dials its hub only", rl.rank)
	}
	require.Len(t, rls[0].out, m-1)
	rng := rand.New(rand.NewPCG(1, 2))
	const calls = 3 * hostSlots
	for k := range uint64(calls) {
		seq := hostFirstCall + k
		for _, g := range rng.Perm(m) {
			post(g, seq)
		}
		require.Eventually(t, func() bool {
			for g := range m {
				for o := range m {
					if !arrived(g, o, seq) {
						return false
					}
				}
			}
			return true
		}, 5*time.Second, time.Millisecond, "call %d", seq)
		for g, rl := range rls { // the call decided: the cursor moves
			atomic.StoreUint64((&hostCheck{words: rl.words}).cursor(g), seq)
		}
	}
	for _, rl := range rls[1:] {
		rl.flush(true)
	}
	rls[0].flush(true)
	require.Eventually(t, func() bool {
		for _, rl := range rls {
			for o := range m {
				if atomic.LoadUint64((&hostCheck{words: rl.words}).cursor(o)) != hostFirstCall+calls-1 {
					return false
				}
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the last cursors")
}

// Calls nobody posts (those a fingerprint checks past the mesh) move only
// the cursors: the hub forwards them once the rail's lowest has moved
// relayCursorEvery calls, not at each rank's message, so a rank wakes
// once in relayCursorEvery calls whatever the rail's size; every region
// still learns every cursor within the lag reusable allows, and exactly
// once the ranks close.
func TestRelayStarForwardsCursorsOnceTheLowestMoves(t *testing.T) {
	const m = relayMeshMachines + 3
	rls, _, _ := relayStar(t, m)
	cursorOf := func(g, o int) uint64 {
		return atomic.LoadUint64((&hostCheck{words: rls[g].words}).cursor(o))
	}
	const calls = 4 * hostSlots
	last := uint64(hostFirstCall + calls - 1)
	for k := range uint64(calls) {
		seq := hostFirstCall + k
		for _, g := range rand.New(rand.NewPCG(k, 3)).Perm(m) {
			atomic.StoreUint64((&hostCheck{words: rls[g].words}).cursor(g), seq)
			rls[g].flush(false)
		}
	}
	require.Eventually(t, func() bool {
		for g := range m {
			for o := range m {
				if cursorOf(g, o)+2*relayCursorEvery+1 < last {
					return false
				}
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "every cursor within reusable's lag")
	hub := rls[0]
	hub.fwdMu.Lock()
	sends := hub.fwd.sends
	hub.fwdMu.Unlock()
	require.LessOrEqual(t, sends, calls/relayCursorEvery+1, "the hub forwards once the lowest cursor moved")
	require.Positive(t, sends)

	for _, rl := range rls[1:] {
		rl.flush(true)
	}
	hub.flush(true)
	require.Eventually(t, func() bool {
		for g := range m {
			for o := range m {
				if cursorOf(g, o) != last {
					return false
				}
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "the closing ranks' cursors, exact")
}
