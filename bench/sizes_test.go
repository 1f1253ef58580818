package bench

import (
	"errors"
	"testing"

	"github.com/fairgo/fairgo"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"8": 8, "0": 0, "1K": 1 << 10, "1k": 1 << 10, "4KB": 4 << 10, "16KiB": 16 << 10, "256M": 256 << 20,
		"1G": 1 << 30, "2T": 2 << 40, " 3M ": 3 << 20, "25MiB": 25 << 20,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "K", "-1", "1.5M", "1X", "99999999999T"} {
		if _, err := ParseSize(in); !errors.Is(err, fairgo.ErrInvalidArgument) {
			t.Errorf("ParseSize(%q): error %v, want ErrInvalidArgument", in, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{8: "8", 1000: "1000", 1 << 10: "1K", 3 << 20: "3M", 1 << 30: "1G",
		1536: "1536", 25 << 20: "25M"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
		if back, err := ParseSize(FormatSize(in)); err != nil || back != in {
			t.Errorf("round trip of %d: %d, %v", in, back, err)
		}
	}
}

func TestSizes(t *testing.T) {
	got, err := Sizes(8, 1<<30, 2)
	if err != nil || len(got) != 28 || got[0] != 8 || got[27] != 1<<30 {
		t.Errorf("Sizes(8, 1G, 2) = %d sizes %v…, %v", len(got), got[:min(3, len(got))], err)
	}
	got, _ = Sizes(1<<10, 4<<20, 4)
	want := []int64{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}
	if len(got) != len(want) {
		t.Fatalf("Sizes(1K, 4M, 4) = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Sizes(1K, 4M, 4)[%d] = %d, want %d", i, got[i], want[i])
		}
	}
	if got, _ := Sizes(3, 100, 3); got[len(got)-1] != 81 {
		t.Errorf("end not on the progression: %v", got)
	}
	if got, err := Sizes(5, 5, 1); err != nil || len(got) != 1 {
		t.Errorf("Sizes(5, 5, 1) = %v, %v", got, err)
	}
	for _, c := range [][3]int64{{0, 8, 2}, {16, 8, 2}, {8, 16, 1}, {8, 16, 0}} {
		if _, err := Sizes(c[0], c[1], c[2]); err == nil {
			t.Errorf("Sizes%v: no error", c)
		}
	}
}

func TestParseIntList(t *testing.T) {
	got, err := ParseIntList("-x", "1, 2,4,")
	if err != nil || len(got) != 3 || got[2] != 4 {
		t.Errorf("ParseIntList = %v, %v", got, err)
	}
	for _, in := range []string{"", "0", "1,a", "-2"} {
		if _, err := ParseIntList("-x", in); err == nil {
			t.Errorf("ParseIntList(%q): no error", in)
		}
	}
}
