// Package cli holds the command-line rules every fairgo command follows
// (fairrun, fairbench and its subcommands, the example programs):
//
//   - -h, -help and --help print the usage on stdout and exit 0;
//   - -version and --version print the command's name and fairgo.Version
//     on stdout and exit 0;
//   - a bad flag, value or argument prints one message on stderr and exits
//     2, a failure prints one message and exits 1;
//   - a message has one prefix, the command's name;
//   - a value is echoed as the user wrote it (sizes in the user's units);
//   - a value outside a list of choices is refused with the choices;
//   - arguments after the flags are refused unless the command takes them.
//
// Commands parse with Parse (or ParseFlags where they take arguments), mark
// the errors of their own checks with Usage or Usagef, and turn the outcome
// into an exit status with Program.Status. Nothing here exits the process.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo"
)

// Exit statuses.
const (
	ExitOK      = 0 // success, and the help
	ExitFailure = 1 // the command failed
	ExitUsage   = 2 // a bad command line: nothing was done
)

// ErrUsage is wrapped by every command-line error (Usage, Usagef, and the
// errors of Parse and ParseFlags other than flag.ErrHelp).
var ErrUsage = errors.New("bad command line")

// usageError marks err as a command-line error without changing its text.
type usageError struct{ err error }

func (e *usageError) Error() string   { return e.err.Error() }
func (e *usageError) Unwrap() []error { return []error{ErrUsage, e.err} }

// Usage marks err as a command-line error (exit status 2); its text and
// what it wraps stay as they are. Usage(nil) is nil.
func Usage(err error) error {
	if err == nil || errors.Is(err, ErrUsage) {
		return err
	}
	return &usageError{err}
}

// Usagef formats a command-line error; %w wraps as in fmt.Errorf.
func Usagef(format string, a ...any) error {
	return &usageError{fmt.Errorf(format, a...)}
}

// ParseFlags parses the flags of args with fs and leaves the arguments
// after them in fs.Args(), for a command that takes arguments. fs prints
// nothing (its output is discarded and its Usage does nothing: the
// command prints its own help and Program.Status its errors, once). -h,
// -help and --help (where fs defines no such flag) give flag.ErrHelp; a
// flag fs does not define, or a value its flag refuses, a usage error
// with the flag package's message.
//
// -version and --version (where fs defines no such flag) give ErrVersion,
// so that every command answers it alike, before any check of its own.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var version *bool
	if fs.Lookup("version") == nil {
		version = fs.Bool("version", false, "print the version and exit")
	}
	err := fs.Parse(args)
	switch {
	case err == nil && version != nil && *version:
		return ErrVersion
	case err == nil || errors.Is(err, flag.ErrHelp):
		return err
	}
	return Usage(asTyped(err, args))
}

// flagInError finds the flag the flag package's errors name ("flag
// provided but not defined: -x", "invalid value "v" for flag -x: ...",
// "flag needs an argument: -x", "invalid boolean value "v" for -x: ..."),
// which it always writes with one dash.
var flagInError = regexp.MustCompile(`(: | for flag | for )-([^\s:=]+)(:|$)`)

// asTyped makes err, an error of the flag package, name its flag with the
// dashes the user typed in args ("--bogus", not "-bogus"): the rules echo
// what was written. It wraps err.
func asTyped(err error, args []string) error {
	msg := err.Error()
	m := flagInError.FindStringSubmatchIndex(msg)
	if m == nil {
		return err
	}
	name := msg[m[4]:m[5]]
	for _, a := range args {
		if a == "--" {
			break
		}
		typed, _, _ := strings.Cut(a, "=")
		if typed == "--"+name {
			return &reasonError{text: msg[:m[4]-1] + "--" + msg[m[4]:], err: err}
		}
		if typed == "-"+name {
			break
		}
	}
	return err
}

// ErrVersion is returned by ParseFlags for -version and --version:
// Program.Status prints the command's name and fairgo.Version on stdout
// and exits 0.
var ErrVersion = errors.New("version requested")

// VersionLine is what --version prints: the command's name and
// fairgo.Version, e.g. "fairrun 0.1.0".
func VersionLine(name string) string { return name + " " + fairgo.Version }

// Parse is ParseFlags for a command that takes no arguments: one after the
// flags is a usage error.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := ParseFlags(fs, args); err != nil {
		return err
	}
	return NoArgs(fs.Args())
}

// NoArgs refuses arguments left after the flags.
func NoArgs(args []string) error {
	switch len(args) {
	case 0:
		return nil
	case 1:
		return Usagef("unexpected argument %q (flags only: -name value, or -name=value for a boolean)", args[0])
	}
	return Usagef("unexpected arguments %s (flags only: -name value, or -name=value for a boolean)", quoteAll(args))
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, " ")
}

// Program is what Status needs to know of a command.
type Program struct {
	// Name prefixes every message, e.g. "fairbench" or "allreduce".
	Name string
	// Help writes the usage; Status prints it on stdout for flag.ErrHelp.
	Help func(w io.Writer)
	// Hint follows the message of a usage error on a line of its own;
	// "": `run "Name -h" for usage`.
	Hint string
}

// Status turns a command's outcome into output and an exit status: nil is
// 0 with nothing printed; flag.ErrHelp prints the help on stdout and is 0;
// ErrVersion prints VersionLine on stdout and is 0;
// a usage error (ErrUsage) prints Message and the hint on stderr and is 2;
// any other error prints Message on stderr and is 1.
func (p Program) Status(err error, stdout, stderr io.Writer) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, flag.ErrHelp):
		if p.Help != nil {
			p.Help(stdout)
		}
		return ExitOK
	case errors.Is(err, ErrVersion):
		fmt.Fprintln(stdout, VersionLine(p.Name))
		return ExitOK
	}
	fmt.Fprintln(stderr, Message(p.Name, err))
	if !errors.Is(err, ErrUsage) {
		return ExitFailure
	}
	hint := p.Hint
	if hint == "" {
		hint = fmt.Sprintf("run %q for usage", p.Name+" -h")
	}
	fmt.Fprintln(stderr, hint)
	return ExitUsage
}

// Message is err's text prefixed with "name: ", once: a text that already
// starts with the prefix (an error of the command's own package) keeps
// just that one.
func Message(name string, err error) string {
	msg, prefix := err.Error(), name+": "
	for strings.HasPrefix(msg, prefix) {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return prefix + msg
}

// OneOf is a check for Choice: s must be one of choices. Its error lists
// them.
func OneOf(choices ...string) func(s string) error {
	return func(s string) error {
		for _, c := range choices {
			if s == c {
				return nil
			}
		}
		return fmt.Errorf("not one of %s", strings.Join(choices, ", "))
	}
}

// choice is a string flag whose values a check accepts.
type choice struct {
	p     *string
	check func(string) error
}

func (c choice) String() string {
	if c.p == nil {
		return ""
	}
	return *c.p
}

func (c choice) Set(s string) error {
	if err := c.check(s); err != nil {
		return err
	}
	*c.p = s
	return nil
}

// Choice defines a string flag whose values check accepts (OneOf for a
// list): a value it refuses is a usage error of Parse, whose message is
// the flag package's ("invalid value "x" for flag -name: ") followed by
// check's error, which should name the valid values. p starts at value,
// which check is not asked about.
func Choice(fs *flag.FlagSet, p *string, name, value, usage string, check func(string) error) {
	*p = value
	fs.Var(choice{p, check}, name, usage)
}

// given wraps a flag's value and keeps the text it was last given.
type given struct {
	flag.Value
	name string
	m    map[string]string
}

func (g given) Set(s string) error {
	if err := g.Value.Set(s); err != nil {
		return err
	}
	g.m[g.name] = s
	return nil
}

// givenBool is given for a boolean flag (-name without a value).
type givenBool struct{ given }

func (g givenBool) IsBoolFlag() bool { return true }

// Given wraps every flag fs defines so far and returns the map that Parse
// fills with the text each flag was last given, by the flag's name: what an
// error echoes, in the user's units ("2000ms", not "2s"). A flag defined
// later with another name on the same flag.Value (an alias) records under
// the first name. Call it before parsing, and print the help from a flag
// set it did not wrap (flag.PrintDefaults cannot tell the wrapped flags'
// types).
func Given(fs *flag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		g := given{f.Value, f.Name, m}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = givenBool{g}
			return
		}
		f.Value = g
	})
	return m
}

// Arg is a usage error of a flag's value that the library refused: for a
// *fairgo.ArgError, "Arg Value: Reason" (the flag, its value and what is
// wrong, without the library's prefix); any other error as it is. It wraps
// err. Arg(nil) is nil.
func Arg(err error) error {
	var ae *fairgo.ArgError
	if errors.As(err, &ae) {
		return Usage(&reasonError{text: fmt.Sprintf("%s %v: %s", ae.Arg, ae.Value, ae.Reason), err: err})
	}
	return Usage(err)
}

// Reason is err for a flag.Value's Set, whose error the flag package
// prefixes with the flag and the value: for a *fairgo.ArgError its reason
// alone; any other error as it is. It wraps err.
func Reason(err error) error {
	var ae *fairgo.ArgError
	if errors.As(err, &ae) {
		return &reasonError{text: ae.Reason, err: err}
	}
	return err
}

// reasonError has a text of its own and wraps err.
type reasonError struct {
	text string
	err  error
}

func (e *reasonError) Error() string { return e.text }
func (e *reasonError) Unwrap() error { return e.err }

// DType is a check for Choice: s must name an element type
// (fairgo.ParseDType's names and aliases) and, with allowed, one of them.
// Its error lists the valid names.
func DType(allowed ...fairgo.DType) func(s string) error {
	if len(allowed) == 0 {
		allowed = fairgo.DTypes
	}
	names := make([]string, len(allowed))
	for i, d := range allowed {
		names[i] = d.String()
	}
	return func(s string) error {
		d, err := fairgo.ParseDType(s)
		if err == nil {
			for _, a := range allowed {
				if d == a {
					return nil
				}
			}
		}
		return &reasonError{text: "not one of " + strings.Join(names, ", "), err: fairgo.ErrUnknownDType}
	}
}

// Op is a check for Choice: s must name a reduction (fairgo.ParseOp's
// names and aliases). Its error lists the valid names.
func Op(s string) error {
	if _, err := fairgo.ParseOp(s); err != nil {
		names := make([]string, len(fairgo.Ops))
		for i, o := range fairgo.Ops {
			names[i] = o.String()
		}
		return &reasonError{text: "not one of " + strings.Join(names, ", "), err: fairgo.ErrUnknownOp}
	}
	return nil
}
