package cuda

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fairgo/fairgo"
)

// TestForeignStream: a stream created elsewhere on the device's primary
// context is accepted (also the special handles), events order work on it,
// its Close leaves the stream alive, and a stream of another GPU is
// rejected with an ArgError.
func TestForeignStream(t *testing.T) {
	d := devices(t, 1)[0]
	owner := stream(t, d)
	for _, h := range []uintptr{owner.Handle(), 0, StreamLegacy, StreamPerThread} {
		f, err := d.ForeignStream(h)
		if err != nil {
			t.Fatalf("ForeignStream(%#x): %v", h, err)
		}
		if f.Handle() != h {
			t.Fatalf("ForeignStream(%#x).Handle() = %#x", h, f.Handle())
		}
		cs, err := d.stream(f)
		if err != nil || cs != f {
			t.Fatalf("the device does not accept its foreign stream %#x: %v", h, err)
		}
		e := event(t, d)
		if err := e.Record(f); err != nil {
			t.Fatalf("record on foreign stream %#x: %v", h, err)
		}
		if err := owner.WaitEvent(e); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The owner's stream survived the wrappers' Close.
	if err := owner.Synchronize(); err != nil {
		t.Fatalf("owner stream after the foreign wrapper's Close: %v", err)
	}
}

// TestForeignStreamOtherGPU: a stream of another device, GPU 0 over a
// context of its own (and GPU 1 where there is one), is refused with an
// *fairgo.ArgError, both ways; each device accepts its own.
func TestForeignStreamOtherGPU(t *testing.T) {
	d := devices(t, 1)[0]
	for _, o := range othersOf(t, d) {
		t.Run(o.name, func(t *testing.T) {
			var ae *fairgo.ArgError
			_, err := d.ForeignStream(stream(t, o.d).Handle())
			require.ErrorAs(t, err, &ae, "a stream of %v on %v", o.d, d)
			require.ErrorIs(t, err, fairgo.ErrInvalidArgument)
			_, err = o.d.ForeignStream(stream(t, d).Handle())
			require.ErrorAs(t, err, &ae, "a stream of %v on %v", d, o.d)
			own := stream(t, o.d)
			f, err := o.d.ForeignStream(own.Handle())
			require.NoError(t, err, "%v's own stream", o.d)
			require.Equal(t, own.Handle(), f.Handle())
		})
	}
}

func TestForeignStreamClosedDevice(t *testing.T) {
	devices(t, 1) // skip without a GPU
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ForeignStream(0); !errors.Is(err, fairgo.ErrClosed) {
		t.Fatalf("ForeignStream on a closed device: %v, want ErrClosed", err)
	}
}
