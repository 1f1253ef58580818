package hier

// AbortedComms names the communicators an abort of r ends, in order.
func AbortedComms(r *Reducer) []string {
	var out []string
	for _, c := range r.commList() {
		out = append(out, c.Name())
	}
	return out
}
