"""Parses the text output of nccl-tests (all_reduce_perf, ...) and of weft-perf, which prints the
same format.

    import nccl_log
    rows = nccl_log.parse(text)       # one dict per data line
    tests = nccl_log.summary(text)    # one dict per "# Collective test starting" block

parse(text) returns a list of dicts, one per data line, in the order printed, with the keys

    collective   name from the last "# Collective test starting: all_reduce_perf" line before the
                 row, without "_perf" ("all_reduce"); None if the log has no such line
    size         int, bytes (the full array, as nccl-tests counts it)
    count        int, elements
    type         str, e.g. "float"
    redop        str, e.g. "sum", "none"
    root         int, -1 for rootless collectives
    oop_time_us, oop_algbw, oop_busbw      float: out-of-place time (us), algbw and busbw (GB/s)
    oop_wrong    int, or None where the log says N/A (validation off, -c 0)
    ip_time_us, ip_algbw, ip_busbw, ip_wrong   the same for in place

Numbers may be printed in exponent form ("1.2e+04"). Lines starting with "#" are comments; a
"[RANK]: " prefix (a launcher's) is ignored; lines that are neither are skipped.

summary(text) returns a list of dicts, one per collective test in the log (a log without
"Collective test starting" lines counts as one test with collective None), with the keys

    collective        as above
    rows              that test's rows, as parse() returns them
    out_of_bounds     int from "# Out of bounds values : 0 OK", or None if missing
    out_of_bounds_ok  True for OK, False for FAILED, None if missing
    avg_busbw         float from "# Avg bus bandwidth    : 1.23", or None if missing

Standard library only; runs under Python 3.8 or later.
"""
import re

__all__ = ["parse", "summary"]

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_WRONG = _NUM + r"|N/A"
_PREFIX = r"^(?:\[\d+\]:\s*)?"
_ROW = re.compile(
    _PREFIX
    + r"\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)"
    + r"\s+({n})\s+({n})\s+({n})\s+({w})".format(n=_NUM, w=_WRONG)
    + r"\s+({n})\s+({n})\s+({n})\s+({w})\s*$".format(n=_NUM, w=_WRONG),
    re.IGNORECASE)
_START = re.compile(_PREFIX + r"#\s*Collective test starting:\s*(\S+)")
_OOB = re.compile(_PREFIX + r"#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.IGNORECASE)
_AVG = re.compile(_PREFIX + r"#\s*Avg bus bandwidth\s*:\s*(" + _NUM + r")", re.IGNORECASE)


def _wrong(text):
    return None if text.upper() == "N/A" else int(float(text))


def _collective(program):
    return program[:-5] if program.endswith("_perf") else program


def summary(text):
    """One dict per collective test in text; see the module docstring."""
    tests = []
    current = None

    def new_test(name):
        test = {"collective": name, "rows": [], "out_of_bounds": None,
                "out_of_bounds_ok": None, "avg_busbw": None}
        tests.append(test)
        return test

    for line in text.splitlines():
        m = _START.match(line)
        if m:
            current = new_test(_collective(m.group(1)))
            continue
        m = _OOB.match(line)
        if m:
            if current is None:
                current = new_test(None)
            current["out_of_bounds"] = int(m.group(1))
            if m.group(2):
                current["out_of_bounds_ok"] = m.group(2).upper() == "OK"
            continue
        m = _AVG.match(line)
        if m:
            if current is None:
                current = new_test(None)
            current["avg_busbw"] = float(m.group(1))
            continue
        m = _ROW.match(line)
        if not m:
            continue
        if current is None:
            current = new_test(None)
        g = m.groups()
        current["rows"].append({
            "collective": current["collective"],
            "size": int(g[0]), "count": int(g[1]), "type": g[2], "redop": g[3], "root": int(g[4]),
            "oop_time_us": float(g[5]), "oop_algbw": float(g[6]), "oop_busbw": float(g[7]),
            "oop_wrong": _wrong(g[8]),
            "ip_time_us": float(g[9]), "ip_algbw": float(g[10]), "ip_busbw": float(g[11]),
            "ip_wrong": _wrong(g[12]),
        })
    return tests


def parse(text):
    """One dict per data line of text, in order; see the module docstring."""
    return [row for test in summary(text) for row in test["rows"]]


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(summary(sys.stdin.read()), indent=1))
