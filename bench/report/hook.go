package report

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/fairgo/fairgo/bench"
)

// HookRun is one training run of examples/ddp_torch's ResNet-18 (the file
// its --losses-out writes): DDP with its own allreduce as NCCL chooses,
// with NCCL_ALGO=allreduce:ring or allreduce:tree, or with fairgo's comm
// hook; S7 compares their speed per layout.
type HookRun struct {
	Layout     string  // "1×4": the M×D in the file's name, else the world size
	Method     string  // HookFairgo, or DDP's: "default", "ring", "tree"
	ImagesPerS float64 // training throughput after the warm-up steps
	Round      int     // 1, or K of a file named ….rK.json: the runs of one round ran one after another
	File       string
}

// HookFairgo is the Method of a run with fairgo's hook.
const HookFairgo = "fairgo"

// The layouts S7 needs, and its bound.
var hookLayouts = []string{"1×4", "2×2"}

const hookThreshold = 0.98

// layoutInName finds "MxD" in a file name such as resnet-2x2-tree.json.
var layoutInName = regexp.MustCompile(`(^|[^0-9])([0-9]+)x([0-9]+)([^0-9]|$)`)

// roundInName finds the round K of a repeated run's file, resnet-1x4-default.r2.json.
var roundInName = regexp.MustCompile(`\.r([1-9][0-9]*)\.json$`)

// ParseHookRuns reads the training runs' JSON files. A run of fairgo's hook
// with its algorithm fixed (FAIRGO_ALGORITHM) is not Auto's and is left
// out; a file that is not such a run is an error.
func ParseHookRuns(paths []string) ([]HookRun, error) {
	var out []HookRun
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("report: -hook: %w", err)
		}
		var f struct {
			Hook       string   `json:"hook"`
			WorldSize  int      `json:"world_size"`
			NCCLAlgo   *string  `json:"nccl_algo"`
			Fixed      *string  `json:"fairgo_algorithm"`
			ImagesPerS *float64 `json:"images_per_s"`
			// Rounds is a paired launch's (train_resnet.py --pair):
			// the run's images/s in each round of turns.
			Rounds []float64 `json:"round_images_per_s"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("report: -hook %s: %w", p, err)
		}
		if f.Hook == "" || f.ImagesPerS == nil || f.WorldSize <= 0 {
			return nil, fmt.Errorf("report: -hook %s: not a training run's file (hook, world_size, images_per_s)", p)
		}
		r := HookRun{ImagesPerS: *f.ImagesPerS, File: p, Layout: fmt.Sprintf("%d ranks", f.WorldSize), Round: 1}
		if m := layoutInName.FindStringSubmatch(filepath.Base(p)); m != nil {
			r.Layout = m[2] + "×" + m[3]
		}
		if m := roundInName.FindStringSubmatch(filepath.Base(p)); m != nil {
			r.Round, _ = strconv.Atoi(m[1])
		}
		switch {
		case f.Hook == HookFairgo:
			if (f.Fixed != nil && *f.Fixed != "" && *f.Fixed != "auto") ||
				strings.Contains(filepath.Base(p), "-"+HookFairgo+"-") {
				continue // an algorithm fixed by hand: not what S7 measures
			}
			r.Method = HookFairgo
		case f.Hook != "default":
			continue // another comm hook (PyTorch's own, in Python): none of DDP's settings
		case f.NCCLAlgo == nil || *f.NCCLAlgo == "":
			r.Method = "default"
		default:
			r.Method = strings.ToLower(strings.TrimPrefix(*f.NCCLAlgo, "allreduce:"))
		}
		if math.IsNaN(r.ImagesPerS) || r.ImagesPerS <= 0 {
			return nil, fmt.Errorf("report: -hook %s: images/s %v", p, r.ImagesPerS)
		}
		if len(f.Rounds) == 0 {
			out = append(out, r)
			continue
		}
		// A paired launch: its rounds are S7's rounds, each run's turn of
		// a round beside the others' of the same round.
		for k, ips := range f.Rounds {
			if math.IsNaN(ips) || ips <= 0 {
				return nil, fmt.Errorf("report: -hook %s: round %d's images/s %v", p, k+1, ips)
			}
			rk := r
			rk.Round, rk.ImagesPerS = k+1, ips
			out = append(out, rk)
		}
	}
	return out, nil
}

// hookTarget is S7: per layout, DDP's best setting is the one of its own
// (default, ring, tree) with the highest median images/s over the rounds,
// the setting a user would keep; per round, fairgo's images/s over that
// setting's in the same round; per layout, the median over its rounds (a
// machine's speed drifts by more than the difference within a command, so
// one pair cannot size it); the worst layout. Dividing by each round's
// fastest setting instead would divide by the maximum of three noisy
// samples, an oracle no user has (on one machine, where DDP's three
// settings run the same NCCL allreduce, each of them scored 0.92–0.98
// against it): the where text gives that figure too.
func hookTarget(runs []HookRun) Target {
	t := Target{
		ID:      "S7",
		What:    "examples/ddp_torch's ResNet-18, 1 × 4 and 2 × 2 (10 Gbit/s): fairgo hook's images/s / best of DDP's allreduce (default, allreduce:ring, allreduce:tree), the median over rounds",
		Target:  fmt.Sprintf("≥ %.2f", hookThreshold),
		Command: []string{"HOOK_PAIRED=1 HOOK_STEPS=305 scripts/gpu.sh hook 1x4 2x2 (fairbench targets -hook 'resnet-*.json')"},
	}
	worst, ok := 0.0, false
	for _, l := range hookLayouts {
		rounds := hookRounds(runs, l)
		if len(rounds) == 0 {
			t.Missing = append(t.Missing, l+": fairgo's hook and DDP's allreduce")
			continue
		}
		t.Points++
		ratios := make([]float64, len(rounds))
		for i, p := range rounds {
			ratios[i] = p.ratio()
		}
		x := bench.Median(ratios)
		if !ok || x < worst {
			worst, ok = x, true
			first := rounds[0]
			t.Where = fmt.Sprintf("%s: fairgo %.1f images/s, best DDP %s %.1f", l, first.fairgo.ImagesPerS,
				first.best.Method, first.best.ImagesPerS)
			if len(rounds) > 1 {
				fastest := make([]float64, len(rounds))
				for i, p := range rounds {
					fastest[i] = p.fairgo.ImagesPerS / p.fastest
				}
				t.Where = fmt.Sprintf("%s: median of %d rounds %.3f (%.3f–%.3f) against DDP %s, its best setting over the rounds "+
					"(%.3f against each round's fastest setting); round %d %s", l, len(rounds), x, slices.Min(ratios),
					slices.Max(ratios), first.best.Method, bench.Median(fastest), first.round, strings.TrimPrefix(t.Where, l+": "))
			}
		}
	}
	if ok {
		t.Measured = ptr(worst)
		t.Pass = worst >= hookThreshold && len(t.Missing) == 0
		if worst >= hookThreshold && len(t.Missing) > 0 {
			t.Status = StatusIncomplete
		}
	}
	slices.Sort(t.Missing)
	return t
}

// hookPair is one round of a layout: fairgo's run, the run of DDP's best
// setting (bestSetting) in the same round, and the round's fastest DDP
// images/s, whichever setting gave it.
type hookPair struct {
	round        int
	fairgo, best HookRun
	fastest      float64
}

func (p hookPair) ratio() float64 { return p.fairgo.ImagesPerS / p.best.ImagesPerS }

// hookRounds pairs layout l's runs round by round, in round order, against
// DDP's best setting of the layout; a round without a run of fairgo's hook
// or of that setting is left out.
func hookRounds(runs []HookRun, l string) []hookPair {
	best := bestSetting(runs, l)
	byRound := map[int]*hookPair{}
	for _, r := range runs {
		if r.Layout != l {
			continue
		}
		p := byRound[r.Round]
		if p == nil {
			p = &hookPair{round: r.Round}
			byRound[r.Round] = p
		}
		switch {
		case r.Method == HookFairgo:
			p.fairgo = r
		case r.Method == best && r.ImagesPerS > p.best.ImagesPerS:
			p.best = r
		}
		if r.Method != HookFairgo {
			p.fastest = max(p.fastest, r.ImagesPerS)
		}
	}
	var out []hookPair
	for _, p := range byRound {
		if p.fairgo.File != "" && p.best.File != "" {
			out = append(out, *p)
		}
	}
	slices.SortFunc(out, func(a, b hookPair) int { return a.round - b.round })
	return out
}

// bestSetting is DDP's setting of layout l with the highest median
// images/s over its runs (ties: the higher mean, then the name), "" when
// there is none.
func bestSetting(runs []HookRun, l string) string {
	rates := map[string][]float64{}
	for _, r := range runs {
		if r.Layout == l && r.Method != HookFairgo {
			rates[r.Method] = append(rates[r.Method], r.ImagesPerS)
		}
	}
	best, bestMedian, bestMean := "", 0.0, 0.0
	for _, m := range slices.Sorted(maps.Keys(rates)) {
		med, mean := bench.Median(rates[m]), sum(rates[m])/float64(len(rates[m]))
		if best == "" || med > bestMedian || (med == bestMedian && mean > bestMean) {
			best, bestMedian, bestMean = m, med, mean
		}
	}
	return best
}

func sum(xs []float64) float64 {
	t := 0.0
	for _, x := range xs {
		t += x
	}
	return t
}
