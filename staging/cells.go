package staging

// Cells addresses a [Devices][Machines][N] array of ElemSize-byte elements
// at Base: row d holds the Machines cells of local index d, one per machine.
// A slice of an allreduce, a staging slot and a padding slot are all viewed
// this way.
type Cells struct {
	Base              uintptr
	Devices, Machines int
	N                 int64 // elements per cell
	ElemSize          int64
}

// Cell is the address of cell [d][m].
func (c Cells) Cell(d, m int) uintptr {
	return c.Base + uintptr((int64(d)*int64(c.Machines)+int64(m))*c.N*c.ElemSize)
}

// Row is the address of row [d], Machines cells long.
func (c Cells) Row(d int) uintptr { return c.Cell(d, 0) }

// RowCount is the number of elements in a row, Machines·N.
func (c Cells) RowCount() int64 { return int64(c.Machines) * c.N }

// Bytes is the size of the whole array.
func (c Cells) Bytes() int64 {
	return int64(c.Devices) * c.RowCount() * c.ElemSize
}
