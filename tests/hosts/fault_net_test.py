#!/usr/bin/env python3
"""Network and resource faults across namespace hosts (tests/support/netns-hosts): every case ends
in success or a clear error in bounded time, never a hang, and leaves nothing behind (namespaces,
links, nftables tables, processes, the job's /dev/shm segments in each host and here).

  fault_net_test.py CASE BUILD_DIR

CASE is one of:
  loss       5% of the packets into and out of host 2 dropped (nftables, `numgen random mod 100
             < 5 drop`): 2 hosts x 2 ranks run the conformance suite's all_reduce and broadcast
             families and weft-perf with every result checked; TCP retransmits, the job ends
             correct. Skips (77) without nft.
  link_down  2 hosts x 2 ranks loop all_reduce (checked) under WEFT_TIMEOUT=5; host 2's veth on
             the bridge goes down mid-job: every rank fails with Timeout or PeerLost naming the
             operation and its sequence number within WEFT_TIMEOUT + 10 s, and exits; the link
             comes back up once the first rank has failed (too late): no rank succeeds after, no
             result is wrong.
  shm_full   host 1's /dev/shm is a 3 MiB tmpfs, room for one of its two ranks' 2 MiB segments:
             no SIGBUS; both ranks fail at once (not at WEFT_TIMEOUT) with an error naming
             /dev/shm, the size wanted and WEFT_SHM=0; host 2's ranks fail too. Then a 7 MiB
             /dev/shm, where the world group fits and a second group made later does not: the
             same error from new_group, the world's results right until then. Last, WEFT_SHM=0 on
             the 3 MiB host runs.
  nofile     `ulimit -n 64` for every rank of 2 hosts x 4 ranks: weft-perf runs, checked; then
             `ulimit -n 12`: every rank fails within seconds (WEFT_TIMEOUT is 60), and the ranks
             that ran out say f"too many open files: RLIMIT_NOFILE is {TIGHT_NOFILE}" and `ulimit -n`.
Exit 0 on success, 1 on failure, 77 (meson's "skipped") without root, namespaces or nft.
"""
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import multi_host_test as mh  # noqa: E402  (its helpers: one harness for every hosts test)
from multi_host_test import Failure, check, netns  # noqa: E402

# Namespace sets 150-179 are this file's (other hosts tests use other ranges).
SETS = {"loss": 150, "link_down": 151, "shm_full": 152, "nofile": 153}
PORTS = {"loss": 29650, "link_down": 29651, "shm_full": 29652, "nofile": 29653}


def worker(mode, count):
    """One rank (weft's Python package, the launcher's variables). Prints a line per step so that
    the test can follow it; a weft error prints "ERROR ..." and exits 3, a wrong element
    "MISMATCH ..." and exits 4.
      loop:   all_reduce of `count` float32 until an error (link_down), each result checked.
      groups: two all_reduces on the world, then a second group of every rank (new_group) and
              an all_reduce on it."""
    from array import array

    import weft
    started = time.monotonic()
    last_ok = started
    step = 0

    def all_reduce(group, label):
        nonlocal last_ok
        base = step % 7
        buf = array("f", [group.rank + 1 + base]) * count
        group.all_reduce(buf)
        want = group.size * (group.size + 1) // 2 + group.size * base
        if buf.count(want) != count:
            bad = next(i for i, v in enumerate(buf) if v != want)
            print(f"MISMATCH {label} step {step}: element {bad} is {buf[bad]}, want {want}",
                  flush=True)
            sys.exit(4)
        last_ok = time.monotonic()
        print(f"{label} step {step} ok", flush=True)

    try:
        world = weft.init(timeout=float(os.environ.get("WEFT_TIMEOUT", "60")))
        print(f"rank {world.rank}/{world.size} up", flush=True)
        if mode == "loop":
            while True:
                all_reduce(world, "world")
                step += 1
        for _ in range(2):
            all_reduce(world, "world")
            step += 1
        group = world.new_group(range(world.size))
        all_reduce(group, "group")
        group.destroy()
        world.destroy()
    except weft.Error as e:
        now = time.monotonic()
        print(f"ERROR {type(e).__name__} after {now - last_ok:.1f} s without progress "
              f"({now - started:.1f} s in all): {e}", flush=True)
        sys.exit(3)


class Host:
    """A host's ranks, started by one `netns-hosts exec` (multi_host_test's spawner, streaming):
    what they print arrives line by line, for the test to wait on with a deadline."""

    def __init__(self, set_no, host, spec, shm_size=None):
        env = dict(os.environ)
        if shm_size:
            env["NETNS_HOSTS_SHM_SIZE"] = shm_size
        spec = dict(spec, stream=True)
        self.name = f"host {host}"
        self.proc = subprocess.Popen(
            [mh.NETNS, "exec", str(set_no), str(host), sys.executable,
             os.path.join(HERE, "multi_host_test.py"), "spawn", json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = queue.Queue()
        self.text = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.text.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern, deadline, count=1):
        """Waits until `count` lines match `pattern`; returns them. Fails at the deadline or when
        the host's ranks are all gone first."""
        found = []
        while len(found) < count:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise Failure(f"{self.name}: no {count} lines like /{pattern}/ in time:\n"
                              + "".join(self.text))
            if line is None:
                raise Failure(f"{self.name}: its ranks ended before {count} lines like "
                              f"/{pattern}/:\n" + "".join(self.text))
            if re.search(pattern, line):
                found.append(line)
        return found

    def finish(self, timeout):
        """Waits for the host's ranks; returns (exit code, [rank outputs], [segments left in its
        /dev/shm]). Past the timeout, kills them and fails naming the host."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.reader.join()
            raise Failure(f"{self.name}: ranks still running after {timeout:.0f} s (a hang):\n"
                          + "".join(self.text))
        self.reader.join()
        text = "".join(self.text)
        left = re.search(r"^SHM-LEFT: (.*)$", text, re.M)
        ranks = json.loads(text.strip().splitlines()[-1]) if left else []
        if not ranks:
            ranks = [{"rc": self.proc.returncode, "out": text}]
        return self.proc.returncode, ranks, json.loads(left.group(1)) if left else []


def worker_spec(set_no, case, hosts_ranks, mode, count, env=None, timeout=120):
    """Per host, the spawner's spec for ranks of this file's worker (torchrun's variables)."""
    build_python = os.path.join(BUILD, "python")
    specs = []
    for envs in mh.layout_env(hosts_ranks, f"10.77.{set_no}.1", PORTS[case]):
        for e in envs:
            e.update({"PYTHONPATH": build_python, "WEFT_LOG": "warn"})
            e.update(env or {})
        specs.append({"cmd": mh.python_command() + [os.path.abspath(__file__), "worker", mode,
                              str(count)], "ranks": [{"env": e} for e in envs],
                      "timeout": timeout})
    return specs


def finish_all(hosts, timeout):
    """finish() of every host under one deadline; checks that no host left segments."""
    deadline = time.monotonic() + timeout
    results = []
    for h in hosts:
        rc, ranks, left = h.finish(max(deadline - time.monotonic(), 1))
        check(not left, f"{h.name}: segments left in its /dev/shm: {left}")
        results.append((rc, ranks))
    return results


def rank_outputs(results):
    return [r["out"] for _, ranks in results for r in ranks]


# ---- loss


def nft_in(set_no, host, script):
    return subprocess.run(["ip", "netns", "exec", f"wft{set_no}h{host}", "nft", "-f", "-"],
                          input=script, capture_output=True, text=True, check=True)


def case_loss(set_no):
    if shutil.which("nft") is None:
        print("skipped: nft is not installed (Debian's nftables; scripts/install-deps has it)")
        return 77
    netns("up", set_no, 2)
    # 5% of what arrives at host 2 and 5% of what leaves it, counted, so that the test can tell
    # that packets were dropped.
    nft_in(set_no, 2, """
table inet wftloss {
  chain input { type filter hook input priority 0; policy accept;
                iifname "eth0" numgen random mod 100 < 5 counter drop; }
  chain output { type filter hook output priority 0; policy accept;
                 oifname "eth0" numgen random mod 100 < 5 counter drop; }
}
""")
    try:
        conformance = os.path.join(BUILD, "tests", "conformance", "conformance_test")
        perf = os.path.join(BUILD, "benchmarks", "weft-perf")
        start = time.monotonic()
        results = mh.weftrun_on_hosts(BUILD, set_no, 2, 2, PORTS["loss"],
                                      [conformance, "[all_reduce],[broadcast]"])
        text = mh.all_output(results)
        check(all(rc == 0 for rc, _ in results),
              f"conformance on 2 hosts x 2 ranks with 5% loss failed:\n{text}")
        mh.check_conformance_ran(text, 2, "2 hosts x 2 ranks, 5% loss")
        print(f"ok: conformance [all_reduce],[broadcast] with 5% loss "
              f"({time.monotonic() - start:.1f} s)")
        start = time.monotonic()
        results = mh.weftrun_on_hosts(
            BUILD, set_no, 2, 2, PORTS["loss"] + 100,
            [perf, "all", "-b", "8", "-e", "1M", "-f", "16", "-n", "3", "-w", "1", "-c", "1"])
        text = mh.all_output(results)
        check(all(rc == 0 for rc, _ in results), f"weft-perf with 5% loss failed:\n{text}")
        check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
        print(f"ok: weft-perf all, checked, with 5% loss "
              f"({time.monotonic() - start:.1f} s)")
        counters = subprocess.run(["ip", "netns", "exec", f"wft{set_no}h2", "nft", "list",
                                   "table", "inet", "wftloss"], capture_output=True, text=True)
        dropped = [int(n) for n in re.findall(r"counter packets (\d+)", counters.stdout)]
        check(len(dropped) == 2 and all(n > 0 for n in dropped),
              f"nftables dropped nothing both ways: {counters.stdout}{counters.stderr}")
        print(f"ok: nftables dropped {dropped[0]} packets in and {dropped[1]} out of host 2")
    finally:
        subprocess.run(["ip", "netns", "exec", f"wft{set_no}h2", "nft", "delete", "table", "inet",
                        "wftloss"], capture_output=True)
    tables = subprocess.run(["ip", "netns", "exec", f"wft{set_no}h2", "nft", "list", "tables"],
                            capture_output=True, text=True).stdout
    check("wftloss" not in tables, f"the nftables table outlived the test: {tables}")
    return 0


# ---- link_down


def case_link_down(set_no):
    netns("up", set_no, 2)
    timeout_s = 5
    specs = worker_spec(set_no, "link_down", [2, 2], "loop", 64 * 1024,
                        {"WEFT_TIMEOUT": str(timeout_s)}, timeout=90)
    hosts = [Host(set_no, h + 1, spec) for h, spec in enumerate(specs)]
    veth = f"wft{set_no}v2"  # host 2's end on the bridge
    try:
        # Mid-job: every rank has done 10 checked all_reduces.
        deadline = time.monotonic() + 60
        for h in hosts:
            h.wait_for(r"world step 9 ok", deadline, count=2)
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        down_at = time.monotonic()
        print(f"ok: 4 ranks ran 10 all_reduces; {veth} down")
        # The first failure, then the link comes back: too late for the job.
        bound = timeout_s + 10
        first = None
        try:
            first = hosts[0].wait_for(r"^\[\d\] ERROR", down_at + bound)[0]
        finally:
            subprocess.run(["ip", "link", "set", veth, "up"], check=True)
        print(f"ok: first failure {time.monotonic() - down_at:.1f} s after the link went down; "
              f"link up again: {first.strip()}")
        results = finish_all(hosts, bound + 20)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], capture_output=True)
    outputs = rank_outputs(results)
    text = mh.all_output(results)
    check(len(outputs) == 4 and all(rc != 0 for rc, _ in results),
          f"not every host failed:\n{text}")
    for i, out in enumerate(outputs):
        check("MISMATCH" not in out, f"rank {i} got a wrong result:\n{out}")
        err = re.search(r"^ERROR (\w+) after ([\d.]+) s without progress.*$", out, re.M)
        check(err is not None, f"rank {i} did not fail with a weft error:\n{out}")
        check(err.group(1) in ("Timeout", "PeerLost"),
              f"rank {i} failed with {err.group(1)}, not Timeout or PeerLost:\n{out}")
        check(re.search(r'rank \d/4 group "world" all_reduce #\d+', err.group(0)) is not None,
              f"rank {i}'s error does not name rank, group, op and sequence number:\n{out}")
        check(re.search(r"rank \d", err.group(0).split("all_reduce", 1)[1]) is not None,
              f"rank {i}'s error does not name a peer:\n{out}")
        check(float(err.group(2)) <= timeout_s + 10,
              f"rank {i} failed {err.group(2)} s after its last all_reduce (WEFT_TIMEOUT="
              f"{timeout_s}):\n{out}")
        after = out[err.end():]
        check(" ok" not in after, f"rank {i} went on after its error:\n{out}")
        print(f"   {err.group(0)}")
    print("ok: every rank failed with Timeout/PeerLost naming peer, op and #seq within "
          f"WEFT_TIMEOUT + 10 s; none went on after the link came back")
    return 0


# ---- shm_full


def shm_fails(results, where, both_local):
    """Every rank failed; host 1's ranks with the full /dev/shm's message (one may name its
    peer's), no SIGBUS, no wrong result."""
    text = mh.all_output(results)
    check(all(rc != 0 for rc, _ in results), f"{where}: not every host failed:\n{text}")
    outputs = rank_outputs(results)
    for i, out in enumerate(outputs):
        check("MISMATCH" not in out, f"{where}: rank {i} got a wrong result:\n{out}")
        check("ERROR" in out, f"{where}: rank {i} did not fail with a weft error (crash?):\n{out}")
    host1 = "\n".join(r["out"] for r in results[0][1])
    full = host1.count("/dev/shm is too small: no room for 2.0 MiB")
    check(full >= 1 and "WEFT_SHM=0" in host1,
          f"{where}: host 1's ranks do not say that /dev/shm is full, the size and WEFT_SHM=0:\n"
          f"{host1}")
    if both_local:
        # The other rank names the failure, unless the rank that ran out was rank 0, which hosts
        # the store and takes it along when it exits: then its peer may learn only that the
        # store closed, or reset when rank 0 left with bytes unread (a known gap:
        # docs/reliability.md, "Found, not fixed").
        named = host1.count("could not make its shared-memory segment")
        store_gone = 0
        if "-r0\": Io: /dev/shm is too small" in host1:
            store_gone = len(re.findall(
                r"store \S+ \S+: PeerLost: connection (?:closed|reset) by peer", host1))
        check(full + named + store_gone >= 2,
              f"{where}: a rank of host 1 gave another reason:\n{host1}")
    for out in results[0][1]:
        waited = re.search(r"ERROR \w+ after ([\d.]+) s without progress", out["out"])
        check(waited and float(waited.group(1)) < 20,
              f"{where}: a rank of host 1 took until its timeout:\n{out['out']}")


def case_shm_full(set_no):
    netns("up", set_no, 2)
    # World group fails: room for one 2 MiB segment in host 1's 3 MiB /dev/shm, not two.
    specs = worker_spec(set_no, "shm_full", [2, 2], "groups", 1024, {"WEFT_TIMEOUT": "60"})
    start = time.monotonic()
    hosts = [Host(set_no, 1, specs[0], shm_size="3M"), Host(set_no, 2, specs[1])]
    results = finish_all(hosts, 60)
    shm_fails(results, "3 MiB /dev/shm", both_local=True)
    print(f"ok: a 3 MiB /dev/shm fails every rank in {time.monotonic() - start:.1f} s naming "
          "/dev/shm, the size and WEFT_SHM=0; no SIGBUS, nothing left")
    print("   " + next(line for line in mh.all_output(results).splitlines()
                       if "/dev/shm is too small" in line).strip())

    # The world fits in 7 MiB (two segments of 2 MiB), a second group later does not.
    specs = worker_spec(set_no, "shm_full", [2, 2], "groups", 1024, {"WEFT_TIMEOUT": "60"})
    for s in specs:
        s["ranks"] = [dict(r, env=dict(r["env"], MASTER_PORT=str(PORTS["shm_full"] + 100)))
                      for r in s["ranks"]]
    start = time.monotonic()
    hosts = [Host(set_no, 1, specs[0], shm_size="7M"), Host(set_no, 2, specs[1])]
    results = finish_all(hosts, 60)
    shm_fails(results, "7 MiB /dev/shm, second group", both_local=False)
    for i, out in enumerate(rank_outputs(results)):
        check("world step 1 ok" in out, f"rank {i}: the world group did not run first:\n{out}")
        check("group step" not in out, f"rank {i}: the second group ran:\n{out}")
    print(f"ok: with 7 MiB the world runs and a later group fails in "
          f"{time.monotonic() - start:.1f} s with the same error")

    # WEFT_SHM=0: the way out the error names.
    specs = worker_spec(set_no, "shm_full", [2, 2], "groups", 1024,
                        {"WEFT_TIMEOUT": "60", "WEFT_SHM": "0",
                         "MASTER_PORT": str(PORTS["shm_full"] + 200)})
    hosts = [Host(set_no, 1, specs[0], shm_size="3M"), Host(set_no, 2, specs[1])]
    results = finish_all(hosts, 60)
    check(all(rc == 0 for rc, _ in results) and
          all("group step 2 ok" in out for out in rank_outputs(results)),
          f"WEFT_SHM=0 on a 3 MiB /dev/shm failed:\n{mh.all_output(results)}")
    print("ok: WEFT_SHM=0 runs on the 3 MiB /dev/shm")
    return 0


# ---- nofile


TIGHT_NOFILE = int(os.environ.get("TIGHT_NOFILE", "12"))


def case_nofile(set_no):
    netns("up", set_no, 2)
    perf = os.path.join(BUILD, "benchmarks", "weft-perf")
    program = [perf, "all", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-c", "1"]
    ulimit = ["sh", "-c", 'ulimit -n "$0" && exec "$@"']
    start = time.monotonic()
    results = mh.weftrun_on_hosts(BUILD, set_no, 2, 4, PORTS["nofile"], program,
                                  wrap=ulimit + ["64"])
    text = mh.all_output(results)
    check(all(rc == 0 for rc, _ in results), f"2 hosts x 4 ranks under ulimit -n 64 failed:\n{text}")
    check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
    print(f"ok: 2 hosts x 4 ranks under ulimit -n 64 ({time.monotonic() - start:.1f} s)")

    start = time.monotonic()
    # On the ranks only: weftrun itself needs more than a rank has room for here.
    results = mh.weftrun_on_hosts(BUILD, set_no, 2, 4, PORTS["nofile"] + 100,
                                  ulimit + [str(TIGHT_NOFILE)] + program)
    elapsed = time.monotonic() - start
    text = mh.all_output(results)
    check(all(rc != 0 for rc, _ in results), f"ulimit -n {TIGHT_NOFILE} did not fail:\n{text}")
    check(f"too many open files: RLIMIT_NOFILE is {TIGHT_NOFILE}" in text and "ulimit -n" in text,
          f"no rank names RLIMIT_NOFILE and ulimit -n:\n{text}")
    check("Segmentation fault" not in text and "core dumped" not in text,
          f"a rank crashed:\n{text}")
    check(elapsed < 30, f"ulimit -n {TIGHT_NOFILE} took {elapsed:.1f} s to fail (WEFT_TIMEOUT is 60 s)")
    line = next(l for l in text.splitlines() if f"RLIMIT_NOFILE is {TIGHT_NOFILE}" in l)
    print(f"ok: ulimit -n {TIGHT_NOFILE} fails every rank in {elapsed:.1f} s:\n   {line.strip()}")
    return 0


def leftovers(set_no):
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    check(f"wft{set_no}h" not in names, f"namespaces left behind:\n{names}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    check(f"wft{set_no}" not in links, f"links left behind:\n{links}")
    # This run's ranks and launchers carry its job id (other tests run beside it).
    mine = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"WEFT_JOB_ID={mh.JOB_ID}\0".encode() in f.read() + b"\0":
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        args = c.read().replace(b"\0", b" ").decode(errors="replace")
                    mine.append(f"{pid} {args}")
        except OSError:
            pass  # gone meanwhile
    check(not mine, "processes left behind:\n" + "\n".join(mine))
    if shutil.which("nft"):
        tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        check("wftloss" not in tables, f"an nftables table left in the root namespace: {tables}")
    mh.no_segments_left(f"set {set_no}")


BUILD = None


def main():
    global BUILD
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
        return 0
    if len(sys.argv) != 3 or sys.argv[1] not in SETS:
        print(__doc__, file=sys.stderr)
        return 2
    case, BUILD = sys.argv[1], os.path.abspath(sys.argv[2])
    probe = subprocess.run([mh.NETNS, "check"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(probe.stdout + probe.stderr)
        return 77
    set_no = SETS[case]
    rc = 0
    try:
        try:
            rc = {"loss": case_loss, "link_down": case_link_down, "shm_full": case_shm_full,
                  "nofile": case_nofile}[case](set_no)
        finally:
            netns("down", set_no)
        leftovers(set_no)
    except Failure as f:
        print(f"FAIL: {f}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
