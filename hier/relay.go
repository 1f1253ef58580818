package hier

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The relay: the check through shared memory across machines, up to
// relayMaxMachines of them. Each machine's ranks share a region as on one
// machine (hostcheck.go), with a section for every rank of the world: a
// rank writes its own, and its relay writes those of its rail peers (the
// ranks of its local index on the other machines), which it hears from
// over TCP. Each rank's watcher sends the rank's posted images, with its
// cursor, to its rail peers as it turns to each call (flush), and a Wait
// does as it looks at its call (tryFlush); so every region holds every
// rank's image of a call once the call's posts have crossed, and the
// watcher decides the call from the region alone, as on one machine. A
// call costs its caller a post, and no device work; the images travel
// beside the data and are almost always in before it has completed (a
// rank posts before it enqueues, and a TCP message of a few hundred bytes
// is faster than a collective across machines).
//
// Cursors cross only as lower bounds: a rank's cursor in a peer's region
// is the last value it sent, which every message carries. A rank that
// waits to post call n for a peer's cursor (hostCheck.reusable) needs it
// at n − hostSlots; it gets it: when the peer's watcher turns to call
// j, the peer has decided every call before j, and it sends its cursor
// if it moved relayCursorEvery calls since the last it sent, so the last
// sent is at most relayCursorEvery + 1 behind the last call the peer
// turned to, and hostSlots is larger than that.
//
// The ranks learn each other's addresses, and each machine its region's
// token, in the collective check of call hostTokenCall (hostAgreement):
// every rank writes its own words of a gather buffer that the check's
// communicator reduces by maximum. A rank with no address (no IPv4
// interface, a listener that failed), a region it could not map or a peer
// it could not reach makes every rank go on checking through the
// collective (or the fingerprints), as on one machine.
//
// A peer's connection that ends or fails while the job runs is not an
// error of its own: a peer that closed its Reducer has decided its calls,
// and one that died leaves its peers' calls without its image, which the
// data misses too (the watchdog's timeout, or NCCL's error).

const (
	// relayMaxMachines is the most machines a job checks its calls across
	// through the relay; larger jobs check through the collective and the
	// fingerprints. A message heard is a thread woken: in the mesh a rank
	// hears from each of its machines − 1 rail peers every call, which on
	// a busy host delayed the calls more than a fingerprint's copies cost
	// past four machines (BENCHMARKS.md, "The relay's reach"); in the star
	// a rank hears once a call, but its hub writes machines − 1 messages a
	// call, measured up to 16 machines (BENCHMARKS.md, "The check chosen
	// by route").
	relayMaxMachines = 32
	// relayMeshMachines is the most machines whose rail peers each send
	// every call's images to every other (the mesh); from one more on, the
	// rail's lowest rank relays for the others (the star: relay.hub).
	relayMeshMachines = 4
	relayMagic        = 0x6661697267 // "fairg": the hello's first word
	// relayCursorEvery is how far a rank's cursor moves before its relay
	// sends it without an image.
	relayCursorEvery = hostSlots / 4
	// relayDial bounds the dials of the peers with their
	// acknowledgements, and the wait for a peer's hello.
	relayDial = 10 * time.Second
	// relayHelloWords is a connection's first message: the magic, the
	// job's token, the sender's world rank, the receiver's.
	relayHelloWords = 4
	// relayHeaderWords start every later message: how many slots follow
	// (relayFinal set in the last message of a rank that closes), and the
	// sender's cursor.
	relayHeaderWords = 2
	// relayFinal marks a closing rank's last message in its first word,
	// above any count of slots: the hub forwards its cursor at once.
	relayFinal = 1 << 32
	// relayHubHeaderWords start every message of a hub: how many slots
	// follow, each after its origin's world rank, and before them how
	// many cursors, each after its origin's world rank.
	relayHubHeaderWords = 2
	// gatherWords are a rank's words in the gather buffer of call
	// hostTokenCall: its relay's address, its region's token (a machine's
	// local rank 0 only), its place in the grid.
	gatherWords = 3
)

// relay is one rank's connections to its rail peers.
type relay struct {
	ln     net.Listener
	addr   int64 // the listener's address as packAddr packs it
	rank   int   // world rank
	logger *slog.Logger

	ready     chan struct{} // closed by start, or close
	once      sync.Once     // closes ready
	closeOnce sync.Once     // close runs once
	words     []uint64      // the region, from start on; nil: receive nothing
	size      int           // world size
	token     uint64        // the job's token, which hellos carry
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     []net.Conn // every connection, closed by close
	out       []net.Conn // dialled, one per rail peer: what flush writes to
	closing   bool
	// dials ends start's dials and hellos once abandon cancels it.
	dials       context.Context
	abandonDial context.CancelFunc

	// hub is the world rank that relays for this rank's rail from
	// relayMeshMachines + 1 machines on (the star): every other rank of
	// the rail sends its images to the hub only, and hears the whole
	// rail's from it, batched by call; -1 in the mesh, where every rank
	// sends to every rail peer. A rank wakes for one message a call
	// instead of one from each of machines − 1 peers (the mesh's wake-ups
	// are what lost to the fingerprints from 8 machines on).
	hub   int
	rail  []int // the rail's world ranks, this rank's included, lowest first
	fwdMu sync.Mutex
	fwd   hubState // the hub's forwarding; fwdMu's

	// The sending side (flush): posted is the last call this rank
	// posted; the rest is flushMu's.
	posted     atomic.Uint64
	flushMu    sync.Mutex
	sending    bool   // the posts are sent (startSending)
	sent       uint64 // the last call sent
	sentCursor uint64 // the last cursor sent
	msg        []byte

	held *atomic.Bool // a test's: while set, a message received waits before it is read in (testHooks.relayHeld)
}

// hubState is what a hub has heard of each rank of its rail and
// forwarded to the others, by world rank.
type hubState struct {
	heard  map[int]uint64 // the last call whose images reached the hub (its own: posted)
	sent   map[int]uint64 // the last call forwarded
	cursor map[int]uint64 // the last cursor forwarded
	done   uint64         // the last call every rank of the rail had reached the hub with, when forwarded
	lowest uint64         // the rail's lowest cursor when last forwarded
	sends  int            // messages forwarded, for the tests of how often the rail wakes
	msg    []byte
}

// newRelay listens on host (an IPv4 address) for the rank's rail peers.
func newRelay(host string, rank int, logger *slog.Logger) (*relay, error) {
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Is4() {
		return nil, fmt.Errorf("hier: the check's relay: %q is no IPv4 address", host)
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return nil, fmt.Errorf("hier: the check's relay: %w", err)
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("hier: the check's relay: %w", err), ln.Close())
	}
	rl := &relay{ln: ln, addr: packAddr(ap), rank: rank, logger: logger,
		ready: make(chan struct{})}
	rl.dials, rl.abandonDial = context.WithCancel(context.Background())
	rl.wg.Add(1)
	go rl.accept()
	return rl, nil
}

// packAddr packs an IPv4 address and port into 48 bits of a positive
// int64 (0 is no address).
func packAddr(ap netip.AddrPort) int64 {
	b := ap.Addr().As4()
	return int64(binary.BigEndian.Uint32(b[:]))<<16 | int64(ap.Port())
}

func unpackAddr(v int64) netip.AddrPort {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(v>>16))
	return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(v))
}

// start gives the relay the region it writes its peers' sections in, and
// dials each of peers (world rank → packed address) at once with a hello,
// which the peer acknowledges once it has checked it: an address that
// reaches another process (an interface of the wrong network that exists
// on every host) fails here, not in the calls. The checker's goroutine
// calls it when it learns call hostTokenCall's verdict; it takes relayDial
// at most. An error means some peer is out of reach: the agreement fails.
func (rl *relay) start(words []uint64, size int, token uint64, peers map[int]int64) error {
	rl.words, rl.size, rl.token = words, size, token
	rl.rail = append([]int{rl.rank}, slices.Collect(maps.Keys(peers))...)
	slices.Sort(rl.rail)
	rl.hub = -1
	if len(rl.rail) > relayMeshMachines {
		rl.hub = rl.rail[0]
		rl.fwd = hubState{heard: map[int]uint64{}, sent: map[int]uint64{}, cursor: map[int]uint64{}}
	}
	rl.once.Do(func() { close(rl.ready) })
	deadline := time.Now().Add(relayDial)
	errs := make(chan error, len(peers))
	dials := 0
	for peer, addr := range peers {
		if rl.hub >= 0 && rl.rank != rl.hub && peer != rl.hub {
			continue // a star's rank sends to its hub only
		}
		dials++
		go func() { errs <- rl.dial(peer, addr, deadline) }()
	}
	var err error
	for range dials {
		err = errors.Join(err, <-errs)
	}
	return err
}

// dial connects to peer at addr and says hello, by deadline.
func (rl *relay) dial(peer int, addr int64, deadline time.Time) error {
	fail := func(err error) error { return fmt.Errorf("hier: the check's relay: rank %d: %w", peer, err) }
	if addr <= 0 {
		return fail(errors.New("no address"))
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(rl.dials, "tcp4", unpackAddr(addr).String())
	if err != nil {
		return fail(err)
	}
	if !rl.track(c) {
		return fail(net.ErrClosed)
	}
	hello := make([]byte, 8*relayHelloWords)
	for i, v := range []uint64{relayMagic, rl.token, uint64(rl.rank), uint64(peer)} {
		binary.LittleEndian.PutUint64(hello[8*i:], v)
	}
	_ = c.SetDeadline(deadline)
	// abandon ends the hello's write and the acknowledgement's read too
	// (after the deadline above, which would otherwise undo it).
	stop := context.AfterFunc(rl.dials, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.Write(hello); err != nil {
		return fail(err)
	}
	if _, err := io.ReadFull(c, hello[:8]); err != nil {
		return fail(fmt.Errorf("no acknowledgement: %w", err))
	}
	if binary.LittleEndian.Uint64(hello) != relayMagic {
		return fail(errors.New("a wrong acknowledgement"))
	}
	if !stop() {
		return fail(context.Cause(rl.dials))
	}
	_ = c.SetDeadline(time.Time{})
	rl.mu.Lock()
	rl.out = append(rl.out, c)
	rl.mu.Unlock()
	return nil
}

// track keeps c for close, unless the relay is closing (c is closed then).
func (rl *relay) track(c net.Conn) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.closing {
		_ = c.Close()
		return false
	}
	rl.conns = append(rl.conns, c)
	return true
}

// accept takes the peers' connections until the listener closes.
func (rl *relay) accept() {
	defer rl.wg.Done()
	for {
		c, err := rl.ln.Accept()
		if err != nil {
			return
		}
		if !rl.track(c) {
			return
		}
		rl.wg.Add(1)
		go rl.receive(c)
	}
}

// receive reads one peer's messages into its section of the region: each
// slot's words first, its call number last (what publishes it), then the
// peer's cursor. Only the peer's relay writes its section here.
func (rl *relay) receive(c net.Conn) {
	defer rl.wg.Done()
	<-rl.ready
	if rl.words == nil {
		return
	}
	r := bufio.NewReader(c)
	buf := make([]byte, 8*max(relayHelloWords, relayHeaderWords, hostSlots*hostSlotWords))
	_ = c.SetDeadline(time.Now().Add(relayDial))
	if _, err := io.ReadFull(r, buf[:8*relayHelloWords]); err != nil {
		rl.logger.Debug("fairgo: the check's relay: a hello", "rank", rl.rank, "err", err)
		return
	}
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(buf[8*i:]) }
	from := int(word(2))
	if word(0) != relayMagic || word(1) != rl.token || word(3) != uint64(rl.rank) ||
		from < 0 || from >= rl.size || from == rl.rank {
		rl.logger.Debug("fairgo: the check's relay: a hello of another job or rank", "rank", rl.rank)
		return
	}
	_ = c.SetDeadline(time.Now().Add(relayDial))
	if _, err := c.Write(buf[:8]); err != nil { // the acknowledgement: the hello's magic
		return
	}
	_ = c.SetDeadline(time.Time{})
	switch {
	case rl.hub < 0 || rl.rank == rl.hub:
		rl.receiveFrom(from, r, buf)
	case from == rl.hub:
		rl.receiveForwarded(r)
	default:
		rl.logger.Debug("fairgo: the check's relay: a star's rank heard from a rank not its hub", "rank", rl.rank, "from", from)
	}
}

// receiveFrom reads peer from's messages (its own images, and its
// cursor) into its section of the region; a hub forwards them to the
// rest of its rail after each.
func (rl *relay) receiveFrom(from int, r *bufio.Reader, buf []byte) {
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(buf[8*i:]) }
	h := hostCheck{words: rl.words}
	for {
		if _, err := io.ReadFull(r, buf[:8*relayHeaderWords]); err != nil {
			return // the peer closed, or died: see above
		}
		n, cursor, final := int(word(0)&^relayFinal), word(1), word(0)&relayFinal != 0
		if n > hostSlots {
			rl.logger.Debug("fairgo: the check's relay: a message of too many slots", "rank", rl.rank, "from", from)
			return
		}
		if _, err := io.ReadFull(r, buf[:8*n*hostSlotWords]); err != nil {
			return
		}
		rl.waitHeld()
		var last uint64
		for i := range n {
			at := i * hostSlotWords
			seq := word(at)
			s := h.slot(from, seq)
			for w := 1; w < hostSlotWords; w++ {
				atomic.StoreUint64(&s[w], word(at+w))
			}
			atomic.StoreUint64(&s[0], seq)
			last = max(last, seq)
		}
		if c := h.cursor(from); cursor > atomic.LoadUint64(c) {
			atomic.StoreUint64(c, cursor)
		}
		if rl.hub == rl.rank {
			// A message of a cursor alone comes every relayCursorEvery
			// calls, from every rank of the rail at about the same call:
			// the rail hears the cursors once the lowest has moved
			// (forward), or at once from a rank that closes.
			rl.forward(from, last, final)
		}
	}
}

// waitHeld waits while a test holds the messages received.
func (rl *relay) waitHeld() {
	for rl.held != nil && rl.held.Load() {
		time.Sleep(time.Millisecond)
	}
}

// receiveForwarded reads a star's hub's messages into the sections of
// their origins (never this rank's own): the cursors, then the slots,
// each after its origin.
func (rl *relay) receiveForwarded(r *bufio.Reader) {
	h := hostCheck{words: rl.words}
	hdr := make([]byte, 8*relayHubHeaderWords)
	var body []byte
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return // the hub closed, or died
		}
		n, m := binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:])
		if m > uint64(len(rl.rail)) || n > uint64(len(rl.rail)*hostSlots) {
			rl.logger.Debug("fairgo: the check's relay: a hub's message too large", "rank", rl.rank)
			return
		}
		size := 16*int(m) + 8*int(n)*(1+hostSlotWords)
		if cap(body) < size {
			body = make([]byte, size)
		}
		body = body[:size]
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		rl.waitHeld()
		word := func(i int) uint64 { return binary.LittleEndian.Uint64(body[8*i:]) }
		valid := func(origin uint64) bool { return origin < uint64(rl.size) && int(origin) != rl.rank }
		for i := range int(m) {
			origin, cursor := word(2*i), word(2*i+1)
			if !valid(origin) {
				continue
			}
			if c := h.cursor(int(origin)); cursor > atomic.LoadUint64(c) {
				atomic.StoreUint64(c, cursor)
			}
		}
		for i := range int(n) {
			at := 2*int(m) + i*(1+hostSlotWords)
			origin, seq := word(at), word(at+1)
			if !valid(origin) {
				continue
			}
			s := h.slot(int(origin), seq)
			for w := 1; w < hostSlotWords; w++ {
				atomic.StoreUint64(&s[w], word(at+1+w))
			}
			atomic.StoreUint64(&s[0], seq)
		}
	}
}

// forward is a hub's: origin's images reached it up to call last (0:
// none, a cursor alone); it sends the rail's images it has not sent yet,
// with every rank's cursor, to the rest of the rail, in one message, once
// every rank of the rail has reached it with a call it had not forwarded,
// or the rail's lowest cursor moved relayCursorEvery calls since the last
// it forwarded (when final, once any cursor moved at all). A rank then
// wakes for about one message a posted call, and one every
// relayCursorEvery calls that nobody posts (calls a fingerprint checks:
// checksByRoute), where a forward at each rank's cursor would wake the
// rail machines − 1 times as often. Holes (a call a rank did not post)
// are skipped, as flush does.
//
// A cursor forwarded lags the rank's by at most 2·relayCursorEvery + 1
// calls (its sender's lag, then the lowest's), fewer than hostSlots: a
// rank waiting to reuse a slot (hostCheck.reusable) gets it once every
// rank has decided the calls before its own.
func (rl *relay) forward(origin int, last uint64, final bool) {
	rl.fwdMu.Lock()
	defer rl.fwdMu.Unlock()
	f := &rl.fwd
	f.heard[origin] = max(f.heard[origin], last)
	h := hostCheck{words: rl.words}
	done, lowest := f.heard[rl.rail[0]], ^uint64(0)
	moved := false
	for _, o := range rl.rail {
		done = min(done, f.heard[o])
		c := atomic.LoadUint64(h.cursor(o))
		lowest = min(lowest, c)
		moved = moved || c > f.cursor[o]
	}
	if done <= f.done && lowest < f.lowest+relayCursorEvery && !(final && moved) {
		return
	}
	msg := append(f.msg[:0], make([]byte, 8*relayHubHeaderWords)...)
	f.lowest = ^uint64(0)
	for _, o := range rl.rail {
		c := atomic.LoadUint64(h.cursor(o))
		msg = binary.LittleEndian.AppendUint64(msg, uint64(o))
		msg = binary.LittleEndian.AppendUint64(msg, c)
		f.cursor[o] = c
		f.lowest = min(f.lowest, c)
	}
	n := 0
	for _, o := range rl.rail {
		from := max(f.sent[o]+1, f.heard[o]-min(f.heard[o], hostSlots-1))
		for seq := from; seq <= f.heard[o]; seq++ {
			s := h.slot(o, seq)
			if atomic.LoadUint64(&s[0]) != seq {
				continue // not posted, or not this call's any more
			}
			msg = binary.LittleEndian.AppendUint64(msg, uint64(o))
			for w := range hostSlotWords {
				msg = binary.LittleEndian.AppendUint64(msg, atomic.LoadUint64(&s[w]))
			}
			n++
		}
		f.sent[o] = f.heard[o]
	}
	binary.LittleEndian.PutUint64(msg, uint64(n))
	binary.LittleEndian.PutUint64(msg[8:], uint64(len(rl.rail)))
	rl.sendAll(msg)
	f.msg, f.done = msg, max(f.done, done)
	f.sends++
}

// startSending has the relay send the calls posted from first on: the
// executing goroutine calls it when it takes the agreement's outcome,
// before its first post.
func (rl *relay) startSending(first uint64) {
	rl.flushMu.Lock()
	defer rl.flushMu.Unlock()
	rl.posted.Store(first - 1)
	rl.sent, rl.sending = first-1, true
}

// notePosted records that this rank posted call seq; the next flush sends
// it.
func (rl *relay) notePosted(seq uint64) { rl.posted.Store(seq) }

// flush sends the calls posted since the last message, with this rank's
// cursor; with none, the cursor alone once it has moved relayCursorEvery
// calls (or at all, when final). The watcher calls it each time it turns
// to a call and while it waits for one: a call's images go out as soon as
// the watcher has it, a wake-up the call pays anyway, where a goroutine of
// the relay's own cost the caller a wake-up of its own each call. A
// peer's call needs the image only when its data has crossed the network.
func (rl *relay) flush(final bool) {
	if rl == nil {
		return
	}
	rl.flushMu.Lock()
	defer rl.flushMu.Unlock()
	rl.flushLocked(final)
}

// tryFlush is flush for a Wait, which calls it each time it looks at its
// call: one call at a time, the images go out as soon as their caller
// waits, not when the watcher next wakes. It skips where another flush is
// under way; what that one missed, the watcher sends as it turns to the
// call (it turns to every call posted, and flushes before it waits for
// one).
func (rl *relay) tryFlush() {
	if rl == nil || !rl.flushMu.TryLock() {
		return
	}
	defer rl.flushMu.Unlock()
	rl.flushLocked(false)
}

// flushLocked is flush, flushMu held.
func (rl *relay) flushLocked(final bool) {
	if !rl.sending {
		return
	}
	h := hostCheck{words: rl.words}
	posted, cursor := rl.posted.Load(), atomic.LoadUint64(h.cursor(rl.rank))
	if rl.hub == rl.rank { // its own images go out with the rail's
		rl.forward(rl.rank, posted, final)
		rl.sent, rl.sentCursor = posted, cursor
		return
	}
	if posted <= rl.sent && cursor < rl.sentCursor+relayCursorEvery && (!final || cursor <= rl.sentCursor) {
		return
	}
	buf := append(rl.msg[:0], make([]byte, 8*relayHeaderWords)...)
	n := 0
	for seq := rl.sent + 1; seq <= posted; seq++ {
		s := h.slot(rl.rank, seq)
		if atomic.LoadUint64(&s[0]) != seq {
			continue // not posted (a test's skipped check)
		}
		for w := range hostSlotWords {
			buf = binary.LittleEndian.AppendUint64(buf, atomic.LoadUint64(&s[w]))
		}
		n++
	}
	head := uint64(n)
	if final {
		head |= relayFinal
	}
	binary.LittleEndian.PutUint64(buf, head)
	binary.LittleEndian.PutUint64(buf[8:], cursor)
	rl.sendAll(buf)
	rl.msg = buf
	rl.sent, rl.sentCursor = posted, cursor
}

// sendAll writes msg to every rail peer still connected.
func (rl *relay) sendAll(msg []byte) {
	rl.mu.Lock()
	out := rl.out
	rl.mu.Unlock()
	kept := out[:0:0]
	for _, c := range out {
		if _, err := c.Write(msg); err != nil {
			rl.logger.Debug("fairgo: the check's relay: a peer's connection", "rank", rl.rank, "err", err)
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) != len(out) {
		rl.mu.Lock()
		rl.out = kept
		rl.mu.Unlock()
	}
}

// abandon ends start's dials and hellos still under way, which then fail
// start: a Reducer that closes while its relay starts waits neither for a
// peer that closed first (a connection to a listener closing as it
// arrives is retried by TCP after a second) nor for one that never
// answers. Safe to call at any time, more than once.
func (rl *relay) abandon() {
	if rl != nil {
		rl.abandonDial()
	}
}

// close sends what is left to send, then closes the listener and
// every connection and waits for the relay's goroutines. The region must
// stay mapped until it returns.
func (rl *relay) close() error {
	if rl == nil {
		return nil
	}
	first := false
	rl.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	rl.flush(true) // before the connections close
	rl.once.Do(func() { close(rl.ready) })
	rl.mu.Lock()
	rl.closing = true
	conns := rl.conns
	rl.conns = nil
	rl.mu.Unlock()
	rl.abandon()
	err := rl.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	rl.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// relayHost is the IPv4 address a rank's relay listens on: host when
// given (WithCheckHost); else the first IPv4 address of the interfaces
// NCCL_SOCKET_IFNAME names, as NCCL's own sockets use (a list of name
// prefixes, or of exact names after "="); else that of the first interface
// that is up, not a loopback, and not one that NCCL_SOCKET_IFNAME
// excludes ("^" before the list). "" when there is none.
func relayHost(host string) string {
	if host != "" {
		return host
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	spec := os.Getenv("NCCL_SOCKET_IFNAME")
	exclude := strings.HasPrefix(spec, "^")
	spec = strings.TrimPrefix(spec, "^")
	exact := strings.HasPrefix(spec, "=")
	var names []string
	for _, n := range strings.Split(strings.TrimPrefix(spec, "="), ",") {
		if n != "" {
			names = append(names, n)
		}
	}
	is := func(ifc net.Interface, n string) bool {
		return ifc.Name == n || !exact && strings.HasPrefix(ifc.Name, n)
	}
	if len(names) > 0 && !exclude {
		for _, n := range names { // in the list's order
			for _, ifc := range ifs {
				if ip := ipv4Of(ifc); is(ifc, n) && ip != "" {
					return ip
				}
			}
		}
		return ""
	}
	for _, ifc := range ifs {
		excluded := slices.ContainsFunc(names, func(n string) bool { return is(ifc, n) })
		if ifc.Flags&net.FlagUp != 0 && ifc.Flags&net.FlagLoopback == 0 && !excluded {
			if ip := ipv4Of(ifc); ip != "" {
				return ip
			}
		}
	}
	return ""
}

// ipv4Of is the first IPv4 address of ifc, or "".
func ipv4Of(ifc net.Interface) string {
	addrs, err := ifc.Addrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr().String()
		}
	}
	return ""
}
