package capi

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fairgo/fairgo"
)

// FromEnv returns o with the settings that lookup finds (FAIRGO_ALGORITHM,
// ...; an empty value counts as unset) applied. A value that does not
// parse, or that is not valid (hier.ValidateOptions judges the settings
// that are hier options), is an *fairgo.ArgError naming the variable and
// quoting its text; o is then returned unchanged.
func (o Options) FromEnv(lookup func(string) (string, bool)) (Options, error) {
	in := o
	texts := map[string]string{} // the variables set, by name
	var set []Setting
	for _, s := range Settings {
		text, ok := lookup(s.Env)
		text = strings.TrimSpace(text)
		if !ok || text == "" {
			continue
		}
		texts[s.Env] = text
		set = append(set, s)
		if err := s.parse(text, &o); err != nil {
			return in, envError(s, text, err)
		}
	}
	spell := func(s Setting) (string, any) { return envArg(s.Env), strconv.Quote(texts[s.Env]) }
	if err := o.check(set, spell); err != nil {
		return in, err
	}
	return o, nil
}

// envArg is the Arg of an *fairgo.ArgError about an environment variable.
func envArg(name string) string { return "environment variable " + name }

// envError is the *fairgo.ArgError of a variable whose text does not
// parse: err's reason (and its sentinel, when err is an *fairgo.ArgError
// such as hier.ParseAlgorithm's), the variable's name and its text.
func envError(s Setting, text string, err error) error {
	out := fairgo.ArgError{Reason: err.Error()}
	var bad *fairgo.ArgError
	if errors.As(err, &bad) {
		out = *bad
	}
	out.Arg, out.Value = envArg(s.Env), strconv.Quote(text)
	return &out
}

// ParseBytes reads a byte count: an integer with an optional binary
// suffix K, M or G (also KiB, MiB, GiB; any case).
func ParseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if n > math.MaxInt64/mult || n < math.MinInt64/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// ParseSeconds reads a duration: a number of seconds ("600", "0.5") or a
// Go duration ("10m", "90s"). A negative one parses: whoever takes it
// judges it (hier.WithTimeout, the init timeout's check).
func ParseSeconds(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		limit := float64(math.MaxInt64) / float64(time.Second)
		if math.IsNaN(f) || f > limit || f < -limit {
			return 0, fmt.Errorf("want seconds or a duration such as 90s or 10m")
		}
		d = time.Duration(f * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("want seconds or a duration such as 90s or 10m")
	}
	return d, nil
}
