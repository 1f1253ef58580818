package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// HookRun is one training run of examples/ddp_torch's ResNet-18 (the file
// its --losses-out writes): DDP with its own allreduce as NCCL chooses,
// with NCCL_ALGO=allreduce:ring or allreduce:tree, or with fairgo's comm
// hook; S7 compares their speed per layout.
type HookRun struct {
	Layout     string  // "1×4": the M×D in the file's name, else the world size
	Method     string  // HookFairgo, or DDP's: "default", "ring", "tree"
	ImagesPerS float64 // training throughput after the warm-up steps
	File       string
}

// HookFairgo is the Method of a run with fairgo's hook.
const HookFairgo = "fairgo"

// The layouts S7 needs, and its bound.
var hookLayouts = []string{"1×4", "2×2"}

const hookThreshold = 0.98

// layoutInName finds "MxD" in a file name such as resnet-2x2-tree.json.
var layoutInName = regexp.MustCompile(`(^|[^0-9])([0-9]+)x([0-9]+)([^0-9]|$)`)

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
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("report: -hook %s: %w", p, err)
		}
		if f.Hook == "" || f.ImagesPerS == nil || f.WorldSize <= 0 {
			return nil, fmt.Errorf("report: -hook %s: not a training run's file (hook, world_size, images_per_s)", p)
		}
		r := HookRun{ImagesPerS: *f.ImagesPerS, File: p, Layout: fmt.Sprintf("%d ranks", f.WorldSize)}
		if m := layoutInName.FindStringSubmatch(filepath.Base(p)); m != nil {
			r.Layout = m[2] + "×" + m[3]
		}
		switch {
		case f.Hook == HookFairgo:
			if (f.Fixed != nil && *f.Fixed != "" && *f.Fixed != "auto") ||
				strings.Contains(filepath.Base(p), "-"+HookFairgo+"-") {
				continue // an algorithm fixed by hand: not what S7 measures
			}
			r.Method = HookFairgo
		case f.NCCLAlgo == nil || *f.NCCLAlgo == "":
			r.Method = "default"
		default:
			r.Method = strings.ToLower(strings.TrimPrefix(*f.NCCLAlgo, "allreduce:"))
		}
		if math.IsNaN(r.ImagesPerS) || r.ImagesPerS <= 0 {
			return nil, fmt.Errorf("report: -hook %s: images/s %v", p, r.ImagesPerS)
		}
		out = append(out, r)
	}
	return out, nil
}

// hookTarget is S7: per layout, fairgo's images/s over the best of DDP's
// own (default, ring, tree); the worst layout.
func hookTarget(runs []HookRun) Target {
	t := Target{
		ID:      "S7",
		What:    "examples/ddp_torch's ResNet-18, 1 × 4 and 2 × 2 (10 Gbit/s): fairgo hook's images/s / best of DDP's allreduce (default, allreduce:ring, allreduce:tree)",
		Target:  fmt.Sprintf("≥ %.2f", hookThreshold),
		Command: []string{"scripts/gpu.sh hook 1x4 2x2 (fairbench targets -hook 'resnet-*.json')"},
	}
	worst, ok := 0.0, false
	for _, l := range hookLayouts {
		var fairgo, best HookRun
		for _, r := range runs {
			if r.Layout != l {
				continue
			}
			if r.Method == HookFairgo {
				fairgo = r
			} else if r.ImagesPerS > best.ImagesPerS {
				best = r
			}
		}
		if fairgo.File == "" || best.File == "" {
			t.Missing = append(t.Missing, l+": fairgo's hook and DDP's allreduce")
			continue
		}
		t.Points++
		x := fairgo.ImagesPerS / best.ImagesPerS
		if !ok || x < worst {
			worst, ok = x, true
			t.Where = fmt.Sprintf("%s: fairgo %.1f images/s, best DDP %s %.1f", l, fairgo.ImagesPerS, best.Method,
				best.ImagesPerS)
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
