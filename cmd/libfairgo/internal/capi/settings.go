package capi

import (
	"errors"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo"
	"github.com/fairgo/fairgo/hier"
)

// Setting is one setting of a communicator and its spellings: the
// environment variable, the keyword argument of fairgo_torch.init(), the
// field of fairgo_config_t and, for a setting that becomes a hier.Option,
// the name hier gives that option. The C ABI and fairgo_torch translate a
// setting into its Options field and its hier.Option; they do not judge
// its value: hier.ValidateOptions does, and this package only for the
// settings that are its own (init timeout, device).
type Setting struct {
	Env     string // FAIRGO_...
	Keyword string // fairgo_torch.init(keyword=...)
	Field   string // fairgo_config_t's field
	Value   string // what the variable holds
	Default string
	Meaning string
	// Option is hier's name of the option the setting becomes: the Arg of
	// the *fairgo.ArgError with which hier rejects its value (e.g.
	// "WithSliceSize"). Empty for the C ABI's own settings.
	Option string

	// parse reads the variable's text into o (translation only: the
	// value is judged by check); an error's text is the reason the text
	// does not parse.
	parse func(text string, o *Options) error
	// option is the hier.Option of o's value; nil for the C ABI's own
	// settings.
	option func(o Options) hier.Option
	// invalid is, for the C ABI's own settings, why o's value is not
	// valid ("" when it is).
	invalid func(o Options) string
	// field is o's value as fairgo_config_t holds it.
	field func(o Options) any
}

// Settings are every setting the C ABI and fairgo_torch take. README.md
// and fairgo.h list them (a test checks).
var Settings = []Setting{
	{
		Env:     "FAIRGO_ALGORITHM",
		Keyword: "algorithm",
		Field:   "algorithm",
		Value:   algorithmNames(),
		Default: hier.Auto.String(),
		Meaning: "fix the allreduce's algorithm instead of measuring each size class",
		Option:  "WithAlgorithm",
		parse: func(text string, o *Options) error {
			a, err := hier.ParseAlgorithm(strings.ToLower(text))
			o.Algorithm = a
			return err
		},
		option: func(o Options) hier.Option { return hier.WithAlgorithm(o.Algorithm) },
		field:  func(o Options) any { return int(o.Algorithm) },
	},
	{
		Env:     "FAIRGO_SLICE_BYTES",
		Keyword: "slice_bytes",
		Field:   "slice_bytes",
		Value:   "bytes (K, M, G: binary multiples)",
		Default: "0: fairgo's choice",
		Meaning: "the pipeline's slice",
		Option:  "WithSliceSize",
		parse: func(text string, o *Options) error {
			n, err := ParseBytes(text)
			if err != nil {
				return errors.New("want a size in bytes such as 16777216 or 16M")
			}
			o.SliceBytes = n
			return nil
		},
		option: func(o Options) hier.Option { return hier.WithSliceSize(o.SliceBytes) },
		field:  func(o Options) any { return o.SliceBytes },
	},
	{
		Env:     "FAIRGO_FLAT_THRESHOLD_BYTES",
		Keyword: "flat_threshold_bytes",
		Field:   "flat_threshold_bytes",
		Value:   "bytes, or -1: never flat",
		Default: "0: fairgo's choice",
		Meaning: "below it one flat NCCL allreduce",
		Option:  "WithFlatThreshold",
		parse: func(text string, o *Options) error {
			n, err := ParseBytes(text)
			if err != nil {
				return errors.New("want a size in bytes such as 262144 or 256K, or -1 (never flat)")
			}
			o.FlatThreshold = n
			return nil
		},
		option: func(o Options) hier.Option { return hier.WithFlatThreshold(o.FlatThreshold) },
		field:  func(o Options) any { return o.FlatThreshold },
	},
	{
		Env:     "FAIRGO_TIMEOUT",
		Keyword: "timeout",
		Field:   "op_timeout_ms",
		Value:   "seconds or a Go duration (90s, 10m); 0: off",
		Default: "C: off; fairgo_torch: 600 s",
		Meaning: "the watchdog that turns a dead peer into an error on every rank",
		Option:  "WithTimeout",
		parse: func(text string, o *Options) error {
			d, err := ParseSeconds(text)
			o.OpTimeout = d
			return err
		},
		option: func(o Options) hier.Option { return hier.WithTimeout(o.OpTimeout) },
		field:  func(o Options) any { return o.OpTimeout.Milliseconds() },
	},
	{
		Env:     "FAIRGO_INIT_TIMEOUT",
		Keyword: "init_timeout",
		Field:   "init_timeout_ms",
		Value:   "seconds or a Go duration",
		Default: "300 s",
		Meaning: "bound of init: store, discovery, NCCL setup",
		parse: func(text string, o *Options) error {
			d, err := ParseSeconds(text)
			o.InitTimeout = d
			return err
		},
		invalid: func(o Options) string {
			if o.InitTimeout < 0 {
				return "must be positive, or 0 for the default"
			}
			return ""
		},
		field: func(o Options) any { return o.InitTimeout.Milliseconds() },
	},
	{
		Env:     "FAIRGO_DEVICE",
		Keyword: "device",
		Field:   "device",
		Value:   "CUDA ordinal, -1: default",
		Default: "-1: the one GPU CUDA_VISIBLE_DEVICES names, else LOCAL_RANK (fairgo_torch: PyTorch's current device)",
		Meaning: "this rank's GPU",
		parse: func(text string, o *Options) error {
			n, err := strconv.Atoi(text)
			if err != nil {
				return errors.New("want a CUDA ordinal, or -1")
			}
			o.Device = n
			return nil
		},
		invalid: func(o Options) string {
			if o.Device < -1 {
				return "want a CUDA ordinal, or -1 (the default)"
			}
			return ""
		},
		field: func(o Options) any { return o.Device },
	},
}

// algorithmNames are hier's algorithms by name: "auto, flat, ... or
// rail-allreduce".
func algorithmNames() string {
	var names []string
	for a := hier.Auto; a.Valid(); a++ {
		names = append(names, a.String())
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// reducerOptions are the hier options of o, one for each setting that
// becomes one.
func (o Options) reducerOptions() []hier.Option {
	var opts []hier.Option
	for _, s := range Settings {
		if s.option != nil {
			opts = append(opts, s.option(o))
		}
	}
	return opts
}

// spelling names a setting and its value as one kind of caller wrote them
// (the Arg and Value of an *fairgo.ArgError).
type spelling func(s Setting) (arg string, value any)

// configSpelling names a setting by its fairgo_config_t field.
func (o Options) configSpelling(s Setting) (string, any) { return "config " + s.Field, s.field(o) }

// check reports the first invalid value of o among settings: the C ABI's
// own settings judged here, the others by hier.ValidateOptions. The error
// is an *fairgo.ArgError (wrapping fairgo.ErrInvalidArgument, or the more
// specific sentinel hier gave) that names the setting as spell does; an
// error of hier about an option that no setting becomes is returned as it
// is.
func (o Options) check(settings []Setting, spell spelling) error {
	var opts []hier.Option
	for _, s := range settings {
		if s.invalid != nil {
			if why := s.invalid(o); why != "" {
				arg, value := spell(s)
				return &fairgo.ArgError{Arg: arg, Value: value, Reason: why}
			}
		}
		if s.option != nil {
			opts = append(opts, s.option(o))
		}
	}
	return respell(hier.ValidateOptions(opts...), settings, spell)
}

// respell turns hier's *fairgo.ArgError about an option (Arg
// "WithSliceSize") into one about the setting among settings that
// becomes it, named as spell names it; its reason and sentinel stay.
// Other errors are returned as they are.
func respell(err error, settings []Setting, spell spelling) error {
	var bad *fairgo.ArgError
	if !errors.As(err, &bad) {
		return err
	}
	for _, s := range settings {
		if s.Option != "" && s.Option == bad.Arg {
			out := *bad
			out.Arg, out.Value = spell(s)
			return &out
		}
	}
	return err
}

// validate checks o as fairgo_init gets it: an invalid setting is named by
// its fairgo_config_t field.
func (o Options) validate() error { return o.check(Settings, o.configSpelling) }
