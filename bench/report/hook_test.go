package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// writeRun writes a training run's file as examples/ddp_torch's
// train_resnet.py --losses-out does.
func writeRun(t *testing.T, dir, name string, fields map[string]any) string {
	t.Helper()
	b, err := json.Marshal(fields)
	require.NoError(t, err)
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

// S7 compares fairgo's hook with the fastest of DDP's own allreduce per
// layout, takes the worse layout, and leaves out runs with a fixed
// algorithm.
func TestHookTarget(t *testing.T) {
	dir := t.TempDir()
	ddp := func(layout, algo string, ips float64) string {
		f := map[string]any{"hook": "default", "world_size": 4, "images_per_s": ips, "nccl_algo": nil}
		name := "resnet-" + layout + "-default.json"
		if algo != "" {
			f["nccl_algo"] = "allreduce:" + algo
			name = "resnet-" + layout + "-" + algo + ".json"
		}
		return writeRun(t, dir, name, f)
	}
	fairgo := func(name string, ips float64, fixed any) string {
		return writeRun(t, dir, name, map[string]any{"hook": "fairgo", "world_size": 4, "images_per_s": ips,
			"nccl_algo": nil, "fairgo_algorithm": fixed})
	}
	files := []string{
		ddp("1x4", "", 8000), ddp("1x4", "ring", 7200), ddp("1x4", "tree", 7100),
		fairgo("resnet-1x4-fairgo.json", 7900, nil),
		fairgo("resnet-1x4-fairgo-flat.json", 9000, nil), // fixed by hand: named so in the file
		ddp("2x2", "", 2000), ddp("2x2", "ring", 1800), ddp("2x2", "tree", 2500),
		fairgo("resnet-2x2-fairgo.json", 2400, nil),
		fairgo("other-2x2-run.json", 9999, "rail-rsag"), // fixed by hand: named so in the JSON
	}
	runs, err := ParseHookRuns(files)
	require.NoError(t, err)
	require.Len(t, runs, 8)
	tg := hookTarget(runs)
	require.InDelta(t, 0.96, *tg.Measured, 1e-9, "2 × 2: 2400 against the tree's 2500")
	require.False(t, tg.Pass)
	require.Equal(t, 2, tg.Points)
	require.Contains(t, tg.Where, "2×2: fairgo 2400.0 images/s, best DDP tree 2500.0")

	runs[7].ImagesPerS = 2480 // 2 × 2's fairgo: 0.992; 1 × 4: 0.9875
	tg = hookTarget(runs)
	require.True(t, tg.Pass)
	require.InDelta(t, 7900.0/8000, *tg.Measured, 1e-9)

	tg = hookTarget(runs[:4])
	require.False(t, tg.Pass, "2 × 2 not measured")
	require.Equal(t, StatusIncomplete, tg.Status)
	require.Equal(t, []string{"2×2: fairgo's hook and DDP's allreduce"}, tg.Missing)

	require.Nil(t, hookTarget(nil).Measured)

	// Rounds: per round fairgo against DDP's best setting over the rounds,
	// the median per layout. On 2 × 2 the tree (medians: tree 2000, default
	// 2000; means 2125 and 1800). Round 1 (the files above) 0.992; rounds
	// 2–4 0.90, 1.05, 0.95: the median of 0.90, 0.95, 0.992, 1.05 is 0.971.
	// Round 5 has no fairgo run.
	tree := func(name string, ips float64) string {
		return writeRun(t, dir, name, map[string]any{"hook": "default", "world_size": 4, "images_per_s": ips,
			"nccl_algo": "allreduce:tree"})
	}
	rounds := []string{
		writeRun(t, dir, "resnet-2x2-default.r2.json", map[string]any{"hook": "default", "world_size": 4, "images_per_s": 2000}),
		tree("resnet-2x2-tree.r2.json", 2000),
		fairgo("resnet-2x2-fairgo.r2.json", 1800, nil),
		writeRun(t, dir, "resnet-2x2-default.r3.json", map[string]any{"hook": "default", "world_size": 4, "images_per_s": 2000}),
		tree("resnet-2x2-tree.r3.json", 2000),
		fairgo("resnet-2x2-fairgo.r3.json", 2100, nil),
		writeRun(t, dir, "resnet-2x2-default.r4.json", map[string]any{"hook": "default", "world_size": 4, "images_per_s": 2000}),
		tree("resnet-2x2-tree.r4.json", 2000),
		fairgo("resnet-2x2-fairgo.r4.json", 1900, nil),
		writeRun(t, dir, "resnet-2x2-default.r5.json", map[string]any{"hook": "default", "world_size": 4, "images_per_s": 1000}),
	}
	more, err := ParseHookRuns(rounds)
	require.NoError(t, err)
	require.Equal(t, 2, more[0].Round)
	require.Equal(t, 1, runs[0].Round)
	tg = hookTarget(append(slices.Clone(runs), more...))
	require.InDelta(t, (0.95+0.992)/2, *tg.Measured, 1e-9)
	require.False(t, tg.Pass)
	require.Contains(t, tg.Where, "2×2: median of 4 rounds 0.971 (0.900–1.050) against DDP tree, its best setting over the rounds "+
		"(0.971 against each round's fastest setting); round 1 fairgo 2480.0 images/s, best DDP tree 2500.0")

	bad := writeRun(t, dir, "resnet-1x4-x.json", map[string]any{"hook": "default"})
	_, err = ParseHookRuns([]string{bad})
	require.ErrorContains(t, err, "not a training run's file")
	_, err = ParseHookRuns([]string{filepath.Join(dir, "absent.json")})
	require.Error(t, err)
}

// A paired launch (train_resnet.py --pair) writes one file per run with
// its images/s round by round: each round is one of S7's rounds, fairgo's
// turn against the best DDP turn of the same round, the median over them.
func TestHookTargetPairedRounds(t *testing.T) {
	dir := t.TempDir()
	paired := func(run string, rounds ...float64) string {
		f := map[string]any{"hook": "default", "world_size": 4, "images_per_s": 1000.0, "nccl_algo": nil,
			"paired": []string{"fairgo", "default", "ring"}, "block_steps": 25, "round_images_per_s": rounds}
		switch run {
		case "fairgo":
			f["hook"] = "fairgo"
		case "ring":
			f["nccl_algo"] = "allreduce:ring"
		case "pyhook":
			f["hook"] = "pyhook"
		}
		return writeRun(t, dir, "resnet-1x4-"+run+".json", f)
	}
	files := []string{
		paired("fairgo", 990, 1010, 950, 1000),
		paired("default", 1000, 1000, 1000, 990),
		paired("ring", 980, 1020, 1000, 1000),
	}
	// PyTorch's own comm hook in Python, paired beside them: not one of
	// DDP's settings, so not in the best S7 divides by.
	runs, err := ParseHookRuns(append(files, paired("pyhook", 2000, 2000, 2000, 2000)))
	require.NoError(t, err)
	require.Len(t, runs, 12)
	require.Equal(t, HookRun{Layout: "1×4", Method: "ring", ImagesPerS: 1020, Round: 2, File: files[2]}, runs[9])
	// DDP's best setting is ring (medians 1000 and 1000, means 1000 and
	// 997.5). Per round against it: 990/980, 1010/1020, 0.95, 1: the median
	// of four is the mean of the middle two. Against each round's fastest
	// setting (0.99, 1010/1020, 0.95, 1) it would be lower: an oracle that
	// changes setting every round.
	rounds := hookRounds(runs, "1×4")
	require.Len(t, rounds, 4)
	tg := hookTarget(runs)
	require.InDelta(t, (1010.0/1020+1)/2, *tg.Measured, 1e-9)
	require.Contains(t, tg.Where, fmt.Sprintf("against DDP ring, its best setting over the rounds (%.3f against each round's fastest setting)",
		(0.99+1010.0/1020)/2))
	require.Equal(t, []string{"2×2: fairgo's hook and DDP's allreduce"}, tg.Missing)

	bad := writeRun(t, dir, "resnet-1x4-tree.json", map[string]any{"hook": "default", "world_size": 4,
		"images_per_s": 1000.0, "nccl_algo": "allreduce:tree", "round_images_per_s": []float64{1000, 0}})
	_, err = ParseHookRuns([]string{bad})
	require.ErrorContains(t, err, "round 2's images/s")
}
