"""Tests of hook_cost.py that need no GPU and no PyTorch."""

import unittest

import hook_cost


class SizeTest(unittest.TestCase):
    def test_suffixes(self):
        self.assertEqual(hook_cost.size("64K"), 64 << 10)
        self.assertEqual(hook_cost.size("16M"), 16 << 20)
        self.assertEqual(hook_cost.size("1.5m"), 3 << 19)
        self.assertEqual(hook_cost.size("1G"), 1 << 30)
        self.assertEqual(hook_cost.size("4096"), 4096)

    def test_bad_size(self):
        with self.assertRaises(ValueError):
            hook_cost.size("lots")


if __name__ == "__main__":
    unittest.main()
