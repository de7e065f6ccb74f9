#!/usr/bin/env python3
"""weft-perf's output, checked as a user of nccl-tests would read it.

  weft_perf_test.py CASE WEFTRUN WEFT_PERF [SCHEMA]

CASE is one of:
  golden   the header, column layout and footer of a 2-rank all_reduce run match
           tests/perf/golden_header.txt character for character (pid, host, version and the
           measured numbers masked; the measured columns checked for nccl-tests' exact widths).
  parse    `weft-perf all` on 4 ranks, read back with an nccl-tests-style regex: every data line
           parses, algbw = size / time, busbw = algbw x the op's factor (2(n-1)/n for all_reduce;
           (n-1)/n for all_gather, reduce_scatter, all_to_all, gather, scatter; 1 for broadcast,
           reduce, sendrecv), checked against the unrounded figures of the -J output, and
           #wrong = 0 everywhere; every dtype and op of all_reduce with -d all -o all.
  corrupt  with the test hook --corrupt-one-element, -c 1 reports #wrong = 1 on every line of
           every collective, the footer says FAILED, the exit status is non-zero; with -c 0
           #wrong is N/A. Also oneway (rank 2k to 2k+1): #wrong 0 on 4 ranks, algbw = busbw =
           size / time, one flipped element counted, 3 ranks skipped with a line; --wait each
           gives #wrong 0, --wait with another value is a usage error.
  json     -J output validates against benchmarks/weft-perf.schema.json (python3-jsonschema)
           and agrees with the text output line by line; so do oneway's and hypercube's.
  nccl     WEFT_PERF is a link named all_reduce_perf: nccl-tests' own command line
           (`all_reduce_perf -b 8 -e 128M -f 2 -g 1`) runs unchanged without a launcher, and its
           output reads with benchmarks/nccl_log.py and nccl-tests' exact line format; also under
           weftrun (no rank prefix), with -g 2 (two ranks started here), long forms --flag=value,
           ignored flags (-G) noted, -c N, --csv, the other links (alltoall_perf, hypercube_perf),
           ranks that disagree about the dtype failing with Desync (not #wrong), and a usage
           error printed once for three ranks.
  device   --device cuda: where a CUDA device is usable, one rank and two (weft-perf's own
           children) run all_reduce and all_gather on device buffers with #wrong = 0 and the
           header says so; where none is, weft-perf exits 1 naming the reason ("--device cuda:
           ... no usable CUDA device ..."), never a crash. Either way --device gpu and -R 1 with
           --device cuda are usage errors (exit 2).
  nccl_raw WEFT_PERF is benchmarks/gpu/nccl_raw: with a usable CUDA device, every collective it
           has prints weft-perf's table (nccl_log reads it) with #wrong = 0 at each size; without
           one it exits 1 naming the reason. An unknown flag is a usage error (exit 2).
Exit 0 on success, 1 on failure, 77 (meson's "skipped") when jsonschema is missing.
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))
import nccl_log  # noqa: E402

# The regex an nccl-tests log parser uses for a result line (both placements).
FLOAT = r"([\d.]+(?:e[+-]?\d+)?)"
LINE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)" +
                  (r"\s+" + FLOAT + r"\s+" + FLOAT + r"\s+" + FLOAT + r"\s+(\d+|N/A)") * 2 +
                  r"\s*$")
FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def run(weftrun, perf, ranks, args, expect_ok=True):
    cmd = [weftrun, "--nproc-per-node", str(ranks), "--standalone", perf] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if expect_ok and proc.returncode != 0:
        raise Failure(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def blocks(text):
    """Result lines per collective: {name: [regex match, ...]}, in order."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"# Collective test starting: (\w+)_perf$", line)
        if m:
            current = m.group(1)
            out[current] = []
        elif line and not line.startswith("#"):
            m = LINE.match(line)
            check(m is not None, f"a result line an nccl-tests parser cannot read: {line!r}")
            out[current].append(m)
    return out


def case_golden(weftrun, perf, _schema):
    proc = run(weftrun, perf, 2, ["all_reduce", "-b", "1K", "-e", "4K", "-f", "2", "-n", "3"])
    got = proc.stdout.splitlines()
    with open(os.path.join(HERE, "golden_header.txt")) as f:
        want = f.read().splitlines()
    check(len(got) == len(want), f"{len(got)} lines, golden has {len(want)}:\n{proc.stdout}")
    measured = re.compile(r"(  [ \d.e+-]{7}  [ \d.e+-]{6}  [ \d.e+-]{6}  [ \d]{6}){2}$")
    for g, w in zip(got, want):
        if w.startswith("<data>"):
            prefix = w[len("<data>"):]
            check(g.startswith(prefix), f"line {g!r} does not start with {prefix!r}")
            check(measured.fullmatch(g[len(prefix):]) is not None,
                  f"measured columns of {g!r} are not nccl-tests' widths")
            continue
        pattern = re.escape(w)
        for mask, rx in (("<version>", r"\S+"), ("<pid>", r" *\d+"), ("<host>", r" *\S+"),
                         ("<number>", r"[\d.e+-]+"), ("<cpus>", r"[\d,-]+")):
            pattern = pattern.replace(re.escape(mask), rx)
        check(re.fullmatch(pattern, g) is not None, f"line {g!r}\n  differs from {w!r}")


def case_parse(weftrun, perf, _schema):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        proc = run(weftrun, perf, 4, ["all", "-b", "4K", "-e", "64K", "-f", "4", "-n", "3",
                                      "-J", path])
        with open(path) as f:
            doc = json.load(f)
    n = 4
    parsed = blocks(proc.stdout)
    check(sorted(parsed) == sorted(FACTOR), f"collectives {sorted(parsed)}")
    by_coll = {c["collective"]: c["results"] for c in doc["collectives"]}
    for coll, lines in parsed.items():
        check(len(lines) == len(by_coll[coll]), f"{coll}: text and JSON line counts differ")
        check(len(lines) == (1 if coll == "barrier" else 3), f"{coll}: {len(lines)} lines")
        for m, res in zip(lines, by_coll[coll]):
            size = int(m.group(1))
            for col, key in ((6, "out_of_place"), (10, "in_place")):
                t, alg, bus = (float(m.group(col + i)) for i in range(3))
                check(m.group(col + 3) == "0", f"{coll} {size}: #wrong {m.group(col + 3)}")
                r = res[key]
                # The text is the JSON's figures rounded to nccl-tests' widths.
                check(abs(t - r["time"]) <= 0.01 + 1e-3 * r["time"], f"{coll} {size} time")
                check(abs(alg - r["alg_bw"]) <= 0.006, f"{coll} {size} algbw {alg} {r}")
                check(abs(bus - r["bus_bw"]) <= 0.006, f"{coll} {size} busbw {bus} {r}")
                if coll == "barrier":
                    check(r["alg_bw"] == 0 and r["bus_bw"] == 0, "barrier has no bandwidth")
                    continue
                expect_alg = size / (r["time"] * 1e-6) / 1e9
                check(abs(r["alg_bw"] - expect_alg) <= 1e-6 * expect_alg + 1e-9,
                      f"{coll} {size}: algbw {r['alg_bw']} != size/time {expect_alg}")
                factor = FACTOR[coll](n)
                check(abs(r["bus_bw"] - r["alg_bw"] * factor) <= 1e-9 * max(1, r["bus_bw"]),
                      f"{coll} {size}: busbw/algbw = {r['bus_bw'] / r['alg_bw']}, want {factor}")
    # Every dtype and reduce op of all_reduce, checked element by element by weft-perf itself.
    proc = run(weftrun, perf, 3, ["all_reduce", "-b", "96", "-e", "96", "-n", "2", "-d", "all",
                                  "-o", "all"])
    lines = blocks(proc.stdout)["all_reduce"]
    seen = {(m.group(3), m.group(4)) for m in lines}
    # 10 dtypes (fp8 last), mulsum on the 6 floats only.
    check(len(lines) == 10 * 5 + 6, f"{len(lines)} dtype x op lines")
    check(("bfloat16", "mulsum") in seen and ("int8", "prod") in seen, f"{sorted(seen)}")
    check(("f8e4m3", "avg") in seen and ("f8e5m2", "mulsum") in seen, f"{sorted(seen)}")
    for m in lines:
        check(m.group(9) == "0" and m.group(13) == "0", f"wrong results: {m.group(0)}")


def case_corrupt(weftrun, perf, _schema):
    proc = run(weftrun, perf, 3, ["all", "-b", "1K", "-e", "2K", "-f", "2", "-n", "2",
                                  "--corrupt-one-element"], expect_ok=False)
    check(proc.returncode != 0, "weft-perf exited 0 with wrong results")
    parsed = blocks(proc.stdout)
    for coll, lines in parsed.items():
        if coll == "barrier":
            continue
        for m in lines:
            check(m.group(9) == "1" and m.group(13) == "1",
                  f"{coll}: one flipped element should give #wrong 1: {m.group(0)}")
    footers = re.findall(r"# Out of bounds values : (\d+) (\w+)", proc.stdout)
    check(len(footers) == len(parsed), "a footer per collective")
    for (count, verdict), coll in zip(footers, parsed):
        want = 0 if coll == "barrier" else 4
        check(int(count) == want and verdict == ("OK" if want == 0 else "FAILED"),
              f"{coll}: footer {count} {verdict}")
    proc = run(weftrun, perf, 2, ["all_reduce", "-b", "1K", "-e", "1K", "-c", "0",
                                  "--corrupt-one-element"])
    (m,) = blocks(proc.stdout)["all_reduce"]
    check(m.group(9) == "N/A" and m.group(13) == "N/A", f"-c 0: {m.group(0)}")

    # oneway (not in `all`): rank 2k sends to 2k+1 only; the receivers check what arrived, so a
    # flipped element on one of them counts, and an odd rank count is skipped with a line.
    proc = run(weftrun, perf, 4, ["oneway", "-b", "1K", "-e", "4K", "-f", "2", "-n", "2"])
    lines = blocks(proc.stdout)["oneway"]
    check(len(lines) == 3, f"oneway lines: {proc.stdout}")
    for m in lines:
        check(m.group(9) == "0" and m.group(13) == "0", f"oneway wrong: {m.group(0)}")
        size, t, alg, bus = int(m.group(1)), float(m.group(6)), float(m.group(7)), float(m.group(8))
        check(alg == bus and abs(alg - size / (t * 1e-6) / 1e9) <= 0.01 + 0.01 * alg,
              f"oneway bandwidth {m.group(0)}")
    proc = run(weftrun, perf, 2, ["oneway", "-b", "1K", "-e", "1K", "--corrupt-one-element"],
               expect_ok=False)
    (m,) = blocks(proc.stdout)["oneway"]
    check(proc.returncode != 0 and m.group(9) == "1" and m.group(13) == "1",
          f"oneway, one flipped element: {m.group(0)}")
    proc = run(weftrun, perf, 3, ["oneway", "-b", "1K", "-e", "1K"])
    check("# nRanks 3 is odd (oneway pairs rank 2k with 2k+1), skipping" in proc.stdout,
          proc.stdout)

    # --wait each (the Works waited on one by one, in issue order) gives the same results;
    # anything but all or each is a usage error.
    proc = run(weftrun, perf, 2, ["all_reduce", "-b", "1K", "-e", "4K", "-f", "4", "-n", "20",
                                  "--wait", "each"])
    lines = blocks(proc.stdout)["all_reduce"]
    check(len(lines) == 2 and all(m.group(9) == "0" and m.group(13) == "0" for m in lines),
          f"--wait each: {proc.stdout}")
    proc = run(weftrun, perf, 2, ["all_reduce", "-b", "1K", "-e", "1K", "--wait", "some"],
               expect_ok=False)
    check(proc.returncode == 2 and "--wait some: expected all or each" in proc.stderr,
          f"--wait some: exit {proc.returncode}\n{proc.stderr}")


def case_json(weftrun, perf, schema_path):
    try:
        import jsonschema
    except ImportError:
        print("skipped: python3-jsonschema is not installed (scripts/install-deps installs it)")
        sys.exit(77)
    with open(schema_path) as f:
        schema = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        proc = run(weftrun, perf, 2, ["all", "-b", "1K", "-e", "8K", "-f", "8", "-n", "2",
                                      "-J", path])
        with open(path) as f:
            doc = json.load(f)
        jsonschema.validate(doc, schema)
        # -c 0 gives null #wrong, which the schema allows.
        run(weftrun, perf, 2, ["broadcast", "-b", "1K", "-e", "1K", "-c", "0", "-r", "all",
                               "-J", path])
        with open(path) as f:
            doc2 = json.load(f)
        jsonschema.validate(doc2, schema)
        # The collectives outside `all` validate too.
        for coll in ("oneway", "hypercube"):
            run(weftrun, perf, 2, [coll, "-b", "1K", "-e", "1K", "-n", "2", "-J", path])
            with open(path) as f:
                extra = json.load(f)
            jsonschema.validate(extra, schema)
            check([c["collective"] for c in extra["collectives"]] == [coll], f"{coll} json")
    check(doc["config"]["ranks"] == 2 and doc["config"]["step_factor"] == 8, "config")
    order = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
             "gather", "scatter", "sendrecv", "barrier"]  # `weft-perf all`'s order
    check([c["collective"] for c in doc["collectives"]] == order, "collective order")
    parsed = blocks(proc.stdout)
    for c in doc["collectives"]:
        for m, r in zip(parsed[c["collective"]], c["results"]):
            check(int(m.group(1)) == r["size"] and int(m.group(2)) == r["count"] and
                  m.group(3) == r["type"] and m.group(4) == r["redop"] and
                  int(m.group(5)) == r["root"], f"{m.group(0)} vs {r}")
    roots = [r["root"] for r in doc2["collectives"][0]["results"]]
    check(roots == [0, 1], f"-r all: roots {roots}")
    check(all(r["out_of_place"]["nwrong"] is None for r in doc2["collectives"][0]["results"]),
          "-c 0 must give null nwrong")
    # A bad schema instance is refused (the validation is real).
    doc["config"]["average"] = 7
    try:
        jsonschema.validate(doc, schema)
    except jsonschema.ValidationError:
        return
    raise Failure("the schema accepted average = 7")


# The launchers' variables: without them weft-perf starts its ranks itself, as nccl-tests does.
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "TORCHELASTIC_USE_AGENT_STORE")


def run_alone(program, args, expect_ok=True):
    """program run as nccl-tests is: no launcher, no weftrun."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    proc = subprocess.run([program] + args, capture_output=True, text=True, timeout=240, env=env)
    if expect_ok and proc.returncode != 0:
        raise Failure(f"{program} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n"
                      f"{proc.stderr}")
    return proc


def strict_lines(text, program, ranks):
    """Every line of text as nccl-tests prints it: comments, blank lines and result lines in its
    exact layout, nothing else (no launcher prefix)."""
    check(f"# Collective test starting: {program}" in text.splitlines(), f"no header for {program}")
    devices = re.findall(r"^#  Rank +(\d+) Group  0 Pid", text, re.M)
    check(devices == [str(r) for r in range(ranks)], f"device lines for ranks {devices}")
    for line in text.splitlines():
        if line == "" or line.startswith("#"):
            continue
        check(LINE.match(line) is not None, f"not an nccl-tests line: {line!r}")


def case_nccl(weftrun, link, _schema):
    check(os.path.basename(link) == "all_reduce_perf", f"{link} is not the all_reduce_perf link")
    links = os.path.dirname(link)
    # nccl-tests' README command line, unchanged.
    proc = run_alone(link, ["-b", "8", "-e", "128M", "-f", "2", "-g", "1"])
    strict_lines(proc.stdout, "all_reduce_perf", 1)
    (test,) = nccl_log.summary(proc.stdout)
    check(test["collective"] == "all_reduce", f"collective {test['collective']}")
    check([r["size"] for r in test["rows"]] == [8 << i for i in range(25)],
          f"sizes {[r['size'] for r in test['rows']]}")
    for r in test["rows"]:
        check((r["count"], r["type"], r["redop"], r["root"]) == (r["size"] // 4, "float", "sum", -1),
              f"row {r}")
        check(r["oop_wrong"] == 0 and r["ip_wrong"] == 0, f"wrong results {r}")
    check(test["out_of_bounds"] == 0 and test["out_of_bounds_ok"], "footer")
    check(proc.stderr == "", f"stderr: {proc.stderr!r}")

    # -g 2 without a launcher: two ranks, started by weft-perf, as nccl-tests' two GPUs.
    proc = run_alone(link, ["-b", "1K", "-e", "8K", "-f", "2", "-g", "2", "-n", "2"])
    strict_lines(proc.stdout, "all_reduce_perf", 2)
    rows = nccl_log.parse(proc.stdout)
    check(len(rows) == 4 and all(r["oop_wrong"] == 0 == r["ip_wrong"] for r in rows), f"{rows}")

    # Under weftrun: read as is (no "[0]: " prefix), long forms, ignored flags, -c N, CSV.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.csv")
        proc = run(weftrun, link, 2, ["--minbytes=1K", "--maxbytes", "4K", "--stepfactor=2",
                                      "--iters=2", "--check=3", "-G", "1", "-t", "1",
                                      "--ngpus=1", "-w1", "--csv=" + path])
        with open(path) as f:
            table = list(csv.DictReader(f))
    strict_lines(proc.stdout, "all_reduce_perf", 2)
    check("# all_reduce_perf: -G 1 ignored: CUDA graph launches: weft's collectives run on the "
          "CPU, without graphs" in proc.stdout.splitlines(), f"no -G note:\n{proc.stdout}")
    check("validation: 3 graph: 0" in proc.stdout, "-c 3 in the header")
    rows = nccl_log.parse(proc.stdout)
    check([r["size"] for r in rows] == [1024, 2048, 4096], f"{rows}")
    check(len(table) == len(rows), f"CSV has {len(table)} rows, text {len(rows)}")
    for r, c in zip(rows, table):
        check(c["collective"] == "all_reduce" and int(c["size"]) == r["size"] and
              int(c["count"]) == r["count"] and c["type"] == r["type"] and
              int(c["oop_wrong"]) == r["oop_wrong"] and int(c["ip_wrong"]) == r["ip_wrong"],
              f"CSV {c} vs text {r}")
        check(abs(float(c["oop_time_us"]) - r["oop_time_us"]) <= 0.01 + 1e-3 * r["oop_time_us"],
              f"CSV time {c} vs {r}")
    # -c N stops at the first check iteration with wrong elements and reports its count.
    proc = run(weftrun, link, 2, ["-b", "1K", "-e", "1K", "-c", "4", "--corrupt-one-element"],
               expect_ok=False)
    (r,) = nccl_log.parse(proc.stdout)
    check(proc.returncode == 1 and r["oop_wrong"] == 1 and r["ip_wrong"] == 1, f"-c 4: {r}")

    # The other links pick their collective from their name.
    proc = run(weftrun, os.path.join(links, "alltoall_perf"), 2, ["-b", "1K", "-e", "2K", "-f",
                                                                  "2", "-n", "2"])
    strict_lines(proc.stdout, "alltoall_perf", 2)
    (test,) = nccl_log.summary(proc.stdout)
    check(test["collective"] == "alltoall" and len(test["rows"]) == 2 and
          all(r["oop_wrong"] == 0 == r["ip_wrong"] for r in test["rows"]), f"{test}")
    proc = run(weftrun, os.path.join(links, "hypercube_perf"), 4, ["-b", "1K", "-e", "4K", "-f",
                                                                   "2", "-n", "2"])
    strict_lines(proc.stdout, "hypercube_perf", 4)
    for m in blocks(proc.stdout)["hypercube"]:
        check(m.group(9) == "0" and m.group(13) == "0", f"hypercube wrong: {m.group(0)}")
        size, t, alg, bus = int(m.group(1)), float(m.group(6)), float(m.group(7)), float(m.group(8))
        # nccl-tests: algbw = count x width x (n-1) / time = size x 3/4 / time; busbw = algbw.
        check(alg == bus and abs(alg - size * 0.75 / (t * 1e-6) / 1e9) <= 0.01 + 0.01 * alg,
              f"hypercube bandwidth {m.group(0)}")
    proc = run(weftrun, os.path.join(links, "hypercube_perf"), 3, ["-b", "1K", "-e", "1K"])
    check("# nRanks 3 is not a power of 2, skipping" in proc.stdout, proc.stdout)

    # Ranks that disagree about the dtype at one byte size (float against int32): a Desync that
    # says what to do, never #wrong counts of garbage (the call fingerprint in every tag).
    cmd = [weftrun, "--nproc-per-node", "2", "--standalone", "/bin/sh", "-c",
           'if [ "$RANK" = 0 ]; then t=float; else t=int32; fi; '
           f'exec "{link}" -b 1K -e 1K -n 1 -w 0 -d $t']
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    check(proc.returncode == 1, f"dtype disagreement exited {proc.returncode}:\n{out}")
    check(nccl_log.parse(proc.stdout) == [], f"a result line from mismatched ranks:\n{out}")
    check("Desync: " in out and "called this collective with different arguments" in out and
          "rerun with WEFT_DEBUG=detail" in out, f"no Desync that says what to do:\n{out}")

    # The ranks weft-perf starts itself are bound to cores when they fit them (each line names
    # its CPUs), and not with --bind-to none; a bad value is a usage error.
    def cpus_of(out):
        found = re.findall(r"^#  Rank +(\d+) .* CPUs ([\d,-]+)$", out, re.M)
        return {int(r): set(expand(c)) for r, c in found}

    def expand(text):
        cpus = []
        for part in text.split(","):
            first, _, last = part.partition("-")
            cpus += range(int(first), int(last or first) + 1)
        return cpus

    allowed = os.sched_getaffinity(0)
    proc = run_alone(link, ["-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "-g", "2"])
    bound = cpus_of(proc.stdout)
    check(sorted(bound) == [0, 1], f"no CPUs on the rank lines:\n{proc.stdout}")
    if len(allowed) >= 2:
        check(bound[0] and bound[1] and not bound[0] & bound[1] and
              bound[0] | bound[1] <= allowed, f"-g 2 not bound to two shares: {bound}")
    proc = run_alone(link, ["-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "-g", "2",
                            "--bind-to", "none"])
    check(cpus_of(proc.stdout) == {0: allowed, 1: allowed},
          f"--bind-to none bound: {cpus_of(proc.stdout)}, allowed {allowed}")
    proc = run_alone(link, ["-b", "1K", "-e", "1K", "--bind-to", "socket"], expect_ok=False)
    check(proc.returncode == 2 and "--bind-to socket: expected core or none" in proc.stderr,
          f"--bind-to socket: exit {proc.returncode}\n{proc.stderr}")

    # A usage error, once for the job, not once per rank.
    proc = run(weftrun, link, 3, ["-b", "lots"], expect_ok=False)
    check(proc.returncode == 2, f"exit {proc.returncode}")
    said = (proc.stdout + proc.stderr).count("all_reduce_perf: not a size: lots")
    check(said == 1, f"the usage error is printed {said} times:\n{proc.stderr}")


def case_device(_weftrun, perf, _schema):
    proc = run_alone(perf, ["all_reduce", "-b", "8", "-e", "8", "--device", "gpu"],
                     expect_ok=False)
    check(proc.returncode == 2 and "--device wants cpu, cuda or cuda:N, not \"gpu\"" in proc.stderr,
          f"--device gpu: exit {proc.returncode}\n{proc.stderr}")
    proc = run_alone(perf, ["all_reduce", "-b", "8", "-e", "8", "--device", "cuda", "-R", "1"],
                     expect_ok=False)
    check(proc.returncode == 2 and "symmetric buffers are host memory" in proc.stderr,
          f"-R 1 --device cuda: exit {proc.returncode}\n{proc.stderr}")
    args = ["all_reduce", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3", "--device", "cuda"]
    proc = run_alone(perf, args, expect_ok=False)
    if proc.returncode != 0:
        # No usable device here: a clear error from every rank, before any rendezvous.
        check(proc.returncode == 1, f"--device cuda without a device: exit {proc.returncode} "
              f"(not 1)\n{proc.stdout}\n{proc.stderr}")
        check(re.search(r"--device cuda: .*(no usable CUDA device|no CUDA device|CUDA)",
                        proc.stderr) is not None, f"no reason given:\n{proc.stderr}")
        check(nccl_log.parse(proc.stdout) == [], f"result lines without a device:\n{proc.stdout}")
        proc = run_alone(perf, args + ["-g", "2"], expect_ok=False)
        check(proc.returncode == 1 and "--device cuda: " in proc.stderr,
              f"-g 2 --device cuda without a device: exit {proc.returncode}\n{proc.stderr}")
        print("device: no usable CUDA device here; checked the error path only")
        return
    for extra in ([], ["-g", "2"]):
        for coll in ("all_reduce", "all_gather"):
            proc = run_alone(perf, [coll] + args[1:] + extra)
            check("# Buffers: CUDA device memory (--device cuda)" in proc.stdout, proc.stdout)
            rows = nccl_log.parse(proc.stdout)
            check(len(rows) == 2 and all(r["oop_wrong"] == 0 == r["ip_wrong"] for r in rows),
                  f"{coll} {extra}: {rows}")


def case_nccl_raw(_weftrun, raw, _schema):
    proc = run_alone(raw, ["all_reduce", "--bogus", "1"], expect_ok=False)
    check(proc.returncode == 2 and "unknown flag --bogus" in proc.stderr,
          f"--bogus: exit {proc.returncode}\n{proc.stderr}")
    proc = run_alone(raw, ["all", "-b", "1K", "-e", "64K", "-f", "8", "-n", "3"], expect_ok=False)
    if proc.returncode != 0:
        check(proc.returncode == 1 and "nccl_raw: " in proc.stderr and "CUDA" in proc.stderr,
              f"nccl_raw without a device: exit {proc.returncode}\n{proc.stderr}")
        check(nccl_log.parse(proc.stdout) == [], f"result lines without a device:\n{proc.stdout}")
        print("nccl_raw: no usable CUDA device here; checked the error path only")
        return
    tests = nccl_log.summary(proc.stdout)
    check([t["collective"] for t in tests] ==
          ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"], f"{tests}")
    for t in tests:
        check([r["size"] for r in t["rows"]] == [1024, 8192, 65536], f"sizes {t}")
        check(all(r["oop_wrong"] == 0 == r["ip_wrong"] for r in t["rows"]), f"wrong {t}")
        check(t["out_of_bounds_ok"], f"footer {t}")


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    case, weftrun, perf = sys.argv[1:4]
    schema = sys.argv[4] if len(sys.argv) > 4 else ""
    try:
        {"golden": case_golden, "parse": case_parse, "corrupt": case_corrupt,
         "json": case_json, "nccl": case_nccl, "device": case_device,
         "nccl_raw": case_nccl_raw}[case](weftrun, perf, schema)
    except Failure as e:
        print(f"FAILED: {e}")
        return 1
    print(f"{case}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
