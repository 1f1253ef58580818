"""Tests of train_resnet.py's paired schedule that need no GPU and no
PyTorch: python3 -m unittest discover -s examples/ddp_torch"""

import unittest

import train_resnet


class ScheduleTest(unittest.TestCase):
    def test_rounds_rotate_and_cover_the_same_steps(self):
        runs = ["fairgo", "default", "ring"]
        turns = train_resnet.schedule(runs, steps=5 + 3 * 10 + 4, warmup=5, block=10)
        warm = [t for t in turns if t[0] == 0]
        self.assertEqual(warm, [(0, r, 0, 5) for r in runs])
        timed = [t for t in turns if t[0] > 0]
        self.assertEqual(len(timed), 3 * len(runs))  # the 4 steps that fill no round are left out
        for k in (1, 2, 3):
            rnd = [t for t in timed if t[0] == k]
            self.assertEqual([t[1] for t in rnd], runs[k - 1:] + runs[:k - 1])  # rotated by one a round
            self.assertEqual({(t[2], t[3]) for t in rnd}, {(5 + (k - 1) * 10, 5 + k * 10)})
        for r in runs:  # every run trains steps 0..34 in order, once each
            steps = [s for t in turns if t[1] == r for s in range(t[2], t[3])]
            self.assertEqual(steps, list(range(35)))

    def test_no_warmup_and_too_few_steps(self):
        self.assertEqual(train_resnet.schedule(["a", "b"], steps=3, warmup=0, block=4), [])
        self.assertEqual(train_resnet.schedule(["a", "b"], steps=4, warmup=0, block=4),
                         [(1, "a", 0, 4), (1, "b", 0, 4)])

    def test_round_rates(self):
        turns = [(0, "a", 0, 2), (0, "b", 0, 2), (1, "a", 2, 4), (1, "b", 2, 4), (2, "b", 4, 6), (2, "a", 4, 6)]
        seconds = [9.0, 9.0, 1.0, 2.0, 4.0, 1.0]
        per_round, total = train_resnet.round_rates(turns, seconds, images_per_step=10)
        self.assertEqual(per_round, {"a": [20.0, 20.0], "b": [10.0, 5.0]})
        self.assertEqual(total, {"a": 20.0, "b": 40 / 6})  # the warm-up's seconds are not counted

    def test_paired_ratios(self):
        per_round = {"fairgo": [990, 1010, 950, 1000], "default": [1000, 1000, 1000, 990],
                     "ring": [980, 1020, 1000, 1000], "pyhook": [2000, 2000, 2000, 2000]}
        best, ratios, oracle = train_resnet.paired_ratios(per_round)
        self.assertEqual(best, "ring")  # medians 1000 and 1000; means 1000 and 997.5; pyhook is no baseline
        self.assertEqual(ratios, [990 / 980, 1010 / 1020, 950 / 1000, 1.0])
        self.assertEqual(oracle, [0.99, 1010 / 1020, 0.95, 1.0])

    def test_parse_runs(self):
        self.assertEqual(train_resnet.parse_runs("fairgo, default,tree"), ["fairgo", "default", "tree"])
        for bad in ("fairgo", "fairgo,fairgo", "fairgo,nccl", ""):
            with self.assertRaises(SystemExit):
                train_resnet.parse_runs(bad)

    def test_python_hook_is_no_baseline(self):
        self.assertEqual(train_resnet.parse_runs("fairgo,default,pyhook"), ["fairgo", "default", "pyhook"])
        self.assertNotIn("pyhook", train_resnet.BASELINES)
        self.assertEqual(set(train_resnet.BASELINES), set(train_resnet.RUNS) - {"fairgo", "pyhook"})

    def test_bucket_sizes(self):
        class Buffer:
            def __init__(self, n):
                self.n = n

            def numel(self):
                return self.n

            def element_size(self):
                return 4

        class Bucket:
            def __init__(self, n):
                self.b = Buffer(n)

            def buffer(self):
                return self.b

        class Reducer:
            def _get_zeros_like_grad_buckets(self):
                return [Bucket(10), Bucket(1 << 20), Bucket(10)]

        ddp = type("DDP", (), {"reducer": Reducer()})()
        self.assertEqual(train_resnet.bucket_sizes(ddp), [40, 4 << 20])
        self.assertEqual(train_resnet.bucket_sizes(object()), [])  # a DDP without the call

    def test_pair_needs_a_run_placeholder(self):
        with self.assertRaises(SystemExit):
            train_resnet.parse_args(["--pair", "fairgo,default", "--losses-out", "/tmp/x.json"])
        args = train_resnet.parse_args(["--pair", "fairgo,default", "--losses-out", "/tmp/{run}.json"])
        self.assertEqual(args.runs, ["fairgo", "default"])
        self.assertEqual(train_resnet.parse_args(["--hook", "default"]).runs, ["default"])


if __name__ == "__main__":
    unittest.main()
