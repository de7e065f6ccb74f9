#!/usr/bin/env python3
"""benchmarks/nccl_log.py against a log in nccl-tests' exact format.

  python3 tests/perf/nccl_log_test.py [-v]

The sample below was laid out with nccl-tests' own format strings: "%12li  %12li  %8s  %6s  %6s"
for size, count, type, redop and root, then per placement (out of place, in place)
"  %7s  %6s  %6s" for time, algbw and busbw and "  %6g" for #wrong ("  %6s" with "N/A" when
validation is off). It covers a time printed in exponent form (1.2e+04), an N/A #wrong, a #wrong
that %6g prints in exponent form, a rooted collective, two collectives in one log and their
footers. Standard library only.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
import nccl_log  # noqa: E402

SAMPLE = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 128(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  41234 on     node01 device  0 [0x07] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  41235 on     node01 device  1 [0x0b] NVIDIA H100 80GB HBM3
#
# Collective test starting: all_reduce_perf
#                                                              out-of-place                       in-place          
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2     float     sum      -1    15.21    0.00    0.00       0    14.87    0.00    0.00       0
     1048576        262144     float     sum      -1    512.3    2.05    3.07       0    498.1    2.11    3.16       0
   134217728      33554432     float     sum      -1  1.2e+04   11.18   16.78       0    11876   11.30   16.95       3
# Out of bounds values : 1 FAILED
# Avg bus bandwidth    : 6.65333 
#
# Collective test concluded: all_reduce_perf

# Collective test starting: broadcast_perf
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        1024           256     float    none       0    20.11    0.05    0.05     N/A    19.80    0.05    0.05     N/A
           0             0     float    none      -1     9.50    0.00    0.00  1.23457e+06     9.10    0.00    0.00       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.025 
#
# Collective test concluded: broadcast_perf
"""


class ParseTest(unittest.TestCase):
    def setUp(self):
        self.rows = nccl_log.parse(SAMPLE)

    def test_every_data_line_and_nothing_else(self):
        self.assertEqual([r["size"] for r in self.rows], [8, 1048576, 134217728, 1024, 0])
        self.assertEqual([r["collective"] for r in self.rows],
                         ["all_reduce"] * 3 + ["broadcast"] * 2)

    def test_fields_of_a_plain_line(self):
        r = self.rows[1]
        self.assertEqual(r, {
            "collective": "all_reduce", "size": 1048576, "count": 262144, "type": "float",
            "redop": "sum", "root": -1,
            "oop_time_us": 512.3, "oop_algbw": 2.05, "oop_busbw": 3.07, "oop_wrong": 0,
            "ip_time_us": 498.1, "ip_algbw": 2.11, "ip_busbw": 3.16, "ip_wrong": 0,
        })
        self.assertIsInstance(r["oop_wrong"], int)
        self.assertIsInstance(r["size"], int)

    def test_exponent_time_and_in_place_wrong(self):
        r = self.rows[2]
        self.assertEqual(r["oop_time_us"], 12000.0)
        self.assertEqual(r["ip_time_us"], 11876.0)
        self.assertEqual(r["oop_busbw"], 16.78)
        self.assertEqual(r["oop_wrong"], 0)
        self.assertEqual(r["ip_wrong"], 3)

    def test_na_wrong_and_root(self):
        r = self.rows[3]
        self.assertIsNone(r["oop_wrong"])
        self.assertIsNone(r["ip_wrong"])
        self.assertEqual((r["type"], r["redop"], r["root"]), ("float", "none", 0))
        self.assertEqual(r["oop_time_us"], 20.11)

    def test_exponent_wrong(self):
        # %6g prints 1234567 as 1.23457e+06: the parser returns what the log says.
        self.assertEqual(self.rows[4]["oop_wrong"], 1234570)
        self.assertEqual(self.rows[4]["ip_wrong"], 0)

    def test_summary_footers(self):
        tests = nccl_log.summary(SAMPLE)
        self.assertEqual([t["collective"] for t in tests], ["all_reduce", "broadcast"])
        self.assertEqual([len(t["rows"]) for t in tests], [3, 2])
        self.assertEqual((tests[0]["out_of_bounds"], tests[0]["out_of_bounds_ok"]), (1, False))
        self.assertEqual((tests[1]["out_of_bounds"], tests[1]["out_of_bounds_ok"]), (0, True))
        self.assertAlmostEqual(tests[0]["avg_busbw"], 6.65333)
        self.assertAlmostEqual(tests[1]["avg_busbw"], 0.025)

    def test_rank_prefix_and_no_header(self):
        text = ("[0]:      1048576        262144     float     sum      -1    512.3    2.05"
                "    3.07       0    498.1    2.11    3.16       0\n")
        rows = nccl_log.parse(text)
        self.assertEqual(len(rows), 1)
        self.assertIsNone(rows[0]["collective"])
        self.assertEqual(rows[0]["ip_busbw"], 3.16)

    def test_malformed_lines_are_skipped(self):
        text = ("     1048576        262144     float     sum      -1    512.3    2.05\n"
                "weft-perf: something failed\n")
        self.assertEqual(nccl_log.parse(text), [])
        self.assertEqual(nccl_log.summary(""), [])


if __name__ == "__main__":
    unittest.main()
