#!/usr/bin/env python3
"""weft across hosts: hosts made of network namespaces (tests/support/netns-hosts), each with its
own hostname, address and /dev/shm, joined by a bridge. Shared memory inside a host, TCP between.

  multi_host_test.py CASE BUILD_DIR

CASE is one of:
  weftrun      2 hosts x 2 ranks, `weftrun --nnodes 2 --node-rank R --master-addr` once per host
               (as users launch), the conformance suite (WEFT_TEST_LAUNCHER=env) and weft-perf.
  torchrun     3 hosts x {1, 2, 3} ranks from torchrun's variables (MASTER_ADDR on the first
               host), the conformance suite on the uneven world of 6.
  ifname       WEFT_SOCKET_IFNAME=eth0 on every host works; an interface that does not exist
               fails at once naming it and the interfaces there are.
  loopback     the ranks of host 1 publish 127.0.0.1 (WEFT_HOST_ADDR): every rank fails within
               seconds, not after WEFT_TIMEOUT: host 2's ranks name the address, host 1 and the
               variables to set; host 1's ranks (waiting for connections) name who gave up.
  token        the store open to the network: without WEFT_STORE_TOKEN weft warns once (what is
               exposed, how to set the token); with it, a client on another host without the
               token has its connection closed after VALIDATE while the job runs on, correct.
  shm_apart    one machine, two /dev/shm (two ranks in a mount namespace with their own tmpfs,
               same hostname and network): the job runs, TCP between the two halves, and weft
               says so once per process.
Each case checks that nothing is left behind: namespaces, links, /dev/shm segments.
Exit 0 on success, 1 on failure, 77 (meson's "skipped") without root or namespaces.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS = os.path.join(HERE, "..", "support", "netns-hosts")


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def netns(*args, **kw):
    return subprocess.run([NETNS] + [str(a) for a in args], check=True, **kw)


def set_id(case):
    # One subnet per case, so that cases run in parallel without sharing names.
    return {"weftrun": 201, "torchrun": 202, "ifname": 203, "loopback": 204, "token": 205}[case]


def spawn_ranks(spec):
    """Runs inside one host: starts every rank of `spec` at once, waits, prints each one's output
    as JSON on stdout (the parent reads it), exits with the worst exit code."""
    procs = []
    for r in spec["ranks"]:
        env = dict(os.environ)
        env.update(r["env"])
        procs.append(subprocess.Popen(spec["cmd"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    worst = 0
    for p in procs:
        out, _ = p.communicate(timeout=spec.get("timeout", 240))
        outputs.append({"rc": p.returncode, "out": out})
        if p.returncode != 0:
            worst = p.returncode if worst == 0 else worst
    print(json.dumps(outputs))
    sys.exit(1 if worst else 0)


def start_host(set_no, host, spec):
    """Starts a host's ranks (one `netns-hosts exec`), returns the Popen."""
    cmd = [NETNS, "exec", str(set_no), str(host), sys.executable, os.path.abspath(__file__),
           "spawn", json.dumps(spec)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs, timeout=300):
    """Waits for every host; returns [(rc, [rank outputs])] in host order."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        try:
            ranks = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
        except (ValueError, IndexError):
            ranks = []
        if not ranks:
            ranks = [{"rc": p.returncode, "out": out + err}]
        results.append((p.returncode, ranks))
    return results


def torchrun_env(rank, world, local_rank, local_world, master, port, extra=None):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
           "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": master, "MASTER_PORT": str(port),
           "WEFT_TIMEOUT": "60", "WEFT_JOB_ID": JOB_ID}
    env.update(extra or {})
    return env


def layout_env(hosts_ranks, master, port, extra_by_host=None):
    """Per host, the torchrun variables of its ranks (global ranks in host order)."""
    specs = []
    rank = 0
    world = sum(hosts_ranks)
    for h, n in enumerate(hosts_ranks):
        extra = (extra_by_host or {}).get(h + 1, {})
        specs.append([torchrun_env(rank + i, world, i, n, master, port, extra) for i in range(n)])
        rank += n
    return specs


def all_output(results):
    return "\n".join(f"--- host {h + 1} rank output {i}:\n{r['out']}"
                     for h, (_, ranks) in enumerate(results) for i, r in enumerate(ranks))


JOB_ID = f"hoststest{os.getpid()}"


def no_segments_left(tag):
    # Only this test's job: other tests of the suite run beside it.
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"weft-{JOB_ID}-")]
    check(not left, f"{tag}: /dev/shm segments left behind: {left}")


def nothing_left(set_no):
    """After `netns-hosts down`: no namespace or link of the set is left (fault_kill_test.py too)."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    check(f"wft{set_no}h" not in names, f"namespaces left behind:\n{names}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    check(f"wft{set_no}" not in links, f"links left behind:\n{links}")


def check_conformance_ran(text, families, where):
    """Every rank's Catch2 summary says all passed, with at least one test case per family."""
    import re
    runs = re.findall(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    check(runs and all(int(cases) >= families for _, cases in runs),
          f"{where}: the conformance suite did not run {families} families on every rank:\n{text}")


def case_weftrun(build, set_no):
    netns("up", set_no, 2)
    master = f"10.77.{set_no}.1"
    weftrun = os.path.join(build, "tools", "weftrun")
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    perf = os.path.join(build, "benchmarks", "weft-perf")
    families = "[all_reduce],[all_gather],[reduce_scatter],[broadcast],[p2p]"
    for program in ([conformance, families], [perf, "all", "-b", "8", "-e", "4M", "-f", "8",
                                              "-n", "3", "-w", "1", "-c", "1"]):
        procs = []
        for node in range(2):
            cmd = [weftrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                   "--master-addr", master, "--master-port", "29611", "--no-prefix"] + program
            env = {"WEFT_TIMEOUT": "60", "WEFT_TEST_LAUNCHER": "env", "WEFT_JOB_ID": JOB_ID}
            procs.append(start_host(set_no, node + 1, {"cmd": cmd, "ranks": [{"env": env}]}))
        results = finish(procs)
        text = all_output(results)
        check(all(rc == 0 for rc, _ in results),
              f"{os.path.basename(program[0])} on 2 hosts x 2 ranks failed:\n{text}")
        if program[0] == conformance:
            check_conformance_ran(text, 5, "2 hosts x 2 ranks")
        if program[0] == perf:
            check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
            check("without authentication" in text and "WEFT_STORE_TOKEN" in text,
                  f"no warning about the store open to the network without a token:\n{text}")
        print(f"ok: {os.path.basename(program[0])} on 2 hosts x 2 ranks under weftrun")


def case_torchrun(build, set_no):
    netns("up", set_no, 3)
    master = f"10.77.{set_no}.1"
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    procs = []
    for h, envs in enumerate(layout_env([1, 2, 3], master, 29612)):
        for e in envs:
            e["WEFT_TEST_LAUNCHER"] = "env"
        spec = {"cmd": [conformance, "[all_reduce],[all_gather],[broadcast]"],
                "ranks": [{"env": e} for e in envs]}
        procs.append(start_host(set_no, h + 1, spec))
    results = finish(procs)
    text = all_output(results)
    check(all(rc == 0 for rc, _ in results), f"3 hosts x {{1, 2, 3}} ranks failed:\n{text}")
    check_conformance_ran(text, 3, "3 hosts x {1, 2, 3} ranks")
    print("ok: conformance on 3 hosts x {1, 2, 3} ranks from torchrun's variables")


def case_ifname(build, set_no):
    netns("up", set_no, 2)
    master = f"10.77.{set_no}.1"
    perf = os.path.join(build, "benchmarks", "weft-perf")
    args = [perf, "all_reduce", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1"]
    procs = [start_host(set_no, h + 1, {"cmd": args, "ranks": [{"env": e} for e in envs]})
             for h, envs in enumerate(layout_env([2, 2], master, 29613,
                                                 {1: {"WEFT_SOCKET_IFNAME": "eth0"},
                                                  2: {"WEFT_SOCKET_IFNAME": "eth0"}}))]
    results = finish(procs)
    check(all(rc == 0 for rc, _ in results),
          f"WEFT_SOCKET_IFNAME=eth0 failed:\n{all_output(results)}")
    print("ok: WEFT_SOCKET_IFNAME=eth0 on 2 hosts x 2 ranks")

    start = time.monotonic()
    procs = [start_host(set_no, h + 1, {"cmd": args, "ranks": [{"env": e} for e in envs]})
             for h, envs in enumerate(layout_env([1, 1], master, 29614,
                                                 {1: {"WEFT_SOCKET_IFNAME": "nosuch0"},
                                                  2: {"WEFT_SOCKET_IFNAME": "nosuch0"}}))]
    results = finish(procs)
    elapsed = time.monotonic() - start
    text = all_output(results)
    check(all(rc != 0 for rc, _ in results), f"WEFT_SOCKET_IFNAME=nosuch0 did not fail:\n{text}")
    check('WEFT_SOCKET_IFNAME="nosuch0": this host has no interface of that name' in text and
          "eth0=10.77." in text, f"the error does not name the interface and the choices:\n{text}")
    check(elapsed < 30, f"the bad interface took {elapsed:.1f} s to fail (WEFT_TIMEOUT is 60 s)")
    print(f"ok: a missing interface fails at once ({elapsed:.1f} s) naming the interfaces there")


def case_loopback(build, set_no):
    netns("up", set_no, 2)
    master = f"10.77.{set_no}.1"
    perf = os.path.join(build, "benchmarks", "weft-perf")
    args = [perf, "all_reduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    start = time.monotonic()
    procs = [start_host(set_no, h + 1, {"cmd": args, "ranks": [{"env": e} for e in envs]})
             for h, envs in enumerate(layout_env([2, 2], master, 29615,
                                                 {1: {"WEFT_HOST_ADDR": "127.0.0.1"}}))]
    results = finish(procs)
    elapsed = time.monotonic() - start
    text = all_output(results)
    check(all(rc != 0 for rc, _ in results), f"a loopback address across hosts did not fail:\n{text}")
    check("runs on another host but published the loopback address 127.0.0.1" in text,
          f"no rank names the loopback address:\n{text}")
    check("WEFT_SOCKET_IFNAME" in text and "WEFT_HOST_ADDR" in text,
          f"the error does not say which variable to set:\n{text}")
    check(f"on rank 0's host (wft{set_no}-host1)" in text,
          f"the error does not name the peer's host:\n{text}")
    host1 = "\n".join(r["out"] for r in results[0][1])
    check("gave up on connection set-up" in host1,
          f"host 1's ranks do not say that a peer gave up:\n{host1}")
    check(elapsed < 30, f"took {elapsed:.1f} s to fail (WEFT_TIMEOUT is 60 s): not fast")
    print(f"ok: a loopback address published across hosts fails in {elapsed:.1f} s, naming it")


def intrude(address, port, seconds):
    """Runs in a host: connects to the store without the token as soon as it listens, sends
    VALIDATE and a SET; prints "closed" when the server closes the connection, else what
    happened."""
    import socket
    import struct
    deadline = time.monotonic() + seconds
    while True:
        try:
            s = socket.create_connection((address, port), timeout=2)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"never connected: {e}")
                return
            time.sleep(0.02)
    s.settimeout(10)
    key, value = b"intruder", b"was here"
    s.sendall(struct.pack("<BI", 0, 0x3C85F7CE))
    try:
        s.sendall(struct.pack("<BQ", 1, len(key)) + key + struct.pack("<Q", len(value)) + value)
        data = s.recv(64)
        print("closed" if data == b"" else f"answered {data!r}")
    except ConnectionResetError:
        print("closed")
    except socket.timeout:
        print("not closed within 10 s")


def case_token(build, set_no):
    netns("up", set_no, 2)
    master = f"10.77.{set_no}.1"
    weftrun = os.path.join(build, "tools", "weftrun")
    perf = os.path.join(build, "benchmarks", "weft-perf")
    program = [perf, "all_reduce", "-b", "1M", "-e", "16M", "-f", "2", "-n", "20", "-w", "2",
               "-c", "1"]
    procs = []
    for node in range(2):
        cmd = [weftrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
               "--master-addr", master, "--master-port", "29617", "--no-prefix"] + program
        env = {"WEFT_TIMEOUT": "60", "WEFT_STORE_TOKEN": "s3cret-of-the-job"}
        procs.append(start_host(set_no, node + 1, {"cmd": cmd, "ranks": [{"env": env}]}))
    intruder = subprocess.run(
        [NETNS, "exec", str(set_no), "2", sys.executable, os.path.abspath(__file__), "intrude",
         master, "29617"], capture_output=True, text=True, timeout=60)
    results = finish(procs)
    text = all_output(results)
    check(intruder.stdout.strip() == "closed",
          f"a client without the token was not turned away: {intruder.stdout}{intruder.stderr}")
    check(all(rc == 0 for rc, _ in results), f"the job failed beside the intruder:\n{text}")
    check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
    check("without authentication" not in text, f"warned although the token was set:\n{text}")
    print("ok: with WEFT_STORE_TOKEN a client without it is closed out; the job is unharmed")


def case_shm_apart(build):
    perf = os.path.join(build, "benchmarks", "weft-perf")
    args = [perf, "all", "-b", "8", "-e", "1M", "-f", "16", "-n", "2", "-w", "1", "-c", "1"]
    envs = layout_env([2, 2], "127.0.0.1", 29616)[0] + layout_env([2, 2], "127.0.0.1", 29616)[1]
    for e in envs:
        e["WEFT_LOG"] = "warn"
    here = subprocess.Popen([sys.executable, os.path.abspath(__file__), "spawn",
                             json.dumps({"cmd": args, "ranks": [{"env": e} for e in envs[:2]]})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The same machine, hostname and network; only /dev/shm differs.
    apart = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$@"', "sh", sys.executable,
         os.path.abspath(__file__), "spawn",
         json.dumps({"cmd": args, "ranks": [{"env": e} for e in envs[2:]]})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = finish([here, apart])
    text = all_output(results)
    check(all(rc == 0 for rc, _ in results), f"two /dev/shm on one machine failed:\n{text}")
    check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
    notes = text.count("see another /dev/shm")
    check(notes == 4, f"expected the note once per rank (4), got {notes}:\n{text}")
    print("ok: ranks with separate /dev/shm on one machine use TCP between them, said once each")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "spawn":
        spawn_ranks(json.loads(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "intrude":
        intrude(sys.argv[2], int(sys.argv[3]), 30)
        return 0
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    case, build = sys.argv[1], os.path.abspath(sys.argv[2])
    probe = subprocess.run([NETNS, "check"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(probe.stdout + probe.stderr)
        return 77
    try:
        if case == "shm_apart":
            case_shm_apart(build)
            no_segments_left(case)
            return 0
        set_no = set_id(case)
        try:
            {"weftrun": case_weftrun, "torchrun": case_torchrun, "ifname": case_ifname,
             "loopback": case_loopback, "token": case_token}[case](build, set_no)
        finally:
            netns("down", set_no)
        nothing_left(set_no)
        no_segments_left(case)
    except Failure as f:
        print(f"FAIL: {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
