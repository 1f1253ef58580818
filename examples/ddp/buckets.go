package main

import (
	"fmt"
	"slices"
)

// Param is one parameter tensor: Len elements at Offset in the model's flat
// parameter (and gradient) vector.
type Param struct {
	Name   string
	Layer  int // the layer whose backward pass produces its gradient
	Offset int
	Len    int
}

// Bucket is a run of consecutive parameters whose gradients are reduced by
// one allreduce: elements [Lo, Hi) of the flat gradient vector.
type Bucket struct {
	Params []int // indices into the parameter list, ascending
	Lo, Hi int
	// Layer is the lowest layer among the bucket's parameters: the bucket
	// is ready once the backward pass has finished that layer.
	Layer int
}

// Len is the number of elements in the bucket.
func (b Bucket) Len() int { return b.Hi - b.Lo }

// AssignBuckets groups params into buckets the way PyTorch's
// DistributedDataParallel does: in reverse order (the order in which the
// backward pass produces the gradients), filling each bucket with as many
// parameters as fit in capBytes (elemSize bytes per element). A parameter
// larger than capBytes gets a bucket of its own; a parameter is never split.
//
// params must tile the flat vector: each starts where the previous one
// ends, from offset 0, so that every bucket is one contiguous range.
func AssignBuckets(params []Param, elemSize int, capBytes int64) ([]Bucket, error) {
	if elemSize <= 0 {
		return nil, fmt.Errorf("buckets: element size %d must be positive", elemSize)
	}
	if capBytes <= 0 {
		return nil, fmt.Errorf("buckets: bucket size %d bytes must be positive", capBytes)
	}
	next := 0
	for i, p := range params {
		if p.Len <= 0 || p.Offset != next {
			return nil, fmt.Errorf(
				"buckets: parameter %d (%s) at offset %d of %d elements: "+
					"parameters must be non-empty and consecutive from 0 (want offset %d)",
				i,
				p.Name,
				p.Offset,
				p.Len,
				next,
			)
		}
		next += p.Len
	}
	var out []Bucket
	var cur *Bucket
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		if cur != nil && int64(cur.Len()+p.Len)*int64(elemSize) > capBytes {
			cur = nil
		}
		if cur == nil {
			out = append(out, Bucket{Lo: p.Offset, Hi: p.Offset + p.Len, Layer: p.Layer})
			cur = &out[len(out)-1]
		}
		cur.Params = append(cur.Params, i)
		cur.Lo = p.Offset
		cur.Layer = min(cur.Layer, p.Layer)
	}
	for _, b := range out {
		slices.Sort(b.Params)
	}
	return out, nil
}
