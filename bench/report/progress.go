package report

import (
	"io"
	"os"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/fairgo/fairgo/bench"
)

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// NewProgress returns a progress bar on w when w is a terminal, and nil
// (no progress shown) otherwise.
func NewProgress(w *os.File, name string) bench.Progress {
	if w == nil || !IsTerminal(w) {
		return nil
	}
	return newBar(w, name)
}

type bar struct {
	p *mpb.Progress
	b *mpb.Bar
}

func newBar(w io.Writer, name string) *bar {
	p := mpb.New(mpb.WithOutput(w), mpb.WithWidth(40))
	b := p.AddBar(0,
		mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR), decor.CountersNoUnit("%d/%d", decor.WCSyncWidth)),
		mpb.AppendDecorators(decor.Percentage(decor.WC{W: 5}), decor.Name(" "), decor.Elapsed(decor.ET_STYLE_GO)),
	)
	return &bar{p: p, b: b}
}

func (b *bar) SetTotal(n int64) { b.b.SetTotal(n, false) }
func (b *bar) Increment()       { b.b.Increment() }

// Close completes the bar and waits for its last render.
func (b *bar) Close() {
	b.b.SetTotal(-1, true)
	b.p.Wait()
}
