package report

import (
	"fmt"
	"strings"

	"github.com/fairgo/fairgo/bench"
	"github.com/fairgo/fairgo/internal/harness"
)

// The S targets measure fairgo across node counts: on one machine of four
// GPUs (1 × 4), on fairrun's testbed over real NVLink with 10 Gbit/s NICs
// (2 × 2, and 2 to 16 machines of one rank each, several ranks sharing a
// GPU under MPS from 8 × 1 on), and on the one-GPU testbed (2 × 2, 2 × 4,
// 4 × 2, loopback standing in for NVLink). Every "best" is the fastest of
// the baselines measured at the point (bench.Baselines: flat, flat-ring,
// flat-tree, naive). Their worst points name the testbed they were
// measured on, since layouts of several testbeds meet in one target.

// nodeGbit is the NIC rate of the S targets' testbed layouts.
const nodeGbit = 10

// slackUS is how much slower than the best S1 lets fairgo be per call where
// the ratio misses: on one machine fairgo is one flat allreduce, and below
// a few hundred microseconds its engine's hand-off is the whole gap.
const slackUS = 5

// nodeSweeps keeps the float32 sweeps of m × d on the testbed with NICs of
// gbit Gbit/s whose intra-machine link is real (one rank per machine, or
// GPU to GPU).
func nodeSweeps(m, d int, gbit float64) func(bench.Record) bool {
	on := sweepOn(m, d, true, []string{"float32"}, 0, 1<<62, anyIters)
	return func(r bench.Record) bool {
		return on(r) && r.Testbed.NICGbit == gbit && (d == 1 || r.Testbed.Intra != harness.IntraLoopback)
	}
}

// sizes keeps what keep keeps of sizes lo–hi.
func sizes(keep func(bench.Record) bool, lo, hi int64) func(bench.Record) bool {
	return func(r bench.Record) bool { return keep(r) && r.Bytes >= lo && r.Bytes <= hi }
}

// oneMachine keeps the float32 sweeps of 1 × d over a real intra-machine
// link, in one process or under a launcher.
func oneMachine(d int) func(bench.Record) bool {
	return func(r bench.Record) bool {
		return r.Kind == bench.KindSweep && r.Machines == 1 && r.Devices == d && r.DType == "float32" &&
			r.Testbed.Intra != harness.IntraLoopback
	}
}

// oneGPUSweeps keeps the float32 sweeps of m × d on the one-GPU testbed
// (the intra-machine link loopback TCP), at any NIC rate.
func oneGPUSweeps(m, d int) func(bench.Record) bool {
	on := sweepOn(m, d, true, []string{"float32"}, 0, 1<<62, anyIters)
	return func(r bench.Record) bool { return on(r) && r.Testbed.Intra == harness.IntraLoopback }
}

// bestDetail names the times a ratio against the best compares.
func bestDetail(p point, v string) string {
	name, t := p.best()
	if name == "" {
		return ""
	}
	return fmt.Sprintf("%s %s µs, best %s %s µs", v, fmtTime(p.time(v)), name, fmtTime(t))
}

// naiveDetail names the times a ratio against naive compares.
func naiveDetail(p point, v string) string {
	return fmt.Sprintf("%s %s µs, naive %s µs", v, fmtTime(p.time(v)), fmtTime(p.time(bench.Naive)))
}

// noCheckDetail names the times S6 compares.
func noCheckDetail(p point, v string) string {
	return fmt.Sprintf("%s %s µs, %s %s µs", v, fmtTime(p.time(v)), NoCheckVariant, fmtTime(p.time(NoCheckVariant)))
}

// withinSlack: fairgo at most slackUS slower per call than the best.
func withinSlack(p point, v string) bool {
	_, best := p.best()
	return p.time(v)-best <= slackUS
}

// testbedOf describes the testbed of a record for a target's worst point:
// the layout, and where it was emulated its NICs, intra-machine link,
// ranks per GPU and MPS.
func testbedOf(r bench.Record) string {
	tb := r.Testbed
	s := fmt.Sprintf("%d×%d", r.Machines, r.Devices)
	if !tb.Emulated() {
		if r.Processes > 1 {
			return s + ", one machine, one rank per process"
		}
		return s + ", one process"
	}
	parts := []string{s + " on the testbed"}
	if tb.NICGbit > 0 {
		parts = append(parts, fmt.Sprintf("%g Gbit/s NIC per machine", tb.NICGbit))
	}
	if tb.Intra != "" && r.Devices > 1 {
		intra := "intra " + tb.Intra
		if tb.NVLinkGbit > 0 {
			intra += fmt.Sprintf(" at %g Gbit/s", tb.NVLinkGbit)
		}
		parts = append(parts, intra)
	}
	if tb.RanksPerGPU > 0 {
		parts = append(parts, fmt.Sprintf("%d rank(s) per GPU", tb.RanksPerGPU))
	}
	if tb.MPS {
		parts = append(parts, "MPS")
	}
	return strings.Join(parts, ", ")
}

// nodeDefs are the S targets over fairbench's records (S7, the training
// runs, is hookTarget).
func nodeDefs() []targetDef {
	layouts := func(ls [][2]int, what func(m, d int) requirement) []requirement {
		var out []requirement
		for _, l := range ls {
			out = append(out, what(l[0], l[1]))
		}
		return out
	}
	vsBestOn := func(m, d int) requirement {
		return requirement{name: fmt.Sprintf("%d×%d at %d Gbit/s", m, d, nodeGbit),
			keep: nodeSweeps(m, d, nodeGbit), ratio: vsBest, detail: bestDetail}
	}
	var s4 []requirement
	for _, l := range [][2]int{{2, 2}, {2, 4}, {4, 2}} {
		name := fmt.Sprintf("%d×%d on one GPU", l[0], l[1])
		s4 = append(s4,
			requirement{name: name + ", fairgo/naive at 64M–256M", keep: sizes(oneGPUSweeps(l[0], l[1]), 64*mib, 256*mib),
				ratio: vsNaive, threshold: 1.05, detail: naiveDetail},
			requirement{name: name + ", fairgo/best at 1M–256M", keep: sizes(oneGPUSweeps(l[0], l[1]), mib, 256*mib),
				ratio: vsBest, detail: bestDetail})
	}
	return []targetDef{
		{
			id: "S1",
			what: fmt.Sprintf("1 × 4 (NVLink): fairgo/best at every size, or at most %d µs per call slower than the best",
				slackUS),
			target:    fmt.Sprintf("≥ 0.97, or ≤ %d µs slower", slackUS),
			atLeast:   true,
			threshold: 0.97,
			testbed:   true,
			parts: []requirement{{name: "1×4", keep: oneMachine(4), ratio: vsBest, detail: bestDetail,
				slack: withinSlack}},
		},
		{
			id:        "S2",
			what:      "testbed 2 × 2 and 4 × 1 over NVLink, 10 Gbit/s NICs: fairgo/best at every size",
			target:    "≥ 0.97",
			atLeast:   true,
			threshold: 0.97,
			testbed:   true,
			parts:     layouts([][2]int{{2, 2}, {4, 1}}, vsBestOn),
		},
		{
			id:        "S3",
			what:      "testbed 8 × 1 and 16 × 1 (ranks sharing GPUs under MPS), 10 Gbit/s NICs: fairgo/best at every size",
			target:    "≥ 0.97",
			atLeast:   true,
			threshold: 0.97,
			testbed:   true,
			parts:     layouts([][2]int{{8, 1}, {16, 1}}, vsBestOn),
		},
		{
			id: "S4",
			what: "one GPU, 2 × 2, 2 × 4, 4 × 2 (loopback for NVLink): fairgo/naive at 64M–256M " +
				"and fairgo/best at every size 1M–256M",
			target:    "fairgo/naive ≥ 1.05 at 64M–256M; fairgo/best ≥ 0.97 at 1M–256M",
			atLeast:   true,
			threshold: 0.97,
			testbed:   true,
			parts:     s4,
		},
		{
			id:        "S5",
			what:      "testbed 8 × 1 and 16 × 1, 10 Gbit/s NICs: fairgo/best at its best size in 64K–1M",
			target:    "≥ 1.2 at some size",
			atLeast:   true,
			threshold: 1.2,
			some:      true,
			testbed:   true,
			parts: layouts([][2]int{{8, 1}, {16, 1}}, func(m, d int) requirement {
				r := vsBestOn(m, d)
				r.name += ", 64K–1M"
				r.keep = sizes(r.keep, 64*kib, mib)
				return r
			}),
		},
		{
			id: "S6",
			what: "every point measured with the nocheck variant (-fairgo nocheck=check:off,routes:fairgo): " +
				"fairgo with the check / without it",
			target:    "≥ 0.98",
			atLeast:   true,
			threshold: 0.98,
			testbed:   true,
			parts: []requirement{{name: "every point with nocheck", keep: func(r bench.Record) bool {
				return r.Kind != bench.KindLink
			}, ratio: vsNoCheck, detail: noCheckDetail}},
		},
		{
			id: "S8",
			what: "64 buckets × 25 MiB back to back, every layout measured: time(best)/time(fairgo), " +
				"on the one-GPU testbed and over NVLink",
			target:    "≥ 1.10 on one GPU, ≥ 0.98 over NVLink",
			atLeast:   true,
			threshold: 1.10,
			testbed:   true,
			parts: []requirement{
				{name: "64×25M back to back on one GPU", keep: buckets64x25M(true), ratio: vsBest, detail: bestDetail},
				{name: "64×25M back to back over NVLink", keep: buckets64x25M(false), ratio: vsBest, detail: bestDetail,
					threshold: 0.98},
			},
		},
	}
}

// buckets64x25M keeps the overlap records of 64 buckets of 25 MiB on the
// one-GPU testbed (loopback inside a machine) or off it.
func buckets64x25M(oneGPU bool) func(bench.Record) bool {
	return func(r bench.Record) bool {
		return r.Kind == bench.KindOverlap && r.Buckets == 64 && r.Bytes == 25*mib &&
			(r.Testbed.Intra == harness.IntraLoopback) == oneGPU
	}
}
