package hier

// fifo is a queue that pops from the front in constant time: a ring over a
// slice that doubles when full, so that a steady run of calls in flight
// neither moves the others at each completion nor allocates. The watcher's
// queue and the in-flight set are fifos: calls complete oldest first, and
// with twenty back to back, shifting the rest at each completion (with the
// garbage collector's write barriers on every moved pointer) was a tenth of
// a call's host time on the null device.
//
// Invariant: n ≤ len(buf), and element i (from the front) is at
// buf[(head+i) % len(buf)]; the slots outside those n are zero, so that the
// queue keeps nothing it no longer holds alive.
type fifo[T any] struct {
	buf  []T
	head int
	n    int
}

// Len is how many elements the queue holds.
func (q *fifo[T]) Len() int { return q.n }

// At is element i, counted from the front (0 ≤ i < Len).
func (q *fifo[T]) At(i int) T { return q.buf[q.index(i)] }

// Front is the oldest element (Len > 0).
func (q *fifo[T]) Front() T { return q.buf[q.head] }

// Push appends v at the back.
func (q *fifo[T]) Push(v T) {
	if q.n == len(q.buf) {
		grown := make([]T, max(2*len(q.buf), 8))
		for i := range q.n {
			grown[i] = q.At(i)
		}
		q.buf, q.head = grown, 0
	}
	q.buf[q.index(q.n)] = v
	q.n++
}

// PopFront removes the oldest element (Len > 0).
func (q *fifo[T]) PopFront() {
	var zero T
	q.buf[q.head] = zero
	q.head = q.index(1)
	q.n--
}

// Remove removes element i (0 ≤ i < Len), moving the later ones forward.
func (q *fifo[T]) Remove(i int) {
	if i == 0 {
		q.PopFront()
		return
	}
	for ; i < q.n-1; i++ {
		q.buf[q.index(i)] = q.buf[q.index(i+1)]
	}
	var zero T
	q.buf[q.index(q.n-1)] = zero
	q.n--
}

func (q *fifo[T]) index(i int) int {
	i += q.head
	if i >= len(q.buf) {
		i -= len(q.buf)
	}
	return i
}
