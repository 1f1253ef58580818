package hier

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/backend"
)

// Board keys. A rank whose watchdog fires asks every rank for its progress
// (how far it got), gathers the answers for a short while, then writes the
// timeout note and aborts; every rank listens for both, answers the first
// and aborts on the second with a TimeoutError naming the rank that timed
// out.
const (
	boardAsk      = "fairgo-board/progress-wanted"
	boardTimeout  = "fairgo-board/timeout"
	boardProgress = "fairgo-board/progress/"
	// boardRefused + "<call>/<world rank>" is why that rank refused that
	// call, posted before its check: a peer that accepted the call reads it
	// when the check names the rank.
	boardRefused = "fairgo-board/refused/"
	// boardRefusedCall + "<call>" is the world rank that refused that call
	// (the last to post it, where several did), and boardUnheard +
	// "<call>" a rank that accepted it and learnt of the refusal from the
	// Board: for the refusals that no check carries (unheardRefusal).
	boardRefusedCall = "fairgo-board/refused-call/"
	boardUnheard     = "fairgo-board/unheard/"
	// boardMismatch + "<call>" is the reduced check image of that call as
	// the first rank to abort on its mismatch read it (postMismatch): a
	// peer whose own check never ends reads the mismatch there
	// (boardVerdict).
	boardMismatch = "fairgo-board/mismatch/"
	// boardShape + "<world rank>" is that rank's check image of its last
	// call undecided for refusalGrace (compareShapes): one key a rank,
	// overwritten, so that a job's long calls leave nothing behind.
	boardShape = "fairgo-board/shape/"
	// refusalGrace is how long a call stays undecided before its rank asks
	// the Board whether the call was refused, and how long between two
	// asks; refusalAsk bounds each ask.
	refusalGrace = time.Second
	refusalAsk   = 20 * time.Millisecond
	// progressWait bounds how long the rank that timed out gathers the
	// others' progress before it reports.
	progressWait = time.Second
)

// TimeoutError is the error of calls on every rank of a job once the
// watchdog (WithTimeout) fired on one of them: Rank is the world rank whose
// call did not complete in time. It wraps fairgo.ErrTimeout and
// fairgo.ErrAborted (the communicators were aborted).
type TimeoutError struct {
	Rank     int    // the world rank whose watchdog fired
	Detail   string // its stuck call and how long it waited
	Progress string // how far each rank got, as the Board reported it ("" without a Board)
}

func (e *TimeoutError) Error() string {
	s := fmt.Sprintf("hier: rank %d timed out: %s", e.Rank, e.Detail)
	if e.Progress != "" {
		s += "; " + e.Progress
	}
	return s
}

// Unwrap returns fairgo.ErrTimeout and fairgo.ErrAborted.
func (e *TimeoutError) Unwrap() []error { return []error{fairgo.ErrTimeout, fairgo.ErrAborted} }

// progress is how far this rank got: the last call enqueued on the device
// and the last completed.
func (r *Reducer) progress() string {
	return fmt.Sprintf("enqueued call %d, completed %d", r.watch.enqueued.Load(), r.watch.completed.Load())
}

// timedOut reports that q did not complete within the watchdog's time and
// aborts: with a Board, after telling the peers and gathering how far each
// rank got.
func (r *Reducer) timedOut(q *request, waited time.Duration) {
	r.timedOutOn(fmt.Sprintf("%v (call %d)", q, q.seq), waited)
}

// timedOutOn is timedOut for any work the engine waits on.
func (r *Reducer) timedOutOn(what string, waited time.Duration) {
	e := &TimeoutError{Rank: r.WorldRank(),
		Detail: fmt.Sprintf(
			"%s not complete %v after it could start (WithTimeout %v)",
			what,
			waited.Round(time.Millisecond),
			r.cfg.timeout,
		)}
	if r.board != nil {
		e.Progress = r.board.gather(e)
		// The cause is this rank's before the note goes out: a peer that
		// reads it aborts its communicators, and this rank's calls that
		// then end (a simulated world fails them at once) must report the
		// timeout, not the peer's abort, though this rank has not aborted yet.
		r.causeFirst(e)
		r.board.note(e)
	} else {
		e.Progress = fmt.Sprintf("this rank %s", r.progress())
	}
	r.abort(e)
}

// bulletin is a Reducer's link to the Board.
type bulletin struct {
	r      *Reducer
	b      backend.Store
	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func newBulletin(r *Reducer, b backend.Store) *bulletin {
	bl := &bulletin{r: r, b: b}
	bl.ctx, bl.cancel = context.WithCancel(context.Background())
	bl.done.Add(2)
	go bl.answer()
	go bl.listen()
	return bl
}

func (bl *bulletin) stop() {
	bl.cancel()
	bl.done.Wait()
}

// answer publishes this rank's progress when a rank asks for it.
func (bl *bulletin) answer() {
	defer bl.done.Done()
	if _, err := bl.b.Get(bl.ctx, boardAsk); err == nil {
		bl.publishProgress()
	}
}

// listen waits for a timeout note from any rank.
func (bl *bulletin) listen() {
	defer bl.done.Done()
	v, err := bl.b.Get(bl.ctx, boardTimeout)
	if err != nil {
		return // closed, or the board failed: nothing to relay
	}
	rank, detail, _ := strings.Cut(string(v), "\n")
	from, err := strconv.Atoi(rank)
	if err != nil || from == bl.r.WorldRank() {
		return // our own note: timedOut reports it
	}
	bl.publishProgress()
	bl.r.abort(&TimeoutError{Rank: from, Detail: detail, Progress: "this rank " + bl.r.progress()})
}

func (bl *bulletin) publishProgress() {
	ctx, cancel := context.WithTimeout(bl.ctx, progressWait)
	defer cancel()
	_ = bl.b.Set(ctx, boardProgress+strconv.Itoa(bl.r.WorldRank()), []byte(bl.r.progress()))
}

// gather asks every rank how far it got and waits a short while for the
// answers; note then tells the peers that this rank timed out. Nobody
// aborts before the note, so that the first cause every rank reports is
// the timeout, and every rank's progress is read before any aborts.
func (bl *bulletin) gather(e *TimeoutError) string {
	bl.publishProgress()
	ctx, cancel := context.WithTimeout(bl.ctx, progressWait)
	defer cancel()
	_ = bl.b.Set(ctx, boardAsk, []byte(strconv.Itoa(e.Rank)))
	w := bl.r.rank.Grid.Size()
	reports := make([]string, w)
	var wg sync.WaitGroup
	for k := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := bl.b.Get(ctx, boardProgress+strconv.Itoa(k))
			if err != nil {
				reports[k] = fmt.Sprintf("rank %d: no report within %v", k, progressWait)
				return
			}
			reports[k] = fmt.Sprintf("rank %d: %s", k, v)
		}()
	}
	wg.Wait()
	return "progress: " + strings.Join(reports, "; ")
}

// note tells the peers that this rank timed out (gather).
func (bl *bulletin) note(e *TimeoutError) {
	ctx, cancel := context.WithTimeout(bl.ctx, progressWait)
	defer cancel()
	_ = bl.b.Set(ctx, boardTimeout, []byte(strconv.Itoa(e.Rank)+"\n"+e.Detail))
}

// postRefusal leaves on the Board why this rank refused q, before q's
// check is enqueued: by the time a peer's check names this rank, the reason
// is there to read. It runs on the executing goroutine, which a refused
// call does not otherwise keep busy; a Board that does not answer within
// progressWait only costs the peers the reason.
func (r *Reducer) postRefusal(q *request) {
	if r.board == nil || q.rejected == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.board.ctx, progressWait)
	defer cancel()
	_ = r.board.b.Set(ctx, refusalKey(q.seq, r.WorldRank()), []byte(q.rejected.Error()))
	_ = r.board.b.Set(ctx, boardRefusedCall+strconv.FormatUint(q.seq, 10), []byte(strconv.Itoa(r.WorldRank())))
}

// postMismatch leaves on the Board how this rank read the mismatch
// cause (mismatchPost), before the abort that follows: a peer whose own
// check never ends reads it there (boardVerdict). An abort ends this
// rank's NCCL communicators at once, and with them, where NCCL's proxy
// thread had not yet sent them, the last pieces of the check's collective
// that some peers were still to receive, or of the data that carries a
// fingerprint; a peer whose enqueue NCCL holds at the data's first
// connection has no data to end either. Nothing for a cause that is no
// mismatch, or without a Board; a Board that does not answer within
// progressWait only costs the peers the mismatch's name.
func (r *Reducer) postMismatch(cause error) {
	var mm *MismatchError
	if r.board == nil || !errors.As(cause, &mm) {
		return
	}
	v := mismatchPost(mm)
	if v == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.board.ctx, progressWait)
	defer cancel()
	_ = r.board.b.Set(ctx, boardMismatch+strconv.FormatUint(mm.Seq, 10), v)
}

// postedField starts a mismatch post that names only a field: a
// fingerprint's finding, which carries no other rank's value.
const postedField = "field\n"

// mismatchPost is what a peer needs to read mm against its own call: the
// reduced check image mm was read from, or the field a fingerprint found
// differing; nil for a refusal a fingerprint found (the refusing rank
// leaves its own note: postRefusal).
func mismatchPost(mm *MismatchError) []byte {
	switch {
	case mm.reduced != nil:
		return mm.reduced
	case mm.Refusal == nil && mm.Field != "":
		return []byte(postedField + mm.Field)
	}
	return nil
}

// postedMismatch is the mismatch that v, a peer's post (mismatchPost),
// says call q of a world of size ranks has, with q's own value; nil where
// v says nothing of q.
func postedMismatch(v []byte, q *request, size int) error {
	if field, ok := strings.CutPrefix(string(v), postedField); ok {
		if _, known := valueOf(q, field); !known {
			return nil
		}
		return fingerprintMismatch(q, field)
	}
	if len(v) != 8*imageWords {
		return nil
	}
	if err := image(v).decide(q, size); errors.Is(err, fairgo.ErrMismatch) {
		return err
	}
	return nil
}

// boardVerdict asks the Board, for call q undecided for refusalGrace or
// whose communicators a peer's abort ended, how a peer decided it: the
// mismatch a peer's check found (postMismatch), else a refusal that no
// check carries (unheardRefusal), else, where q is undecided (no check
// of its own has decided it for refusalGrace, and nothing failed), a
// difference between q and rank 0's call of the same number
// (compareShapes): the last resort, for the calls that no check can
// decide; a call whose communicator failed waits for its own check as
// before. Nil: none, or no Board. The asks run at once: each waits up to
// refusalAsk for a key that is most often absent, on the watcher's
// goroutine.
func (r *Reducer) boardVerdict(q *request, undecided bool) error {
	if r.board == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.board.ctx, refusalAsk)
	defer cancel()
	posted, shapes := make(chan []byte, 1), make(chan error, 1)
	go func() {
		v, err := r.board.b.Get(ctx, boardMismatch+strconv.FormatUint(q.seq, 10))
		if err != nil {
			v = nil
		}
		posted <- v
	}()
	if undecided {
		go func() { shapes <- r.compareShapes(ctx, q) }()
	} else {
		shapes <- nil
	}
	refusal := r.unheardRefusal(q)
	differ := <-shapes
	if err := postedMismatch(<-posted, q, r.rank.Grid.Size()); err != nil {
		r.explainRefusal(q, err)
		return err
	}
	if refusal != nil {
		return refusal
	}
	if differ != nil {
		r.explainRefusal(q, differ)
	}
	return differ
}

// compareShapes leaves call q's check image on the Board under this
// rank's key and compares it with rank 0's, when that is of the same
// call: the mismatch between the two (their values bound the ranks'
// Low and High), or nil. It decides the calls whose own checks never
// end: fingerprinted collectives whose exchanges the ranks' shapes
// misalign hang in NCCL, and a rank that posted a call to shared memory
// waits for a peer that fingerprinted it. Every rank compares with rank
// 0, so that a rank whose call differs from the others' finds it, or the
// others find it in theirs; rank 0 reads the verdict its peers then
// leave (postMismatch). Matching calls have equal images: a difference
// is never a false alarm, and a rank 0 at another call decides nothing.
func (r *Reducer) compareShapes(ctx context.Context, q *request) error {
	size := r.rank.Grid.Size()
	mine := make(image, 8*imageWords)
	mine.put(q, r.WorldRank(), size)
	_ = r.board.b.Set(ctx, boardShape+strconv.Itoa(r.WorldRank()), mine)
	if r.WorldRank() == 0 {
		return nil
	}
	v, err := r.board.b.Get(ctx, boardShape+"0")
	if err != nil || len(v) != len(mine) {
		return nil
	}
	theirs := image(v)
	if theirs.get(false, 0) != int64(q.seq) {
		return nil
	}
	both := make(image, len(mine))
	for w := range imageWords {
		both.set(false, w, max(mine.get(false, w), theirs.get(false, w)))
	}
	return both.decide(q, size)
}

// unheardRefusal asks the Board, for call q undecided for refusalGrace,
// whether a peer refused it while this rank accepted it, or whether a
// peer that accepted it learnt so while this rank refused it; it returns
// the mismatch (nil: neither, or no Board). It is for the refusals that
// no check carries: a rank that refuses a small call for an element type
// no collective can carry runs neither its peers' fingerprinted
// collective nor a check they join. Every other refusal is decided by the
// checks within milliseconds; a call that every rank refused is decided
// by them too, so that no rank here asks about it for long.
func (r *Reducer) unheardRefusal(q *request) error {
	if r.board == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(r.board.ctx, refusalAsk)
	defer cancel()
	seq := strconv.FormatUint(q.seq, 10)
	mm := &MismatchError{Seq: q.seq, Call: q.String(), Field: "acceptance", Low: "rejected", High: "accepted"}
	if q.rejected != nil {
		if _, err := r.board.b.Get(ctx, boardUnheard+seq); err != nil {
			return nil
		}
		mm.This = "rejected"
		mm.Refusal = &Refusal{Rank: r.WorldRank(), Reason: q.rejected.Error()}
		return mm
	}
	v, err := r.board.b.Get(ctx, boardRefusedCall+seq)
	if err != nil {
		return nil
	}
	k, err := strconv.Atoi(string(v))
	if err != nil || k == r.WorldRank() {
		return nil
	}
	mm.This = "accepted"
	mm.Refusal = &Refusal{Rank: k}
	r.explainRefusal(q, mm)
	tell, cancel := context.WithTimeout(r.board.ctx, progressWait)
	defer cancel()
	_ = r.board.b.Set(tell, boardUnheard+seq, []byte(strconv.Itoa(r.WorldRank())))
	return mm
}

func refusalKey(seq uint64, rank int) string {
	return boardRefused + strconv.FormatUint(seq, 10) + "/" + strconv.Itoa(rank)
}

// explainRefusal completes a mismatch that names a refusing rank with the
// reason that rank left on the Board. Without a Board the error says that
// the reason is in that rank's own error.
func (r *Reducer) explainRefusal(q *request, err error) {
	var mm *MismatchError
	if !errors.As(err, &mm) || mm.Refusal == nil || mm.Refusal.Rank < 0 {
		return
	}
	if mm.Refusal.Rank == r.WorldRank() && q.rejected != nil {
		mm.Refusal.Reason = q.rejected.Error()
		return
	}
	if r.board == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.board.ctx, progressWait)
	defer cancel()
	if v, gerr := r.board.b.Get(ctx, refusalKey(q.seq, mm.Refusal.Rank)); gerr == nil {
		mm.Refusal.Reason = string(v)
	}
}
