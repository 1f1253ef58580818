package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo/bench"
)

var csvHeader = []string{"kind", "run", "label", "link", "backend", "sim_timings", "machines", "devices", "processes",
	"launcher_machines", "nic_gbit", "nic_latency_us", "mps", "netns", "ranks_per_gpu", "intra", "nvlink_gbit",
	"nccl_hosts", "flat_topology_unaware", "invalid",
	"dtype", "op", "algorithm", "fairgo_spec", "fairgo_chosen", "slice_bytes", "parallelism", "flat_threshold",
	"bytes", "count", "buckets", "iters", "reps", "time_us", "min_us", "max_us", "slowest_rank_us", "algbw_gbps", "busbw_gbps",
	"ideal_busbw_gbps", "wrong", "nccl_version", "nccl_env"}

// WriteCSV writes records as CSV with a header line.
func WriteCSV(w io.Writer, recs []bench.Record) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return fmt.Errorf("report: writing CSV: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	b := strconv.FormatBool
	for _, r := range recs {
		var fg bench.FairgoSetup
		if r.Fairgo != nil {
			fg = *r.Fairgo
		}
		tb := r.Testbed
		row := []string{
			r.Kind,
			r.Run,
			r.Label,
			r.Link,
			r.Backend,
			b(r.SimTimings),
			i(int64(r.Machines)),
			i(int64(r.Devices)),
			i(int64(r.Processes)),
			i(
				int64(tb.Machines),
			),
			f(tb.NICGbit),
			f(tb.NICLatency.Seconds() * 1e6),
			b(tb.MPS),
			b(tb.NetNS),
			i(int64(tb.RanksPerGPU)),
			tb.Intra,
			f(tb.NVLinkGbit),
			i(int64(tb.NCCLHosts)),
			b(tb.FlatTopologyUnaware),
			r.Invalid,
			r.DType,
			r.Op,
			r.Algorithm,
			fg.Spec,
			fg.Chosen,
			i(fg.SliceBytes),
			i(int64(fg.Parallelism)),
			i(fg.FlatThreshold),
			i(
				r.Bytes,
			),
			i(r.Count),
			i(int64(r.Buckets)),
			i(int64(r.Iters)),
			i(int64(r.Reps)),
			f(r.TimeUS),
			f(r.MinUS),
			f(r.MaxUS),
			f(r.SlowestRankUS),
			f(r.AlgBW),
			f(r.BusBW),
			f(r.IdealBusBW),
			i(r.Wrong),
			r.NCCLVersion,
			strings.Join(r.NCCLEnv, " "),
		}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("report: writing CSV: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("report: writing CSV: %w", err)
	}
	return nil
}
