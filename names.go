package fairgo

import "fmt"

// names is the table of an enumeration's names (DType, Op): what String
// prints and the Parse functions read.
type names[T ~int] map[T]string

// has reports whether v is one of the declared values.
func (n names[T]) has(v T) bool { _, ok := n[v]; return ok }

// of is v's name, or kind(v) for an undeclared value.
func (n names[T]) of(v T, kind string) string {
	if s, ok := n[v]; ok {
		return s
	}
	return fmt.Sprintf("%s(%d)", kind, int(v))
}

// parse finds s among the names, then among the aliases.
func (n names[T]) parse(s string, aliases map[string]T) (T, bool) {
	for v, name := range n {
		if name == s {
			return v, true
		}
	}
	v, ok := aliases[s]
	return v, ok
}
