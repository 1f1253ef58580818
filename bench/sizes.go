package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo"
)

// ParseSize reads a byte count with an optional K, M, G or T suffix (powers
// of 1024, as nccl-tests reads them; "KB", "KiB" and lower case work too).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	bad := func(why string) (int64, error) {
		return 0, &fairgo.ArgError{Arg: "size", Value: strconv.Quote(s), Reason: why}
	}
	if t == "" {
		return bad("empty")
	}
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(u, "IB")
	u = strings.TrimSuffix(u, "B")
	shift := 0
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			u = u[:n-1]
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(u), 10, 64)
	if err != nil {
		return bad("not an integer with an optional K, M, G or T suffix")
	}
	if v < 0 {
		return bad("negative")
	}
	if v > math.MaxInt64>>shift {
		return bad("overflows int64")
	}
	return v << shift, nil
}

// FormatSize prints a byte count the short way ParseSize reads: "8", "1K",
// "256M", "1G"; counts that are no whole number of KiB stay in bytes.
func FormatSize(n int64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.suffix)
		}
	}
	return strconv.FormatInt(n, 10)
}

// Sizes lists the sizes from begin to end, multiplying by factor, as
// nccl-tests' -b -e -f do. The end is included when the progression hits
// it. Factor 1 is refused unless begin == end.
func Sizes(begin, end int64, factor int64) ([]int64, error) {
	switch {
	case begin < 1:
		return nil, &fairgo.ArgError{Arg: "-b", Value: begin, Reason: "must be at least 1 byte"}
	case end < begin:
		return nil, &fairgo.ArgError{Arg: "-e", Value: end, Reason: fmt.Sprintf("smaller than -b %d", begin)}
	case factor < 1 || (factor == 1 && begin != end):
		return nil, &fairgo.ArgError{Arg: "-f", Value: factor, Reason: "must be at least 2 (or 1 with -b = -e)"}
	}
	var out []int64
	for s := begin; s <= end; s *= factor {
		out = append(out, s)
		if factor == 1 || s > math.MaxInt64/factor {
			break
		}
	}
	return out, nil
}

// ParseIntList reads a comma-separated list of positive integers ("1,2,4").
func ParseIntList(name, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, &fairgo.ArgError{Arg: name, Value: s, Reason: fmt.Sprintf("%q is not a positive integer", f)}
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, &fairgo.ArgError{Arg: name, Value: s, Reason: "empty list"}
	}
	return out, nil
}
