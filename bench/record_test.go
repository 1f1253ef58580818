package bench

import (
	"bytes"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBandwidths(t *testing.T) {
	alg, bus := Bandwidths(1e9, 1, 8)
	require.Equal(t, 1.0, alg)
	require.InDelta(t, 1.75, bus, 1e-12)
	_, bus = Bandwidths(1e9, 1, 1)
	require.Zero(t, bus, "one rank")
	a, b := Bandwidths(1e9, 0, 8)
	require.Zero(t, a, "zero time")
	require.Zero(t, b, "zero time")
}

func TestJSONL(t *testing.T) {
	var recs []Record
	for _, a := range []struct {
		alg string
		us  float64
	}{{"flat", 200}, {"naive", 300}, {"fairgo", 100}} {
		r := Record{
			Kind:       KindSweep,
			Run:        "r1",
			Backend:    "sim",
			SimTimings: true,
			Machines:   2,
			Devices:    2,
			DType:      "float32",
			Op:         "sum",
			Algorithm:  a.alg,
			Bytes:      4 << 20,
			Count:      1 << 20,
			TimeUS:     a.us,
			MinUS:      a.us * 0.9,
			MaxUS:      a.us * 1.1,
		}
		r.Testbed.NICGbit, r.Testbed.MPS = 10, true
		if a.alg == "fairgo" {
			r.Fairgo = &FairgoSetup{
				Algorithm: "auto",
				Chosen:    "rail-rsag",
				Choices:   []Choice{{MinBytes: 0, Algorithm: "flat"}, {MinBytes: 256 << 10, Algorithm: "rail-rsag"}},
			}
		}
		r.AlgBW, r.BusBW = Bandwidths(r.Bytes, r.TimeUS/1e6, 4)
		recs = append(recs, r)
	}
	var buf bytes.Buffer
	require.NoError(t, WriteJSONL(&buf, recs))
	prefixed := "[0] " + strings.ReplaceAll(buf.String(), "\n", "\nnoise\n")
	back, err := ReadJSONL(strings.NewReader(prefixed))
	require.NoError(t, err)
	require.Equal(t, recs, back)
	require.False(t, math.IsNaN(back[0].BusBW))
	_, err = ReadJSONL(strings.NewReader("{not json\n"))
	require.Error(t, err)
}

func TestParseTCPCounters(t *testing.T) {
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Tcp: RtoAlgorithm RtoMin OutSegs RetransSegs InErrs\nTcp: 1 200 11288 37 0\nUdp: InDatagrams\nUdp: 5\n"
	got, err := parseCounters("snmp", []byte(snmp), "Tcp", "OutSegs", "RetransSegs")
	require.NoError(t, err)
	require.Equal(t, []int64{11288, 37}, got)
	_, err = parseCounters("snmp", []byte("Tcp: RtoAlgorithm\nTcp: 1\n"), "Tcp", "OutSegs", "RetransSegs")
	require.ErrorContains(t, err, "no Tcp OutSegs")
	_, err = parseCounters("snmp", []byte("Udp: InDatagrams\nUdp: 5\n"), "Tcp", "OutSegs")
	require.ErrorContains(t, err, "no Tcp lines")
	netstat := "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes\nTcpExt: 0 12 3\nIpExt: InNoRoutes\nIpExt: 0\n"
	got, err = parseCounters("netstat", []byte(netstat), "TcpExt", "TCPTimeouts")
	require.NoError(t, err)
	require.Equal(t, []int64{12}, got)
	_, err = parseCounters("netstat", []byte("TcpExt: A B\nTcpExt: 1 x\n"), "TcpExt", "B")
	require.Error(t, err)
}

func TestSumLoadCountsANamespaceOnce(t *testing.T) {
	ds := []hostDelta{
		{CPU: 1, RunDelay: 0.5, Out: 100, Retrans: 2, RTOs: 1, NetNS: "a"},
		{CPU: 2, Out: 90, Retrans: 1, NetNS: "a"}, // the same machine: its larger reading counts
		{CPU: 3, Out: 50, Retrans: 5, RTOs: 2, NetNS: "b"},
	}
	l := sumLoad(ds, 2)
	require.InDelta(t, 3.0, l.CPUSeconds, 1e-12)
	require.InDelta(t, 0.25, l.RunDelay, 1e-12, "summed over processes, per unit")
	require.InDelta(t, 75.0, l.TCPOutSegs, 1e-12)
	require.InDelta(t, 3.5, l.TCPRetrans, 1e-12)
	require.InDelta(t, 1.5, l.TCPTimeouts, 1e-12)
	require.Equal(t, 2, l.Namespaces)
	require.Empty(t, l.Unavailable)
	l = sumLoad([]hostDelta{{Err: "no /proc"}}, 1)
	require.Equal(t, "no /proc", l.Unavailable)
}

// More busy threads than CPUs wait for them: the run delay grows.
func TestSampleHostReadsTheRunDelay(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc/self/task on this system")
	}
	busy := 4 * runtime.NumCPU()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(busy)) // that many threads run Go code at once
	a := sampleHost()
	var wg sync.WaitGroup
	stop := time.Now().Add(200 * time.Millisecond)
	for range busy {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
			}
		}()
	}
	wg.Wait()
	d := a.until(sampleHost())
	require.Greater(t, d.RunDelay, 0.0)
}

func TestSampleHostReadsThisProcess(t *testing.T) {
	a := sampleHost()
	x := 0
	for i := range 20_000_000 { // burn a little CPU
		x += i % 7
	}
	d := a.until(sampleHost())
	require.Empty(t, d.Err)
	require.Greater(t, d.CPU, 0.0, "x=%d", x)
	require.NotEmpty(t, d.NetNS)
}

func TestHostPerCallAveragesRanks(t *testing.T) {
	hs := addHostTimes(nil, []hostTimes{{Enqueue: 1e-3, Settle: 2e-3, Round: 10e-3}, {Enqueue: 3e-3, Settle: 6e-3, Round: 20e-3}})
	hs = addHostTimes(hs, []hostTimes{{Enqueue: 1e-3, Settle: 0, Round: 10e-3}, {Enqueue: 1e-3, Settle: 2e-3, Round: 20e-3}})
	h := hostPerCall(hs, 4, nil)                // two repetitions of two calls
	require.InDelta(t, 0.75e3, h.Enqueue, 1e-9) // (2 + 4) ms over 2 ranks and 4 calls
	require.InDelta(t, 1.25e3, h.Settle, 1e-9)
	require.InDelta(t, 2e3, h.SettleMax, 1e-9) // the second rank: 8 ms over 4 calls
	require.InDelta(t, 7.5e3, h.Round, 1e-9)
	require.Zero(t, h.StartSkew, "no skews without spans")
	require.Nil(t, hostPerCall(nil, 4, nil))
	require.Nil(t, hostPerCall(hs, 0, nil))
}

// keptRounds are one rank's kept rounds: its start, seen and return times
// and its settles, all in µs.
func keptRounds(starts, seens, returns, settles []int64) hostTimes {
	var h hostTimes
	for m, v := range [numMoments][]int64{starts, seens, returns} {
		for _, us := range v {
			h.moments[m] = append(h.moments[m], 1_700_000_000_000_000_000+us*1e3)
		}
	}
	for _, us := range settles {
		h.settles = append(h.settles, us*1e3)
	}
	return h
}

// The skews compare the ranks round by round, across processes: the spread
// of a round's times, its mean over rounds and the 90th percentile. A
// process sends only its ranks' earliest and latest time of each round.
func TestHostSkewsCompareRanksRoundByRound(t *testing.T) {
	ten := func(v ...int64) []int64 { return v }
	same := ten(0, 100, 200, 300, 400, 500, 600, 700, 800, 900)
	r0 := keptRounds(ten(0, 100, 200, 300, 400, 500, 600, 700, 800, 900), same,
		ten(10, 110, 210, 310, 410, 510, 610, 710, 810, 910), ten(1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
	r1 := keptRounds(ten(5, 100, 210, 300, 400, 500, 600, 700, 800, 990), same,
		ten(10, 120, 210, 310, 410, 510, 610, 710, 810, 911), nil)
	r2 := keptRounds(ten(1, 101, 200, 300, 400, 500, 600, 700, 800, 900), same,
		ten(10, 110, 210, 310, 410, 510, 610, 710, 810, 910), ten(2, 2, 2, 2, 2, 2, 2, 2, 2, 50))
	a := []hostTimes{r0, r1} // process a drives ranks 0 and 1
	b := []hostTimes{r2}     // process b rank 2
	spans := []*roundSpans{spansOf(a), spansOf(b)}
	h := hostPerCall(slices.Concat(a, b), 10, spans)
	require.InDelta(t, (5+1+10+90)/10.0, h.StartSkew, 1e-9)
	require.InDelta(t, 90.0, h.StartSkewP90, 1e-9, "the largest of ten rounds' spreads")
	require.InDelta(t, (10+1)/10.0, h.ReturnSkew, 1e-9)
	require.Zero(t, h.SeenSkew, "every rank saw every round done at once")
	require.InDelta(t, 50.0, h.SettleP99, 1e-9, "the largest rank's 99th percentile of ten rounds")

	r1.moments[momentStart] = r1.moments[momentStart][:9] // a rank with fewer rounds: no spans
	require.Nil(t, spansOf([]hostTimes{r0, r1}))
	h = hostPerCall(slices.Concat(a, b), 10, []*roundSpans{nil, spansOf(b)})
	require.Zero(t, h.StartSkew)
	require.Zero(t, hostPerCall(b, 10, spans[1:]).ReturnSkew, "one rank has no spread")
}

func TestOneClock(t *testing.T) {
	require.True(t, oneClock([]rankResult{{Clock: "a"}, {Clock: "a"}}))
	require.False(t, oneClock([]rankResult{{Clock: "a"}, {Clock: "b"}}))
	require.False(t, oneClock([]rankResult{{Clock: ""}}))
	require.False(t, oneClock(nil))
}
