// Package logging is the logger fairgo's packages use when their caller
// gives none (hier.WithLogger(nil), setup.WithLogger(nil), ...): slog's
// default handler behind a minimum level, which the environment variable
// FAIRGO_LOG_LEVEL sets (debug, info, warn or error, in any case) and which
// is warn without it. So a job logs its warnings and errors only, unless
// asked, the way NCCL_DEBUG works for NCCL. The variable is read when the
// logger is made (a Reducer, a setup, a store), never at package
// initialisation. An explicit logger is used as given.
//
// Facts about the whole job (the links measured, each size class's choice)
// are the same on every rank: FactLevel logs them at info on world rank 0
// and at debug on the others, so that a job says each once.
package logging

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// EnvLevel is the environment variable that sets the minimum level of
// Default's logger.
const EnvLevel = "FAIRGO_LOG_LEVEL"

// DefaultLevel is the minimum level where EnvLevel is unset or empty.
const DefaultLevel = slog.LevelWarn

// levels are the values EnvLevel takes, in the order the messages list them.
var levels = []struct {
	name  string
	level slog.Level
}{
	{"debug", slog.LevelDebug},
	{"info", slog.LevelInfo},
	{"warn", slog.LevelWarn},
	{"error", slog.LevelError},
}

// ValidLevels lists the values ParseLevel accepts.
const ValidLevels = "debug, info, warn, error"

// ParseLevel reads a level named debug, info, warn or error, in any case
// and with surrounding spaces ignored.
func ParseLevel(s string) (slog.Level, error) {
	name := strings.ToLower(strings.TrimSpace(s))
	for _, l := range levels {
		if name == l.name {
			return l.level, nil
		}
	}
	return 0, fmt.Errorf("logging: %q is not a log level (%s)", s, ValidLevels)
}

// Default is fairgo's logger for a caller that gave none: slog.Default()'s
// handler as it is now, behind the minimum level FAIRGO_LOG_LEVEL sets in
// the process environment (warn without it, or where it names no level,
// which the logger then warns of once).
func Default() *slog.Logger { return FromEnv(os.LookupEnv) }

// FromEnv is Default with FAIRGO_LOG_LEVEL read through lookup instead of
// the process environment (setup.WithEnv's lookup).
func FromEnv(lookup func(string) (string, bool)) *slog.Logger {
	return New(slog.Default().Handler(), lookup, DefaultLevel)
}

// New is a logger that passes to h the records at or above the level
// FAIRGO_LOG_LEVEL names, read through lookup, or at or above def where it
// is unset or empty. A value that names no level is ignored (def applies),
// and the logger says so, once per process for each such value.
//
// Where the variable names a level, that level alone decides what passes,
// so FAIRGO_LOG_LEVEL=debug shows fairgo's debug lines although slog's
// default handler stops at info; unset, a record must also pass h's own
// level.
func New(h slog.Handler, lookup func(string) (string, bool), def slog.Level) *slog.Logger {
	lh := &handler{inner: h, min: def}
	v, _ := lookup(EnvLevel)
	if strings.TrimSpace(v) == "" {
		return slog.New(lh)
	}
	l, err := ParseLevel(v)
	if err == nil {
		lh.min, lh.set = l, true
		return slog.New(lh)
	}
	log := slog.New(lh)
	if _, seen := warned.LoadOrStore(v, true); !seen {
		log.Warn("fairgo: "+EnvLevel+" names no log level; ignoring it",
			"value", v, "valid", ValidLevels, "level", def.String())
	}
	return log
}

// warned holds the invalid values of EnvLevel already warned of.
var warned sync.Map

// FactLevel is the level of a fact about the whole job, which every rank
// finds alike (the links measured, a size class's choice, a world variant
// made or closed), on the rank of world rank rank: info on rank 0, debug on
// the others. Warnings and errors are not facts: every rank logs its own.
func FactLevel(rank int) slog.Level {
	if rank == 0 {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// handler passes on the records at or above min to inner.
type handler struct {
	inner slog.Handler
	min   slog.Level
	set   bool // min came from EnvLevel: inner's own level does not apply
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && (h.set || h.inner.Enabled(ctx, l))
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), min: h.min, set: h.set}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), min: h.min, set: h.set}
}
