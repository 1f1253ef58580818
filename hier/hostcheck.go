package hier

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/internal/poll"
	"github.com/fairgo/fairgo/internal/shm"
)

// The check through shared memory. The ranks of a machine compare their
// calls in a region of host memory they all map (a file under /dev/shm),
// not through a collective: each rank posts a call's image (check.go's,
// the same words) in a slot of its own before it enqueues the call's data,
// and the watcher that completes the call reads every rank's image for
// it, takes the element-wise maximum the check's allreduce would have
// taken, and decides as the collective check does. Across machines, each
// rank's relay (relay.go) copies its images into the regions of its rail
// peers' machines and theirs into its own, so that every region holds
// every rank's images. Every rank reads the same images, so every rank
// reaches the same verdict; a mismatch aborts, as it does there. A call
// costs a few stores and loads (and across machines a TCP message from the
// watcher) instead of an NCCL launch, and no device work.
//
// Because a rank posts before it enqueues its data, a call whose data has
// completed on one rank has been posted by every rank (the collective could
// not finish without their launches): on one machine its verdict is there
// to read when the data ends, across machines once the relays' messages
// are in (the watcher polls for them, under the watchdog). Posts need no
// order among the communicators' operations, the constraint that ties the
// collective check to the data (check.go).
//
// Slots are reused: each rank has hostSlots of them and a cursor, the last
// call it decided. A rank posts call n only once every rank's cursor has
// reached n − hostSlots, so no rank overwrites an image another has yet to
// read.
//
// The ranks agree on the region without waiting for each other outside
// their calls (a process may drive several ranks from one goroutine, and a
// call's enqueue never waits for a peer): the first calls are checked by the
// collective, whose images carry the agreement. World rank 0 (across
// machines, each machine's local rank 0) makes the region under a random
// name when its checker starts and offers the name's token in the check of
// call hostTokenCall (across machines, in the gather buffer that check
// reduces beside its image, with the relays' addresses); every rank maps
// the region when it learns that check's verdict (and dials its rail
// peers), and says in the check of call hostAgreeCall whether it could;
// from call hostFirstCall on, all of them check through the regions, or
// none (ranks on several hosts that declared one machine, a host without
// /dev/shm, a full tmpfs, a peer out of reach). A rank that offers
// or executes before the verdict it needs has arrived waits for it (offer,
// take); hostSlots calls apart, it rarely has to, since a rank runs at most
// that many checks ahead of its verdicts. The rank that made a file
// unlinks it once every rank of its machine has mapped it or given up (or
// at Close): a job that dies within its first hostAgreeCall calls may leave
// a file of a few KiB a rank in the directory, none later.

const (
	hostSlots = checkSlots
	// The calls whose collective checks carry the agreement, and the first
	// call checked through the region, each hostSlots after the last.
	hostTokenCall = 1
	hostAgreeCall = hostTokenCall + hostSlots
	hostFirstCall = hostAgreeCall + hostSlots
	// hostSlotWords is a slot: the call's number, written last, then its
	// image.
	hostSlotWords = 1 + imageWords
	// hostCursorWords keeps a rank's cursor (and its presence mark, written
	// once) alone on its cache line: the rank writes it once a call, every
	// peer polls it.
	hostCursorWords = 8
	hostRankWords   = hostCursorWords + hostSlots*hostSlotWords
	// hostHeaderWords holds the region's token and world size, which a
	// rank that maps it compares with what it was told.
	hostHeaderWords = 8
	// hostTokenBits keeps the token a positive int64, so that the check's
	// maximum carries world rank 0's token over the others' zeros.
	hostTokenBits = 62
)

// DefaultSharedMemoryDir is where the check's region is made: Linux's
// shared-memory file system.
const DefaultSharedMemoryDir = "/dev/shm"

// hostCheck is one rank's view of the shared region.
type hostCheck struct {
	region *shm.Region
	words  []uint64
	rank   int   // world rank
	size   int   // world size
	posted image // the image being posted (the executing goroutine's)
	// freed is the lowest cursor of the ranks when post last read them
	// all (the executing goroutine's): cursors only grow, so every slot of
	// a call up to freed+hostSlots is free without a look at the peers'
	// cursors, whose cache lines each peer writes once a call.
	freed uint64
	// local are the world ranks that map the region (every rank on one
	// machine); relay, across machines, brings the others' images in
	// (relay.go), nil on one machine.
	local []int
	relay *relay
}

func hostWords(size int) int { return hostHeaderWords + size*hostRankWords }

// hostCheckable reports whether the Reducer may check through shared
// memory: the option leaves it on, and the job spans at most
// relayMaxMachines machines (across machines the relay brings the other
// machines' images: relay.go). Every rank knows the grid, so every rank
// answers alike.
func (r *Reducer) hostCheckable() bool {
	return r.cfg.sharedMemoryDir != "" && r.rank.Grid.Machines <= relayMaxMachines
}

// hostAgreement is one rank's part in agreeing on the region: the
// checker's goroutine learns the verdicts that carry it, and the executing
// goroutine takes the outcome at call hostFirstCall.
type hostAgreement struct {
	r       *Reducer
	dir     string
	token   int64       // the region's token: its own, or learnt
	region  *shm.Region // mapped; nil when it could not be
	creator bool        // this rank made the region (it unlinks it)
	// Across machines (relayed): the relay, and the gather buffer whose
	// collective in call hostTokenCall's check tells every rank the
	// others' addresses and each machine its region's token.
	relayed bool
	relay   *relay
	// dialing is relay from its making on, never cleared (relay is, once
	// the outcome takes it): what abandon ends, from another goroutine.
	dialing *relay
	gather  image         // host memory, gatherWords a rank
	local   []int         // the world ranks of this rank's machine, learnt then
	failed  int64         // 1 until this rank has mapped the region
	outcome *hostCheck    // from hostFirstCall on; nil: the collective goes on
	learnt  chan struct{} // closed once call hostTokenCall's verdict is learnt
	settled chan struct{} // closed once call hostAgreeCall's verdict is learnt
	taken   bool          // the executing goroutine took the outcome (or gave up on it)
}

// newHostAgreement starts this rank's part: the rank that makes the
// region (world rank 0 on one machine, each machine's local rank 0 across
// machines) makes it; across machines, every rank starts its relay.
func (r *Reducer) newHostAgreement() *hostAgreement {
	g := r.rank.Grid
	// failed until this rank has mapped the region
	a := &hostAgreement{r: r, dir: r.cfg.sharedMemoryDir, learnt: make(chan struct{}), settled: make(chan struct{}),
		failed: 1, relayed: g.Machines > 1}
	if a.relayed {
		host := relayHost(r.cfg.checkHost)
		var err error
		if host != "" {
			a.relay, err = newRelay(host, r.WorldRank(), r.cfg.logger)
			if err == nil {
				a.relay.held = &r.hooks.relayHeld
			}
			a.dialing = a.relay
		}
		if a.relay == nil {
			r.cfg.logger.Debug("fairgo: the check's relay", "host", host, "err", err)
			return a
		}
	}
	if a.relayed && g.Local != 0 || !a.relayed && r.WorldRank() != 0 {
		return a
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return a
	}
	token := int64(binary.LittleEndian.Uint64(b[:])>>(64-hostTokenBits)) | 1 // never 0
	region, err := shm.Create(hostRegionPath(a.dir, token), hostWords(g.Size()))
	if err != nil {
		r.cfg.logger.Debug("fairgo: the check's shared memory", "err", err)
		return a
	}
	w := region.Words()
	atomic.StoreUint64(&w[1], uint64(g.Size()))
	atomic.StoreUint64(&w[0], uint64(token))
	a.token, a.region, a.creator = token, region, true
	if !a.relayed {
		a.failed = 0 // across machines, once the relay has started too
	}
	a.markPresence()
	return a
}

// abandon ends the relay's start where it is under way: the Reducer is
// closing, so the agreement's outcome no longer matters, and its dials
// must not hold Close (a peer that closed first, or never answers).
// start then fails, as a peer out of reach makes it, and the agreement's
// later call (hostAgreeCall), where it still runs, fails on every rank
// alike. Safe from any goroutine.
func (a *hostAgreement) abandon() {
	if a != nil {
		a.dialing.abandon()
	}
}

// gathers reports whether call seq's check carries the gather buffer.
func (a *hostAgreement) gathers(seq uint64) bool {
	return a != nil && a.relayed && seq == hostTokenCall
}

// fillGather writes this rank's words of the gather buffer, zero the
// others': its relay's address, its region's token where it made it, and
// its place in the grid (machine+1 above 32 bits, local index below).
func (a *hostAgreement) fillGather() {
	clear(a.gather)
	g, k := a.r.rank.Grid, a.r.WorldRank()
	if a.relay != nil {
		binary.LittleEndian.PutUint64(a.gather[8*gatherWords*k:], uint64(a.relay.addr))
	}
	if a.creator {
		binary.LittleEndian.PutUint64(a.gather[8*(gatherWords*k+1):], uint64(a.token))
	}
	binary.LittleEndian.PutUint64(a.gather[8*(gatherWords*k+2):], uint64(g.Machine+1)<<32|uint64(g.Local))
}

// learnGather maps this machine's region (made by its local rank 0) and
// starts the relay towards the rail peers, from the reduced gather
// buffer of call hostTokenCall.
func (a *hostAgreement) learnGather() {
	r := a.r
	g, size := r.rank.Grid, r.rank.Grid.Size()
	word := func(k, i int) int64 { return int64(binary.LittleEndian.Uint64(a.gather[8*(gatherWords*k+i):])) }
	var creatorToken, jobToken int64
	peers := map[int]int64{}
	for k := range size {
		place := word(k, 2)
		machine, local := int(place>>32)-1, int(place&0xffffffff)
		switch {
		case machine == g.Machine && local == 0:
			creatorToken = word(k, 1)
			a.local = append(a.local, k)
		case machine == g.Machine:
			a.local = append(a.local, k)
		case local == g.Local:
			peers[k] = word(k, 0)
		}
		if jobToken <= 0 { // the lowest world rank's region: every rank names the same
			jobToken = word(k, 1)
		}
	}
	if a.relay == nil || creatorToken <= 0 || jobToken <= 0 || len(a.local) != g.Devices {
		return
	}
	if !a.creator && !a.open(creatorToken) || a.region == nil {
		return
	}
	if err := a.relay.start(a.region.Words(), size, uint64(jobToken), peers); err != nil {
		r.cfg.logger.Debug("fairgo: the check's relay", "rank", r.WorldRank(), "err", err)
		return
	}
	a.failed = 0
}

// open maps the region of token that another rank made, and marks this
// rank's presence in it.
func (a *hostAgreement) open(token int64) bool {
	r := a.r
	size := r.rank.Grid.Size()
	region, err := shm.Open(hostRegionPath(a.dir, token), hostWords(size))
	if err == nil && (atomic.LoadUint64(&region.Words()[0]) != uint64(token) ||
		atomic.LoadUint64(&region.Words()[1]) != uint64(size)) {
		err = errors.Join(errors.New("another job's region"), region.Close())
	}
	if err != nil {
		r.cfg.logger.Debug("fairgo: the check's shared memory", "rank", r.WorldRank(), "err", err)
		return false
	}
	a.token, a.region = token, region
	a.markPresence()
	return true
}

// offer writes this rank's part of the agreement into the image of call
// seq's collective check. The checker's enqueue calls it.
func (a *hostAgreement) offer(seq uint64, img image) {
	switch seq {
	case hostTokenCall:
		if a.relayed {
			a.fillGather()
			return
		}
		binary.LittleEndian.PutUint64(img[8*tokenWord:], uint64(a.token)) // 0 on every rank but world rank 0
	case hostAgreeCall:
		// Fingerprinted calls take no slot of the checker's, so the slot
		// order alone does not put call hostTokenCall's verdict first.
		a.await(a.learnt)
		binary.LittleEndian.PutUint64(img[8*failedWord:], uint64(a.failed))
	}
}

// await waits for ch to close, or for the Reducer to break.
func (a *hostAgreement) await(ch chan struct{}) bool {
	var pace poll.Backoff
	pace.Max = time.Millisecond
	for {
		select {
		case <-ch:
			return true
		default:
		}
		if a.r.brokenCause() != nil {
			return false
		}
		pace.Wait()
	}
}

// learn reads the agreement from call seq's decided check. The checker's
// goroutine calls it in call order, before it frees the call's slot, so
// that the check of the call hostSlots later, which waits for that slot,
// offers what this learnt.
func (a *hostAgreement) learn(seq uint64, img image) {
	r := a.r
	switch seq {
	case hostTokenCall:
		defer close(a.learnt)
		if a.relayed {
			a.learnGather()
			return
		}
		token := int64(binary.LittleEndian.Uint64(img[8*tokenWord:]))
		if r.WorldRank() != 0 && token > 0 && a.open(token) {
			a.failed = 0
		}
	case hostAgreeCall:
		anyFailed := int64(binary.LittleEndian.Uint64(img[8*failedWord:]))
		if a.creator && a.region != nil {
			_ = a.region.Remove() // every rank of its machine has mapped it, or given up
		}
		if anyFailed == 0 && a.region != nil {
			local := a.local
			if !a.relayed {
				local = nil
				for k := range r.rank.Grid.Size() {
					local = append(local, k)
				}
			}
			a.outcome = &hostCheck{region: a.region, words: a.region.Words(), rank: r.WorldRank(),
				size: r.rank.Grid.Size(), posted: make(image, 8*imageWords), local: local, relay: a.relay}
			a.relay = nil
		} else {
			// The relay writes in the region: it closes first.
			_ = a.relay.close()
			a.relay = nil
			if a.region != nil {
				_ = a.region.Close()
			}
		}
		a.region = nil
		close(a.settled)
	}
}

// markPresence marks in the region that this rank mapped it, before it
// offers so in the check of call hostAgreeCall.
func (a *hostAgreement) markPresence() {
	at := hostHeaderWords + a.r.WorldRank()*hostRankWords + 1
	atomic.StoreUint64(&a.region.Words()[at], uint64(a.token))
}

// take is the agreement's outcome, for calls from hostFirstCall on: the
// region to check through, or nil. The executing goroutine calls it at
// that call, waiting for call hostAgreeCall's verdict; it gives up (nil)
// when the Reducer breaks. The presence marks were all written before
// that verdict: a rank missing from them is one the communicator only
// pretends to reach (a test double), and every rank of a real job sees
// them all.
func (a *hostAgreement) take() *hostCheck {
	a.taken = true
	if !a.await(a.settled) || a.outcome == nil {
		return nil
	}
	h := a.outcome
	for _, k := range h.local {
		if atomic.LoadUint64(h.presence(k)) != uint64(a.token) {
			return nil // kept for release
		}
	}
	a.outcome = nil
	if h.relay != nil {
		h.relay.startSending(hostFirstCall)
	}
	return h
}

// release unmaps what the agreement holds and did not hand over, and
// unlinks the file where world rank 0 made it and the agreement never
// ended. The checker's release calls it, once its goroutine has exited.
func (a *hostAgreement) release() error {
	if a == nil {
		return nil
	}
	errs := []error{a.relay.close()} // before the region it writes in
	if a.region != nil {
		errs = append(errs, closeRegion(a.region, a.creator && !isClosed(a.settled)))
	}
	if a.outcome != nil {
		errs = append(errs, a.outcome.close())
	}
	return errors.Join(errs...)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// hostRegionPath is the region's file: named by the token alone, which
// every rank learns (62 random bits: jobs on one host do not collide).
func hostRegionPath(dir string, token int64) string {
	return filepath.Join(dir, fmt.Sprintf("fairgo-check-%016x", token))
}

// closeRegion unmaps region, if any, and unlinks its file when remove.
func closeRegion(region *shm.Region, remove bool) error {
	if region == nil {
		return nil
	}
	var err error
	if remove {
		err = region.Remove()
	}
	return errors.Join(err, region.Close())
}

// close closes the relay, then the region it writes in.
func (h *hostCheck) close() error { return errors.Join(h.relay.close(), h.region.Close()) }

// cursor is rank's last decided call.
func (h *hostCheck) cursor(rank int) *uint64 {
	return &h.words[hostHeaderWords+rank*hostRankWords]
}

// presence is where rank marked, with the region's token, that it mapped
// the region (markPresence): the word after its cursor.
func (h *hostCheck) presence(rank int) *uint64 {
	return &h.words[hostHeaderWords+rank*hostRankWords+1]
}

// slot is rank's slot for call seq.
func (h *hostCheck) slot(rank int, seq uint64) []uint64 {
	at := hostHeaderWords + rank*hostRankWords + hostCursorWords + int(seq%hostSlots)*hostSlotWords
	return h.words[at : at+hostSlotWords : at+hostSlotWords]
}

// reusable reports whether every rank has decided the call that last held
// call seq's slots.
func (h *hostCheck) reusable(seq uint64) bool {
	if seq < hostFirstCall+hostSlots || seq-hostSlots <= h.freed { // the slot's first use, or freed already
		return true
	}
	lowest := uint64(math.MaxUint64)
	for k := range h.size {
		c := atomic.LoadUint64(h.cursor(k))
		if c < seq-hostSlots {
			return false
		}
		lowest = min(lowest, c)
	}
	h.freed = lowest
	return true
}

// post writes call q's image in this rank's slot, once the slot may be
// reused; stopped, polled while it waits, ends the wait with its error.
// The executing goroutine calls it, before it enqueues q's data.
func (h *hostCheck) post(q *request, stopped func() error) error {
	var pace poll.Backoff
	pace.Max = time.Millisecond
	for !h.reusable(q.seq) {
		if err := stopped(); err != nil {
			return fmt.Errorf("hier: waiting to post the check of %v: %w", q, err)
		}
		pace.Wait()
	}
	clear(h.posted)
	h.posted.put(q, h.rank, h.size)
	s := h.slot(h.rank, q.seq)
	for w := range imageWords {
		atomic.StoreUint64(&s[1+w], binary.LittleEndian.Uint64(h.posted[8*w:]))
	}
	atomic.StoreUint64(&s[0], q.seq) // publishes the image
	if h.relay != nil {
		h.relay.notePosted(q.seq)
	}
	return nil
}

// decide reads every rank's image of call q: ok false when some rank has
// not posted it yet; else the verdict (nil, or the *MismatchError), after
// which this rank's cursor moves to q, freeing q's slot for the peers.
// Whoever completes calls decides them, in call order, with watch.mu held
// and q not yet completed: once the cursor has passed q, q's slots may
// hold a later call.
func (h *hostCheck) decide(q *request) (ok bool, err error) {
	if ok, err = h.read(q); ok {
		h.advance(q.seq)
	}
	return ok, err
}

// read is decide without moving the cursor: a Wait that helps (help)
// reads, and moves the cursor only for a call it then completes, leaving
// a mismatch to the watcher to decide and explain.
func (h *hostCheck) read(q *request) (ok bool, err error) {
	for k := range h.size {
		if atomic.LoadUint64(&h.slot(k, q.seq)[0]) != q.seq {
			return false, nil
		}
	}
	var buf [8 * imageWords]byte // the maximum of the ranks' images
	merged := image(buf[:])
	for w := range imageWords {
		var m int64
		for k := range h.size {
			v := int64(atomic.LoadUint64(&h.slot(k, q.seq)[1+w]))
			if k == 0 || v > m {
				m = v
			}
		}
		binary.LittleEndian.PutUint64(merged[8*w:], uint64(m))
	}
	return true, merged.decide(q, h.size)
}

// advance moves this rank's cursor to seq, never back.
func (h *hostCheck) advance(seq uint64) {
	for c := h.cursor(h.rank); ; {
		if last := atomic.LoadUint64(c); last >= seq || atomic.CompareAndSwapUint64(c, last, seq) {
			return
		}
	}
}

// decideHostCheck decides call q's shared check, with watch.mu held,
// unless a Wait completed q (helped), whose slots may hold a later call.
func (r *Reducer) decideHostCheck(q *request) (ok, helped bool, err error) {
	r.watch.mu.Lock()
	defer r.watch.mu.Unlock()
	if q.completedElsewhere() {
		return false, true, nil
	}
	ok, err = r.host.decide(q)
	return ok, false, err
}

// awaitHostCheck decides call q's shared check, polling for up to wait
// for the ranks that have not posted it; ok false when they still have
// not. A mismatch aborts the Reducer, as the collective check's does; once
// the Reducer is broken, a check some rank has not posted fails with the
// cause at once.
func (r *Reducer) awaitHostCheck(q *request, wait time.Duration) (ok bool, err error) {
	var pace poll.Backoff
	pace.Max = time.Millisecond
	var deadline time.Time
	for {
		var helped bool
		ok, helped, err = r.decideHostCheck(q)
		if ok || wait <= 0 || r.brokenCause() != nil || helped {
			break
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(wait)
		} else if now.After(deadline) {
			break
		}
		pace.Wait()
	}
	if errors.Is(err, fairgo.ErrMismatch) {
		r.explainRefusal(q, err)
		r.abort(err)
	}
	if cause := r.brokenCause(); !ok && cause != nil {
		// A rank that broke posts no more: no device work to wait for.
		return true, fmt.Errorf("hier: the call's check did not complete: %w", cause)
	}
	return ok, err
}
