package hier

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	// fingerprints. Each rank sends every call's image to each of its
	// machines − 1 rail peers and hears from as many, and a message heard
	// is a thread woken: on a busy host those wake-ups delay the calls'
	// completion more than a fingerprint's copies cost (BENCHMARKS.md,
	// "The relay's reach").
	relayMaxMachines = 4
	relayMagic       = 0x6661697267 // "fairg": the hello's first word
	// relayCursorEvery is how far a rank's cursor moves before its relay
	// sends it without an image.
	relayCursorEvery = hostSlots / 4
	// relayDial bounds the dials of the peers with their
	// acknowledgements, and the wait for a peer's hello.
	relayDial = 10 * time.Second
	// relayHelloWords is a connection's first message: the magic, the
	// job's token, the sender's world rank, the receiver's.
	relayHelloWords = 4
	// relayHeaderWords start every later message: how many slots follow,
	// and the sender's cursor.
	relayHeaderWords = 2
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

	// The sending side (flush): posted is the last call this rank
	// posted; the rest is flushMu's.
	posted     atomic.Uint64
	flushMu    sync.Mutex
	sending    bool   // the posts are sent (startSending)
	sent       uint64 // the last call sent
	sentCursor uint64 // the last cursor sent
	msg        []byte
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
	rl.once.Do(func() { close(rl.ready) })
	deadline := time.Now().Add(relayDial)
	errs := make(chan error, len(peers))
	for peer, addr := range peers {
		go func() { errs <- rl.dial(peer, addr, deadline) }()
	}
	var err error
	for range peers {
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
	h := hostCheck{words: rl.words}
	for {
		if _, err := io.ReadFull(r, buf[:8*relayHeaderWords]); err != nil {
			return // the peer closed, or died: see above
		}
		n, cursor := int(word(0)), word(1)
		if n > hostSlots {
			rl.logger.Debug("fairgo: the check's relay: a message of too many slots", "rank", rl.rank, "from", from)
			return
		}
		if _, err := io.ReadFull(r, buf[:8*n*hostSlotWords]); err != nil {
			return
		}
		for i := range n {
			at := i * hostSlotWords
			seq := word(at)
			s := h.slot(from, seq)
			for w := 1; w < hostSlotWords; w++ {
				atomic.StoreUint64(&s[w], word(at+w))
			}
			atomic.StoreUint64(&s[0], seq)
		}
		if c := h.cursor(from); cursor > atomic.LoadUint64(c) {
			atomic.StoreUint64(c, cursor)
		}
	}
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
	binary.LittleEndian.PutUint64(buf, uint64(n))
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
