package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Load is what one method cost the hosts beside its time, per timed unit:
// the CPU time of every process of the job (their NCCL proxy and socket
// threads included) and the TCP segments the job's network namespaces sent
// and retransmitted. On the emulated testbed both tell a pipeline's costs
// apart from the links': a CPU-bound socket transport, or TCP losing
// packets in a shaped NIC's queue.
type Load struct {
	CPUSeconds float64 `json:"cpu_s"`        // user + system, summed over processes
	TCPOutSegs float64 `json:"tcp_out_segs"` // segments sent, summed over network namespaces
	TCPRetrans float64 `json:"tcp_retrans"`  // segments retransmitted, likewise
	// retransmission timeouts, likewise: the losses no duplicate ACK
	// repaired, each a stall of at least the route's rto_min
	TCPTimeouts float64 `json:"tcp_timeouts"`
	// RunDelay is how long the processes' threads were runnable but
	// waited for a CPU (Linux's schedstat), summed over processes: more
	// threads wanting to run than the host has CPUs.
	RunDelay    float64 `json:"run_delay_s"`
	Namespaces  int     `json:"netns,omitempty"` // distinct network namespaces counted
	Unavailable string  `json:"unavailable,omitempty"`
}

// hostSample is one process's counters at one moment.
type hostSample struct {
	cpu, runDelay              time.Duration
	outSegs, retrans, timeouts int64
	netns                      string // the network namespace's identity; "" when unreadable
	err                        string
}

// sampleHost reads this process's CPU time and its network namespace's TCP
// counters.
func sampleHost() hostSample {
	var s hostSample
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	} else {
		s.err = "getrusage: " + err.Error()
	}
	s.runDelay = runDelay()
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		s.err = "network namespace: " + err.Error()
		return s
	}
	snmp, err := os.ReadFile("/proc/self/net/snmp")
	if err != nil {
		s.err = "tcp counters: " + err.Error()
		return s
	}
	tcp, err := parseCounters("/proc/net/snmp", snmp, "Tcp", "OutSegs", "RetransSegs")
	if err != nil {
		s.err = err.Error()
		return s
	}
	netstat, err := os.ReadFile("/proc/self/net/netstat")
	if err != nil {
		s.err = "tcp counters: " + err.Error()
		return s
	}
	ext, err := parseCounters("/proc/net/netstat", netstat, "TcpExt", "TCPTimeouts")
	if err != nil {
		s.err = err.Error()
		return s
	}
	s.netns, s.outSegs, s.retrans, s.timeouts = ns, tcp[0], tcp[1], ext[0]
	return s
}

// runDelay sums how long this process's threads have waited for a CPU
// while runnable (the second field of /proc/self/task/*/schedstat); 0
// where the system does not say.
func runDelay() time.Duration {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread has exited
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				sum += time.Duration(ns)
			}
		}
	}
	return sum
}

// parseCounters reads the named counters of section from text, a
// /proc/net/snmp or /proc/net/netstat (per section a line of names, then
// one of values, both starting "Section:"); file names it for errors.
func parseCounters(file string, text []byte, section string, names ...string) ([]int64, error) {
	var header []string
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != section+":" {
			continue
		}
		if header == nil {
			header = f[1:]
			continue
		}
		vals := f[1:]
		out := make([]int64, len(names))
		for j, n := range names {
			i := slices.Index(header, n)
			if i < 0 || i >= len(vals) {
				return nil, fmt.Errorf("bench: %s has no %s %s", file, section, n)
			}
			v, err := strconv.ParseInt(vals[i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("bench: %s %s: %w", file, n, err)
			}
			out[j] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("bench: %s has no %s lines", file, section)
}

// hostDelta is one process's counters over one method's timed units.
type hostDelta struct {
	CPU      float64 `json:"c"` // seconds
	RunDelay float64 `json:"d"` // seconds
	Out      int64   `json:"o"`
	Retrans  int64   `json:"r"`
	RTOs     int64   `json:"t"`
	NetNS    string  `json:"n,omitempty"`
	Err      string  `json:"e,omitempty"`
}

// add accumulates e into d (one method's repetitions).
func (d hostDelta) add(e hostDelta) hostDelta {
	if d.Err == "" {
		d.Err = e.Err
	}
	if d.NetNS != "" && e.NetNS != d.NetNS && d.Err == "" {
		d.Err = "the network namespace changed"
	}
	d.CPU += e.CPU
	d.RunDelay += e.RunDelay
	d.Out += e.Out
	d.Retrans += e.Retrans
	d.RTOs += e.RTOs
	d.NetNS = e.NetNS
	return d
}

func (a hostSample) until(b hostSample) hostDelta {
	d := hostDelta{
		CPU:      (b.cpu - a.cpu).Seconds(),
		RunDelay: max(b.runDelay-a.runDelay, 0).Seconds(),
		Out:      b.outSegs - a.outSegs,
		Retrans:  b.retrans - a.retrans,
		RTOs:     b.timeouts - a.timeouts,
		NetNS:    b.netns,
	}
	switch {
	case a.err != "":
		d.Err = a.err
	case b.err != "":
		d.Err = b.err
	case a.netns != b.netns:
		d.Err = "the network namespace changed"
	}
	return d
}

// sumLoad adds the processes' deltas for units timed units: CPU over every
// process, TCP counters once per network namespace (the processes of one
// emulated machine share it; the largest of their readings counts).
func sumLoad(ds []hostDelta, units int) *Load {
	l := &Load{}
	perNS := map[string]hostDelta{}
	for _, d := range ds {
		if d.Err != "" {
			l.Unavailable = d.Err
			continue
		}
		l.CPUSeconds += d.CPU
		l.RunDelay += d.RunDelay
		if p, ok := perNS[d.NetNS]; !ok || d.Out > p.Out {
			perNS[d.NetNS] = d
		}
	}
	for _, d := range perNS {
		l.TCPOutSegs += float64(d.Out)
		l.TCPRetrans += float64(d.Retrans)
		l.TCPTimeouts += float64(d.RTOs)
	}
	l.Namespaces = len(perNS)
	u := float64(max(units, 1))
	l.CPUSeconds /= u
	l.RunDelay /= u
	l.TCPOutSegs /= u
	l.TCPRetrans /= u
	l.TCPTimeouts /= u
	return l
}

// HostUS is where the ranks' host time went, in µs per timed call, the
// mean over ranks: what a call costs the thread that makes it, beside the
// device time the record's TimeUS reports.
type HostUS struct {
	// Enqueue is the time spent in the method's calls themselves, up to
	// the return of its last one: validation, routing and the launches.
	Enqueue float64 `json:"enqueue"`
	// Settle is from the device work seen done (the timer's end event) to
	// the method's completion seen by its caller (fairgo's Works; nothing
	// for NCCL's calls, which a stream's end completes): how late a call's
	// end reaches the training loop. SettleMax is the same for the rank
	// that waited longest.
	Settle    float64 `json:"settle"`
	SettleMax float64 `json:"settle_max"`
	// Round is the whole host time of a call: enqueue, the wait for the
	// device, settle and the loop around them.
	Round float64 `json:"round"`
	// StartSkew is how far apart the ranks started a round (the latest
	// start less the earliest), and ReturnSkew how far apart their calls
	// of the round returned: the mean over rounds and the 90th percentile.
	// A collective ends no sooner than its last rank's launch, so a skew
	// is time every other rank waits. Only where every rank's process
	// read one clock (one host, as on fairrun's testbed); rounds past the
	// first skewRounds of a repetition are not counted.
	StartSkew     float64 `json:"start_skew,omitempty"`
	StartSkewP90  float64 `json:"start_skew_p90,omitempty"`
	ReturnSkew    float64 `json:"return_skew,omitempty"`
	ReturnSkewP90 float64 `json:"return_skew_p90,omitempty"`
	// SeenSkew is how far apart the ranks saw a round's device work done,
	// likewise: the part of StartSkew that is not the settle's.
	SeenSkew    float64 `json:"seen_skew,omitempty"`
	SeenSkewP90 float64 `json:"seen_skew_p90,omitempty"`
	// SettleP99 is the 99th percentile of a round's settle, for the rank
	// whose is largest: the rare late completions a mean hides.
	SettleP99 float64 `json:"settle_p99,omitempty"`
}

// skewRounds is how many rounds of each repetition keep their times for
// the skews.
const skewRounds = 256

// hostTimes is one local rank's host time over one method's timed rounds,
// in seconds, summed.
type hostTimes struct {
	Enqueue float64 `json:"e"`
	Settle  float64 `json:"s"`
	Round   float64 `json:"r"`
	// Starts and Returns are the first skewRounds rounds' start and the
	// return of their calls (Unix ns), each repetition's after the last.
	Starts  []int64 `json:"ts,omitempty"`
	Returns []int64 `json:"tr,omitempty"`
	// Seens are when those rounds' device work was seen done (Unix ns),
	// Settles how long their completion then took to reach the caller (ns).
	Seens   []int64 `json:"tn,omitempty"`
	Settles []int64 `json:"tw,omitempty"`
}

// enqueued counts round's time from called to now as enqueueing, and
// keeps the round's start and now for the skews.
func (h *hostTimes) enqueued(round int, start, called time.Time) {
	now := time.Now()
	h.Enqueue += now.Sub(called).Seconds()
	if round < skewRounds {
		h.Starts = append(h.Starts, start.UnixNano())
		h.Returns = append(h.Returns, now.UnixNano())
	}
}

// round counts one round that started at start, whose device work was seen
// done at ran and its completion at end.
func (h *hostTimes) round(round int, start, ran, end time.Time) {
	h.Settle += end.Sub(ran).Seconds()
	h.Round += end.Sub(start).Seconds()
	if round < skewRounds {
		h.Seens = append(h.Seens, ran.UnixNano())
		h.Settles = append(h.Settles, end.Sub(ran).Nanoseconds())
	}
}

// addHostTimes adds b into a, rank by rank (a may be nil).
func addHostTimes(a, b []hostTimes) []hostTimes {
	if a == nil {
		a = make([]hostTimes, len(b))
	}
	for i := range min(len(a), len(b)) {
		a[i].Enqueue += b[i].Enqueue
		a[i].Settle += b[i].Settle
		a[i].Round += b[i].Round
		a[i].Starts = append(a[i].Starts, b[i].Starts...)
		a[i].Returns = append(a[i].Returns, b[i].Returns...)
		a[i].Seens = append(a[i].Seens, b[i].Seens...)
		a[i].Settles = append(a[i].Settles, b[i].Settles...)
	}
	return a
}

// hostPerCall is the HostUS of the ranks' sums hs over calls timed calls
// each, with the skews where oneClock; nil when there is none.
func hostPerCall(hs []hostTimes, calls int, oneClock bool) *HostUS {
	if len(hs) == 0 || calls <= 0 {
		return nil
	}
	var h HostUS
	per := 1e6 / float64(calls)
	for _, t := range hs {
		h.Enqueue += t.Enqueue * per
		h.Settle += t.Settle * per
		h.SettleMax = max(h.SettleMax, t.Settle*per)
		h.Round += t.Round * per
	}
	n := float64(len(hs))
	h.Enqueue /= n
	h.Settle /= n
	h.Round /= n
	if oneClock {
		h.StartSkew, h.StartSkewP90 = skew(hs, func(t hostTimes) []int64 { return t.Starts })
		h.ReturnSkew, h.ReturnSkewP90 = skew(hs, func(t hostTimes) []int64 { return t.Returns })
		h.SeenSkew, h.SeenSkewP90 = skew(hs, func(t hostTimes) []int64 { return t.Seens })
	}
	for _, t := range hs {
		if n := len(t.Settles); n > 0 {
			s := slices.Sorted(slices.Values(t.Settles))
			h.SettleP99 = max(h.SettleP99, float64(s[(n*99)/100])/1e3)
		}
	}
	return &h
}

// skew is the mean and the 90th percentile over rounds of how far apart
// the ranks' times of(h) of a round are, in µs; zeros unless every rank
// has the same number of rounds and one at least.
func skew(hs []hostTimes, of func(hostTimes) []int64) (mean, p90 float64) {
	n := len(of(hs[0]))
	for _, h := range hs {
		if len(of(h)) != n {
			return 0, 0
		}
	}
	if n == 0 || len(hs) < 2 {
		return 0, 0
	}
	spreads := make([]float64, n)
	for j := range n {
		lo, hi := of(hs[0])[j], of(hs[0])[j]
		for _, h := range hs[1:] {
			lo, hi = min(lo, of(h)[j]), max(hi, of(h)[j])
		}
		spreads[j] = float64(hi-lo) / 1e3
		mean += spreads[j]
	}
	slices.Sort(spreads)
	return mean / float64(n), spreads[(n*9)/10]
}
