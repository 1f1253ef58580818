package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
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
	// that waited longest, SettleP99 the 99th percentile of a round's
	// settle for the rank whose is largest: the rare late completions a
	// mean hides.
	Settle    float64 `json:"settle"`
	SettleMax float64 `json:"settle_max"`
	SettleP99 float64 `json:"settle_p99,omitempty"`
	// Round is the whole host time of a call: enqueue, the wait for the
	// device, settle and the loop around them.
	Round float64 `json:"round"`
	// StartSkew is how far apart the ranks started a round (the latest
	// start less the earliest), SeenSkew how far apart they saw its device
	// work done, and ReturnSkew how far apart their calls of the round
	// returned: the mean over rounds and the 90th percentile. A collective
	// ends no sooner than its last rank's launch, so a skew is time every
	// other rank waits. Only where every rank's process read one clock
	// (one host, as on fairrun's testbed); rounds past the first
	// skewRounds of a repetition are not counted.
	StartSkew     float64 `json:"start_skew,omitempty"`
	StartSkewP90  float64 `json:"start_skew_p90,omitempty"`
	SeenSkew      float64 `json:"seen_skew,omitempty"`
	SeenSkewP90   float64 `json:"seen_skew_p90,omitempty"`
	ReturnSkew    float64 `json:"return_skew,omitempty"`
	ReturnSkewP90 float64 `json:"return_skew_p90,omitempty"`
}

// skewRounds is how many rounds of each repetition keep their times for
// the skews and the settle's percentile.
const skewRounds = 128

// The moments of a kept round, in roundSpans and hostTimes.moments.
const (
	momentStart  = iota // the round started
	momentSeen          // its device work was seen done
	momentReturn        // its calls returned
	numMoments
)

// hostTimes is one local rank's host time over one method's timed rounds,
// in seconds, summed; its per-round times stay in the process.
type hostTimes struct {
	Enqueue   float64 `json:"e"`
	Settle    float64 `json:"s"`
	Round     float64 `json:"r"`
	SettleP99 float64 `json:"p,omitempty"` // µs, set by spansOf

	// moments are the first skewRounds rounds' moments (Unix ns), each
	// repetition's after the last; settles those rounds' settle (ns).
	moments [numMoments][]int64
	settles []int64
}

// enqueued counts round's time from called to now as enqueueing, and
// keeps the round's start and now.
func (h *hostTimes) enqueued(round int, start, called time.Time) {
	now := time.Now()
	h.Enqueue += now.Sub(called).Seconds()
	if round < skewRounds {
		h.moments[momentStart] = append(h.moments[momentStart], start.UnixNano())
		h.moments[momentReturn] = append(h.moments[momentReturn], now.UnixNano())
	}
}

// round counts one round that started at start, whose device work was seen
// done at ran and its completion at end.
func (h *hostTimes) round(round int, start, ran, end time.Time) {
	h.Settle += end.Sub(ran).Seconds()
	h.Round += end.Sub(start).Seconds()
	if round < skewRounds {
		h.moments[momentSeen] = append(h.moments[momentSeen], ran.UnixNano())
		h.settles = append(h.settles, end.Sub(ran).Nanoseconds())
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
		for m := range a[i].moments {
			a[i].moments[m] = append(a[i].moments[m], b[i].moments[m]...)
		}
		a[i].settles = append(a[i].settles, b[i].settles...)
	}
	return a
}

// roundSpans is what a process tells of its ranks' kept rounds of one
// method: for each moment and round, the earliest (Lo) and the latest (Hi)
// of its ranks, in µs after Base (Unix ns). Two numbers a round whatever
// the ranks a process drives, so that the results stay small.
type roundSpans struct {
	Base int64               `json:"b"`
	Lo   [numMoments][]int32 `json:"l"`
	Hi   [numMoments][]int32 `json:"h"`
}

// spansOf sets each rank's SettleP99 and returns the process's spans of
// hs; nil where the ranks kept different numbers of rounds.
func spansOf(hs []hostTimes) *roundSpans {
	for i := range hs {
		if n := len(hs[i].settles); n > 0 {
			s := slices.Sorted(slices.Values(hs[i].settles))
			hs[i].SettleP99 = float64(s[(n*99)/100]) / 1e3
		}
	}
	if len(hs) == 0 || len(hs[0].moments[momentStart]) == 0 {
		return nil
	}
	sp := &roundSpans{Base: hs[0].moments[momentStart][0]}
	for m := range numMoments {
		n := len(hs[0].moments[m])
		for _, h := range hs {
			if len(h.moments[m]) != n {
				return nil
			}
			sp.Base = min(sp.Base, slices.Min(h.moments[m]))
		}
	}
	for m := range numMoments {
		for _, h := range hs {
			if slices.Max(h.moments[m])-sp.Base >= math.MaxInt32*1e3 {
				return nil // over 35 minutes: beyond µs in an int32
			}
		}
	}
	us := func(t int64) int32 { return int32((t - sp.Base) / 1e3) }
	for m := range numMoments {
		for j := range hs[0].moments[m] {
			lo, hi := hs[0].moments[m][j], hs[0].moments[m][j]
			for _, h := range hs[1:] {
				lo, hi = min(lo, h.moments[m][j]), max(hi, h.moments[m][j])
			}
			sp.Lo[m] = append(sp.Lo[m], us(lo))
			sp.Hi[m] = append(sp.Hi[m], us(hi))
		}
	}
	return sp
}

// hostPerCall is the HostUS of the ranks' sums hs over calls timed calls
// each, with the skews of the processes' spans where they read one clock
// (nil spans: none); nil when there is no rank.
func hostPerCall(hs []hostTimes, calls int, spans []*roundSpans) *HostUS {
	if len(hs) == 0 || calls <= 0 {
		return nil
	}
	var h HostUS
	per := 1e6 / float64(calls)
	for _, t := range hs {
		h.Enqueue += t.Enqueue * per
		h.Settle += t.Settle * per
		h.SettleMax = max(h.SettleMax, t.Settle*per)
		h.SettleP99 = max(h.SettleP99, t.SettleP99)
		h.Round += t.Round * per
	}
	n := float64(len(hs))
	h.Enqueue /= n
	h.Settle /= n
	h.Round /= n
	if len(hs) > 1 {
		h.StartSkew, h.StartSkewP90 = skew(spans, momentStart)
		h.SeenSkew, h.SeenSkewP90 = skew(spans, momentSeen)
		h.ReturnSkew, h.ReturnSkewP90 = skew(spans, momentReturn)
	}
	return &h
}

// skew is the mean and the 90th percentile over rounds of how far apart
// every process's ranks were at moment m of a round, in µs; zeros unless
// every process kept the same number of rounds, one at least.
func skew(spans []*roundSpans, m int) (mean, p90 float64) {
	if len(spans) == 0 || spans[0] == nil {
		return 0, 0
	}
	n := len(spans[0].Lo[m])
	for _, sp := range spans {
		if sp == nil || len(sp.Lo[m]) != n || len(sp.Hi[m]) != n {
			return 0, 0
		}
	}
	if n == 0 {
		return 0, 0
	}
	at := func(sp *roundSpans, v int32) int64 { return sp.Base/1e3 + int64(v) } // µs
	spreads := make([]float64, n)
	for j := range n {
		lo, hi := at(spans[0], spans[0].Lo[m][j]), at(spans[0], spans[0].Hi[m][j])
		for _, sp := range spans[1:] {
			lo, hi = min(lo, at(sp, sp.Lo[m][j])), max(hi, at(sp, sp.Hi[m][j]))
		}
		spreads[j] = float64(hi - lo)
		mean += spreads[j]
	}
	slices.Sort(spreads)
	return mean / float64(n), spreads[(n*9)/10]
}
