package rendezvous

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHostlist bounds the hosts SlurmHostlist expands.
const maxHostlist = 1 << 20

// SlurmHostlist expands a Slurm host list such as "gpu[01-03,07],login1"
// (gpu01 gpu02 gpu03 gpu07 login1) in Slurm's order, stopping after limit
// hosts (limit < 1: no limit besides 2^20). A bracket holds numbers and
// ranges N-M; a range keeps the width of N ("08-10": 08 09 10); an item may
// hold several brackets ("r[1-2]n[1-2]": r1n1 r1n2 r2n1 r2n2).
func SlurmHostlist(s string, limit int) ([]string, error) {
	if limit < 1 || limit > maxHostlist {
		limit = maxHostlist
	}
	items, err := splitTopLevel(strings.TrimSpace(s))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, item := range items {
		if item == "" {
			return nil, fmt.Errorf("empty host in %q", s)
		}
		segs, err := parseHostItem(item)
		if err != nil {
			return nil, err
		}
		if expandHost(segs, "", limit, &out) {
			break
		}
	}
	return out, nil
}

// splitTopLevel splits at the commas outside brackets.
func splitTopLevel(s string) ([]string, error) {
	var items []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			if depth++; depth > 1 {
				return nil, fmt.Errorf("nested '[' at %d in %q", i, s)
			}
		case ']':
			if depth--; depth < 0 {
				return nil, fmt.Errorf("unmatched ']' at %d in %q", i, s)
			}
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("unclosed '[' in %q", s)
	}
	return append(items, s[start:]), nil
}

// hostSeg is a literal (choices nil) or a bracket's choices.
type hostSeg struct {
	lit     string
	choices []string
}

func parseHostItem(item string) ([]hostSeg, error) {
	var segs []hostSeg
	for item != "" {
		i := strings.IndexByte(item, '[')
		if i < 0 {
			segs = append(segs, hostSeg{lit: item})
			break
		}
		if i > 0 {
			segs = append(segs, hostSeg{lit: item[:i]})
		}
		j := strings.IndexByte(item, ']')
		choices, err := parseHostRanges(item[i+1 : j])
		if err != nil {
			return nil, err
		}
		segs = append(segs, hostSeg{choices: choices})
		item = item[j+1:]
	}
	return segs, nil
}

// parseHostRanges expands "01-03,07".
func parseHostRanges(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.ParseUint(lo, 10, 32)
		b, err2 := strconv.ParseUint(hi, 10, 32)
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("bad range %q in [%s] (want N or N-M, N <= M)", part, s)
		}
		if b-a >= maxHostlist || len(out)+int(b-a) >= maxHostlist {
			return nil, fmt.Errorf("range %q in [%s] holds too many hosts", part, s)
		}
		for n := a; n <= b; n++ {
			v := strconv.FormatUint(n, 10)
			if pad := len(lo) - len(v); pad > 0 {
				v = strings.Repeat("0", pad) + v
			}
			out = append(out, v)
		}
	}
	return out, nil
}

// expandHost appends the hosts of segs after prefix; it reports whether the
// limit was reached.
func expandHost(segs []hostSeg, prefix string, limit int, out *[]string) bool {
	if len(segs) == 0 {
		*out = append(*out, prefix)
		return len(*out) >= limit
	}
	s := segs[0]
	if s.choices == nil {
		return expandHost(segs[1:], prefix+s.lit, limit, out)
	}
	for _, c := range s.choices {
		if expandHost(segs[1:], prefix+c, limit, out) {
			return true
		}
	}
	return false
}
