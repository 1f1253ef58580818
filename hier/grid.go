package hier

import "github.com/fairgo/fairgo"

// Grid is the M × D arrangement of ranks and one rank's place in it (the
// root package defines it, so that topology, which computes it, and the
// engine share it without importing each other).
type Grid = fairgo.Grid
