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
  hierarchical 2 hosts x 2 ranks and 3 hosts x 2 ranks under weftrun: all_reduce,
               reduce_scatter, all_gather and broadcast checked against numpy, and each rank's
               flight recorder shows the planner ran hierarchically what it should (large
               messages; broadcasts whose flat tree crosses hosts more than H-1 times), and with
               WEFT_ALGO=hierarchical everything; the conformance suite with
               WEFT_ALGO=hierarchical on 2 x 2.
  symmetric    symmetric buffers across hosts (docs/symmetric-memory.md): tests/hosts/
               symmetric_check on 2 x 2, 3 x 2 and 2 x 1 ranks (all_reduce, reduce_scatter,
               all_gather in and out of place, broadcast from every root, float32 sum, int32 max
               and sum, 0 to 1.2 MB, off the 8-byte grid; each checked element by element, and
               the flight recorder shows every one ran zero-copy hierarchically, a reduce not),
               on hosts of 2 and 1 ranks (the message path), then the conformance suite with
               every tensor in a symmetric buffer (WEFT_TEST_SYMMETRIC=1) on 2 x 2; no host's
               /dev/shm keeps a segment.
  ucx          2 hosts x 2 ranks over the UCX backend (WEFT_BACKEND=ucx), with UCX's own
               choice of transports and with UCX_TLS=tcp: the conformance suite and weft-perf.
               Skipped (77) where the UCX module is not built.
  shm_apart    one machine, two /dev/shm (two ranks in a mount namespace with their own tmpfs,
               same hostname and network): the job runs, TCP between the two halves, and weft
               says so once per process.
  soak         2 hosts x 4 ranks of weft-soak for 20 s, one weftrun per host: every host exits 0,
               rank 0's verdict is PASS with every result checked (its --report says 8 ranks,
               steps and elements checked), and groups spanned the hosts (recv_any refused).
  mpirun       2 hosts x 2 ranks under one Open MPI `mpirun --host` started in host 1 (its
               daemons started through `netns-hosts rsh`): the conformance suite and weft-perf
               with every result checked; each rank took its rank from Open MPI's variables,
               sits on the host asked for, and (WEFT_LOG=info) reaches its host's ranks over
               shared memory and the others over TCP. MASTER_ADDR naming host 2 fails at
               once, rank 0 saying it is not its host's address. Skips (77) without Open MPI.
  mpirun_uneven  3 hosts x {1, 2, 3} ranks under mpirun --host: the conformance suite on the
               uneven world of 6, the same routes checked. Skips (77) without Open MPI.
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


class Skip(Exception):
    """The machine lacks what the case needs: exit 77 after printing why."""


def check(cond, what):
    if not cond:
        raise Failure(what)


def netns(*args, **kw):
    return subprocess.run([NETNS] + [str(a) for a in args], check=True, **kw)


def set_id(case):
    # One subnet per case, so that cases run in parallel without sharing names.
    return {"weftrun": 201, "torchrun": 202, "ifname": 203, "loopback": 204, "token": 205,
            "soak": 180, "mpirun": 181, "mpirun_uneven": 182, "hierarchical": 206,
            "ucx": 207, "symmetric": 208}[case]


def python_command():
    """The Python that runs weft's package in a rank: meson's (WEFT_TEST_PYTHON), behind `env`
    with what a sanitizer build needs (WEFT_TEST_PYTHON_ENV: the runtime preloaded, no leak check
    of the interpreter), or this one."""
    python = os.environ.get("WEFT_TEST_PYTHON", sys.executable)
    extra = [v for v in os.environ.get("WEFT_TEST_PYTHON_ENV", "").split(";") if v]
    return ["env"] + extra + [python] if extra else [python]


def spawn_ranks(spec):
    """Runs inside one host: starts every rank of `spec` at once, waits, prints each one's output
    as JSON on stdout (the parent reads it), exits with the worst exit code.

    With "stream": true, it also relays every line as the rank prints it ("[i] line", for a
    parent that waits on what the ranks say), and before the JSON prints "SHM-LEFT: [names]", the
    weft-* segments left in this host's /dev/shm once its ranks are gone (the host's tmpfs dies
    with its last process, so only a process inside can look)."""
    import threading
    procs = []
    for r in spec["ranks"]:
        env = dict(os.environ)
        env.update(r["env"])
        procs.append(subprocess.Popen(r.get("cmd", spec["cmd"]), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    texts = [[] for _ in procs]
    relays = []
    if spec.get("stream"):
        lock = threading.Lock()

        def relay(i, p):
            for line in p.stdout:
                texts[i].append(line)
                with lock:
                    print(f"[{i}] {line}", end="" if line.endswith("\n") else "\n", flush=True)

        relays = [threading.Thread(target=relay, args=(i, p)) for i, p in enumerate(procs)]
        for t in relays:
            t.start()
    outputs = []
    worst = 0
    for i, p in enumerate(procs):
        if spec.get("stream"):
            p.wait(timeout=spec.get("timeout", 240))
            relays[i].join()
            out = "".join(texts[i])
        else:
            out, _ = p.communicate(timeout=spec.get("timeout", 240))
        outputs.append({"rc": p.returncode, "out": out})
        if p.returncode != 0:
            worst = p.returncode if worst == 0 else worst
    if spec.get("stream"):
        print("SHM-LEFT: " + json.dumps(sorted(n for n in os.listdir("/dev/shm")
                                               if n.startswith("weft-"))), flush=True)
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


# The conformance suite's test cases (`conformance_test --list-tests`): the cases that run the
# whole suite check that every rank ran all of them.
CONFORMANCE_CASES = 12


def check_conformance_ran(text, families, where):
    """Every rank's Catch2 summary says all passed, with at least one test case per family."""
    import re
    runs = re.findall(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)", text)
    check(runs and all(int(cases) >= families for _, cases in runs),
          f"{where}: the conformance suite did not run {families} families on every rank:\n{text}")


def weftrun_on_hosts(build, set_no, hosts, per_host, port, program, env=None, wrap=()):
    """One `weftrun --nnodes HOSTS --node-rank R` per host, as users launch, running `program`
    on `per_host` ranks each; `wrap` goes before weftrun (e.g. a shell that sets a ulimit).
    Returns finish()'s results."""
    weftrun = os.path.join(build, "tools", "weftrun")
    procs = []
    for node in range(hosts):
        cmd = list(wrap) + [weftrun, "--nnodes", str(hosts), "--node-rank", str(node),
                            "--nproc-per-node", str(per_host), "--master-addr",
                            f"10.77.{set_no}.1", "--master-port", str(port), "--no-prefix"]
        rank_env = {"WEFT_TIMEOUT": "60", "WEFT_TEST_LAUNCHER": "env", "WEFT_JOB_ID": JOB_ID}
        rank_env.update(env or {})
        procs.append(start_host(set_no, node + 1, {"cmd": cmd + list(program),
                                                   "ranks": [{"env": rank_env}]}))
    return finish(procs)


def case_weftrun(build, set_no):
    netns("up", set_no, 2)
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    perf = os.path.join(build, "benchmarks", "weft-perf")
    for program in ([conformance, "[conformance]"], [perf, "all", "-b", "8", "-e", "4M", "-f", "8",
                                              "-n", "3", "-w", "1", "-c", "1"]):
        results = weftrun_on_hosts(build, set_no, 2, 2, 29611, program)
        text = all_output(results)
        check(all(rc == 0 for rc, _ in results),
              f"{os.path.basename(program[0])} on 2 hosts x 2 ranks failed:\n{text}")
        if program[0] == conformance:
            check_conformance_ran(text, CONFORMANCE_CASES, "2 hosts x 2 ranks")
        if program[0] == perf:
            check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
            check("without authentication" in text and "WEFT_STORE_TOKEN" in text,
                  f"no warning about the store open to the network without a token:\n{text}")
        print(f"ok: {os.path.basename(program[0])} on 2 hosts x 2 ranks under weftrun")


def case_ucx(build, set_no):
    plugin_dir = os.environ.get("WEFT_TEST_UCX_DIR") or os.path.join(build, "backends", "ucx")
    if not os.path.exists(os.path.join(plugin_dir, "libweft-backend-ucx.so")):
        raise Skip(f"skipped: the UCX backend is not built ({plugin_dir} has no "
                   "libweft-backend-ucx.so: install libucx-dev and rebuild)")
    netns("up", set_no, 2)
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    perf = os.path.join(build, "benchmarks", "weft-perf")
    port = 29630
    for tls in (None, "tcp"):
        env = {"WEFT_BACKEND": "ucx", "WEFT_PLUGIN_PATH": plugin_dir}
        if tls:
            env["UCX_TLS"] = tls
        for program in ([conformance, "[conformance]"], [perf, "all", "-b", "8", "-e", "4M", "-f", "8",
                                                  "-n", "3", "-w", "1", "-c", "1"]):
            port += 1
            results = weftrun_on_hosts(build, set_no, 2, 2, port, program, env)
            text = all_output(results)
            what = (f"{os.path.basename(program[0])} over UCX (UCX_TLS={tls or 'default'}) on 2 "
                    "hosts x 2 ranks")
            check(all(rc == 0 for rc, _ in results), f"{what} failed:\n{text}")
            if program[0] == conformance:
                check_conformance_ran(text, CONFORMANCE_CASES, what)
            else:
                checked = text.count("Out of bounds values")
                check(checked >= 10 and text.count("Out of bounds values : 0 OK") == checked,
                      f"{what}: not every collective reported 0 wrong:\n{text}")
                check("backend ucx ranks 4" in text, f"{what}: not run over UCX:\n{text}")
            print(f"ok: {what}")


def case_torchrun(build, set_no):
    netns("up", set_no, 3)
    master = f"10.77.{set_no}.1"
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    procs = []
    for h, envs in enumerate(layout_env([1, 2, 3], master, 29612)):
        for e in envs:
            e["WEFT_TEST_LAUNCHER"] = "env"
        spec = {"cmd": [conformance, "[conformance]"],
                "ranks": [{"env": e} for e in envs]}
        procs.append(start_host(set_no, h + 1, spec))
    results = finish(procs)
    text = all_output(results)
    check(all(rc == 0 for rc, _ in results), f"3 hosts x {{1, 2, 3}} ranks failed:\n{text}")
    check_conformance_ran(text, CONFORMANCE_CASES, "3 hosts x {1, 2, 3} ranks")
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


def need_open_mpi():
    """Open MPI's mpirun, or Skip: CI images may lack it (scripts/install-deps --optional)."""
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("skipped: mpirun is not installed (Open MPI: scripts/install-deps --optional)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    if "Open MPI" not in version.stdout + version.stderr:
        raise Skip(f"skipped: {mpirun} is not Open MPI's:\n{version.stdout}{version.stderr}")
    if " " in os.path.realpath(NETNS):
        # Open MPI splits plm_rsh_agent at spaces.
        raise Skip(f"skipped: the path {os.path.realpath(NETNS)} has a space, which "
                   f"--mca plm_rsh_agent cannot carry")


def mpirun(set_no, hosts_ranks, program, env, timeout=180):
    """Runs `program` under one Open MPI mpirun started inside host 1, with hosts_ranks[k - 1]
    ranks on host k (rank 0 on host 1). Open MPI starts its daemon (orted) on the other hosts
    through its ssh launcher, with `netns-hosts rsh` as the ssh; the daemons connect back to
    mpirun over the bridge. Returns (exit code, output: stdout and stderr interleaved)."""
    hosts = ",".join(f"10.77.{set_no}.{h + 1}:{n}" for h, n in enumerate(hosts_ranks))
    cmd = [NETNS, "exec", str(set_no), "1", "mpirun",
           # Open MPI refuses root unless told; the namespaces need root.
           "--allow-run-as-root",
           "--mca", "plm_rsh_agent", f"{os.path.realpath(NETNS)} rsh {set_no}",
           "--host", hosts, "-np", str(sum(hosts_ranks))]
    for name, value in env.items():
        cmd += ["-x", f"{name}={value}"]
    try:
        p = subprocess.run(cmd + program, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        # `netns-hosts down` (in main) kills what is left in the hosts.
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        raise Failure(f"mpirun ran past {timeout} s: {' '.join(program)}\n{out or ''}")
    return p.returncode, p.stdout


def mpirun_env(set_no, port, extra=None):
    # mpirun exports no host list, so rank 0's host is named; WEFT_JOB_ID tags /dev/shm names
    # so that no_segments_left finds this test's.
    env = {"MASTER_ADDR": f"10.77.{set_no}.1", "MASTER_PORT": str(port), "WEFT_TIMEOUT": "60",
           "WEFT_JOB_ID": JOB_ID}
    env.update(extra or {})
    return env


def check_routes(text, hosts_ranks, group, where):
    """Every rank's log (WEFT_LOG=info) names the ranks of its host as shared-memory peers and
    the others as TCP peers, for the group `group` spanning the world."""
    def listed(ranks):
        return ", ".join(map(str, ranks)) if ranks else "none"

    world = sum(hosts_ranks)
    first = 0
    for n in hosts_ranks:
        host = range(first, first + n)
        for r in host:
            line = (f'rank {r}/{world} group "{group}": shared memory with rank(s) '
                    f"{listed([p for p in host if p != r])}; TCP with rank(s) "
                    f"{listed([p for p in range(world) if p not in host])}")
            check(line in text, f"{where}: rank {r}'s log lacks \"{line}\":\n{text}")
        first += n


def check_hosts_of_ranks(text, set_no, hosts_ranks, where):
    """weft-perf's "Using devices" lines put ranks on the hosts mpirun was asked for."""
    import re
    rank = 0
    for h, n in enumerate(hosts_ranks):
        for _ in range(n):
            seen = re.search(rf"Rank +{rank} Group +0 Pid +\d+ on (\S+) device", text)
            check(seen and seen.group(1) == f"wft{set_no}-host{h + 1}",
                  f"{where}: weft-perf does not show rank {rank} on host {h + 1}:\n{text}")
            rank += 1


def case_mpirun(build, set_no):
    netns("up", set_no, 2)
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    perf = os.path.join(build, "benchmarks", "weft-perf")
    layout = [2, 2]
    # Catch2 colours its summary on a terminal, and mpirun relays output through a pty.
    rc, text = mpirun(set_no, layout,
                      [conformance, "--use-colour", "no",
                       "[conformance]"],
                      mpirun_env(set_no, 29619, {"WEFT_TEST_LAUNCHER": "env"}))
    check(rc == 0, f"conformance under mpirun on 2 hosts x 2 ranks exited {rc}:\n{text}")
    check_conformance_ran(text, CONFORMANCE_CASES, "mpirun, 2 hosts x 2 ranks")
    check(text.count("All tests passed") == 4, f"not every one of 4 ranks passed:\n{text}")
    print("ok: conformance on 2 hosts x 2 ranks under mpirun --host")

    rc, text = mpirun(set_no, layout,
                      [perf, "all", "-b", "8", "-e", "4M", "-f", "8", "-n", "3", "-w", "1",
                       "-c", "1"],
                      mpirun_env(set_no, 29620, {"WEFT_LOG": "info"}))
    check(rc == 0, f"weft-perf under mpirun on 2 hosts x 2 ranks exited {rc}:\n{text}")
    concluded = text.count("# Collective test concluded:")
    check(concluded >= 5 and text.count("Out of bounds values : 0 OK") == concluded,
          f"weft-perf did not report 0 wrong for each of its collectives:\n{text}")
    for r in range(4):
        check(f"rendezvous env:// (rank {r}/4, openmpi, store 10.77.{set_no}.1:29620)" in text,
              f"rank {r} did not take its rank from Open MPI's variables:\n{text}")
    check_hosts_of_ranks(text, set_no, layout, "mpirun, 2 hosts x 2 ranks")
    check_routes(text, layout, "world", "mpirun, 2 hosts x 2 ranks")
    print("ok: weft-perf on 2 hosts x 2 ranks under mpirun --host: every result right, "
          "shared memory inside each host, TCP between")

    # MASTER_ADDR naming host 2 while rank 0 runs on host 1 (the first slot): rank 0 fails at
    # once naming the address and the variable, and mpirun stops the others.
    start = time.monotonic()
    rc, text = mpirun(set_no, layout, [perf, "all_reduce", "-b", "8", "-e", "8", "-n", "1"],
                      mpirun_env(set_no, 29622, {"MASTER_ADDR": f"10.77.{set_no}.2"}))
    elapsed = time.monotonic() - start
    check(rc != 0, f"MASTER_ADDR of another host than rank 0's did not fail:\n{text}")
    check(f"10.77.{set_no}.2 is not an address of this host (wft{set_no}-host1), where rank 0 "
          f"runs: set MASTER_ADDR to rank 0's host" in text,
          f"rank 0 does not say that MASTER_ADDR is not its host's:\n{text}")
    check(elapsed < 30, f"took {elapsed:.1f} s to fail (WEFT_TIMEOUT is 60 s): not at once")
    print(f"ok: MASTER_ADDR naming another host than rank 0's fails in {elapsed:.1f} s, saying so")


def case_mpirun_uneven(build, set_no):
    netns("up", set_no, 3)
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    layout = [1, 2, 3]
    rc, text = mpirun(set_no, layout,
                      [conformance, "--use-colour", "no", "[conformance]"],
                      mpirun_env(set_no, 29621, {"WEFT_TEST_LAUNCHER": "env", "WEFT_LOG": "info"}))
    check(rc == 0, f"conformance under mpirun on 3 hosts x {{1, 2, 3}} ranks exited {rc}:\n{text}")
    check_conformance_ran(text, CONFORMANCE_CASES, "mpirun, 3 hosts x {1, 2, 3} ranks")
    check(text.count("All tests passed") == 6, f"not every one of 6 ranks passed:\n{text}")
    check_routes(text, layout, "world", "mpirun, 3 hosts x {1, 2, 3} ranks")
    print("ok: conformance on 3 hosts x {1, 2, 3} ranks under mpirun --host")


def sanitized(build):
    """Whether BUILD was configured with a sanitizer (meson's introspection of its options)."""
    with open(os.path.join(build, "meson-info", "intro-buildoptions.json")) as f:
        options = {o["name"]: o["value"] for o in json.load(f)}
    return options.get("b_sanitize", "none") != "none"


def case_soak(build, set_no):
    """2 hosts x 4 ranks of weft-soak, one weftrun per host (docs/reliability.md, "Soak")."""
    import re
    import shutil
    import tempfile
    netns("up", set_no, 2)
    master = f"10.77.{set_no}.1"
    weftrun = os.path.join(build, "tools", "weftrun")
    soak = os.path.join(build, "tests", "soak", "weft-soak")
    tmp = tempfile.mkdtemp(prefix="weft-hosts-soak-")
    report = os.path.join(tmp, "report.json")
    # 20 s: the warm-up (20 %, at least 5 s) leaves 15 s of samples against the baseline.
    program = [soak, "--seconds", "20", "--report", report]
    if sanitized(build):
        program += ["--max-bytes", "256K"]  # as tests/soak/meson.build does, for the same reason
    try:
        procs = []
        for node in range(2):
            cmd = [weftrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "4",
                   "--master-addr", master, "--master-port", "29618", "--no-prefix"] + program
            env = {"WEFT_TIMEOUT": "60", "WEFT_JOB_ID": JOB_ID}
            procs.append(start_host(set_no, node + 1, {"cmd": cmd, "ranks": [{"env": env}]}))
        results = finish(procs)
        text = all_output(results)
        for h, (rc, _) in enumerate(results):
            check(rc == 0, f"host {h + 1}'s weftrun exited {rc}:\n{text}")
        check("weft-soak: verdict: PASS (every result checked" in text,
              f"rank 0 did not give the verdict PASS with every result checked:\n{text}")
        with open(report) as f:
            summary = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check(summary["ranks"] == 8, f"the soak ran on {summary['ranks']} ranks, not 8:\n{text}")
    check(summary["verdict"] == "pass", f"the report's verdict is {summary['verdict']}:\n{text}")
    check(summary["steps"] > 0 and summary["elements_checked"] > 0,
          f"{summary['steps']} steps, {summary['elements_checked']} elements checked:\n{text}")
    # Groups spanning both hosts mix shared memory and TCP, where recv_any is refused and the
    # soak receives by sender instead: refusals show that the groups did span the hosts.
    refused = re.search(r"\d+ recv_any \((\d+) refused\)", text)
    check(refused and int(refused.group(1)) > 0,
          f"no recv_any was refused: did any group span both hosts?\n{text}")
    print(f"ok: weft-soak on 2 hosts x 4 ranks: {summary['steps']} steps in "
          f"{summary['seconds']} s, {summary['elements_checked']} elements checked, "
          f"{refused.group(1)} recv_any refused across hosts, verdict PASS")


def intrude(address, port):
    """Runs in a host while the job runs: connects to the store without the token, sends VALIDATE
    and a SET; prints "closed" when the server closes the connection, else what happened."""
    import socket
    import struct
    try:
        s = socket.create_connection((address, port), timeout=10)
    except OSError as e:
        print(f"never connected: {e}")
        return
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

    def weftrun_cmd(node):
        return [weftrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                "--master-addr", master, "--master-port", "29617", "--no-prefix"] + program

    env = {"WEFT_TIMEOUT": "60", "WEFT_STORE_TOKEN": "s3cret-of-the-job"}
    # Host 1's weftrun (it hosts the store) runs without the spawn wrapper, so that its lines
    # come as they are written: the intruder goes in once weft-perf has printed its column
    # header, i.e. after rendezvous, while the job runs; no polling of the port.
    host1 = subprocess.Popen([NETNS, "exec", str(set_no), "1"] + weftrun_cmd(0),
                             env=dict(os.environ, **env), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    host2 = start_host(set_no, 2, {"cmd": weftrun_cmd(1), "ranks": [{"env": env}]})
    head = []
    for line in host1.stdout:
        head.append(line)
        if "#wrong" in line:
            break
    running = bool(head) and "#wrong" in head[-1]
    if running:
        intruder = subprocess.run(
            [NETNS, "exec", str(set_no), "2", sys.executable, os.path.abspath(__file__),
             "intrude", master, "29617"], capture_output=True, text=True, timeout=60)
    rest, _ = host1.communicate(timeout=300)
    results = [(host1.returncode, [{"rc": host1.returncode, "out": "".join(head) + rest}])]
    results += finish([host2])
    text = all_output(results)
    check(running, f"weft-perf never printed its column header on host 1:\n{text}")
    check(intruder.stdout.strip() == "closed",
          f"a client without the token was not turned away: {intruder.stdout}{intruder.stderr}")
    check(all(rc == 0 for rc, _ in results), f"the job failed beside the intruder:\n{text}")
    check("Out of bounds values : 0 OK" in text, f"weft-perf did not report 0 wrong:\n{text}")
    check("without authentication" not in text, f"warned although the token was set:\n{text}")
    print("ok: with WEFT_STORE_TOKEN a client without it is closed out; the job is unharmed")


def case_hierarchical(build, set_no):
    import tempfile
    netns("up", set_no, 3)
    master = f"10.77.{set_no}.1"
    weftrun = os.path.join(build, "tools", "weftrun")
    check_py = os.path.join(HERE, "hierarchical_check.py")
    python = python_command()
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    families = "[all_reduce],[all_gather],[reduce_scatter],[broadcast]"
    runs = [(2, "", python + [check_py]),
            (3, "hierarchical", python + [check_py]),
            (2, "hierarchical", [conformance, families])]
    for port, (hosts, algo, program) in enumerate(runs, start=29620):
        with tempfile.TemporaryDirectory() as trace_dir:
            procs = []
            for node in range(hosts):
                cmd = [weftrun, "--nnodes", str(hosts), "--node-rank", str(node),
                       "--nproc-per-node", "2", "--master-addr", master, "--master-port",
                       str(port), "--no-prefix"] + program
                env = {"WEFT_TIMEOUT": "60", "WEFT_TEST_LAUNCHER": "env", "WEFT_JOB_ID": JOB_ID,
                       "WEFT_ALGO": algo, "WEFT_TRACE_DIR": trace_dir,
                       "PYTHONPATH": os.path.join(build, "python")}
                procs.append(start_host(set_no, node + 1, {"cmd": cmd, "ranks": [{"env": env}]}))
            results = finish(procs)
        text = all_output(results)
        what = f"{os.path.basename(program[-1])} on {hosts} hosts x 2 ranks, WEFT_ALGO={algo!r}"
        check(all(rc == 0 for rc, _ in results), f"{what} failed:\n{text}")
        if program[0] == conformance:
            check_conformance_ran(text, 4, what)
        else:
            oks = text.count("hierarchical check ok")
            check(oks == 2 * hosts, f"{what}: {oks} ranks said ok, not {2 * hosts}:\n{text}")
        print(f"ok: {what}")


ZERO_COPY_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def check_symmetric_traces(text, ranks, hierarchical, what):
    """Every rank's flight recorder (the files symmetric_check names): each all_reduce,
    reduce_scatter, all_gather and broadcast that moved data ran "symmetric_hierarchical" (or,
    on uneven hosts, did not), and the reduce did not."""
    import re
    paths = re.findall(r"^\[\d+\] trace (\S+)$|^trace (\S+)$", text, re.M)
    paths = sorted({a or b for a, b in paths})
    check(len(paths) == ranks, f"{what}: {len(paths)} trace files named, not {ranks}:\n{text}")
    for path in paths:
        with open(path) as f:
            dump = json.load(f)
        entries = [e for g in dump["groups"] if g["name"] == "world" for e in g["entries"]]
        moved = [e for e in entries if e["op"] in ZERO_COPY_OPS and
                 max(e["count_in"], e["count_out"]) > 0]
        check(len(moved) > 50, f"{what}: {path} lists only {len(moved)} collectives")
        for e in moved:
            ran = e["algorithm"] == "symmetric_hierarchical"
            check(ran == hierarchical,
                  f"{what}: {path}: {e['op']} #{e['seq']} ran {e['algorithm']!r}")
        for e in entries:
            check(e["op"] != "reduce" or not e["algorithm"].startswith("symmetric"),
                  f"{what}: {path}: reduce #{e['seq']} ran {e['algorithm']!r}")


def case_symmetric(build, set_no):
    """Symmetric buffers on groups that span hosts (docs/symmetric-memory.md): symmetric_check on
    2 x 2, 3 x 2 and 2 x 1 (zero-copy hierarchical, per the recorder) and on hosts of 2 and 1
    ranks (the message path, tensors in symmetric memory), then the conformance suite with every
    tensor in a symmetric buffer on 2 x 2. Nothing may be left in any host's /dev/shm."""
    import tempfile
    netns("up", set_no, 3)
    master = f"10.77.{set_no}.1"
    worker = os.path.join(build, "tests", "hosts", "symmetric_check")
    conformance = os.path.join(build, "tests", "conformance", "conformance_test")
    families = "[all_reduce],[all_gather],[reduce_scatter],[broadcast],[reduce],[all_to_all]"
    runs = [([2, 2], [worker]), ([2, 2, 2], [worker]), ([1, 1], [worker]), ([2, 1], [worker]),
            ([2, 2], [conformance, families])]
    for port, (layout, program) in enumerate(runs, start=29630):
        with tempfile.TemporaryDirectory() as trace_dir:
            procs = []
            for h, envs in enumerate(layout_env(layout, master, port)):
                for e in envs:
                    e.update({"WEFT_TEST_LAUNCHER": "env", "WEFT_TRACE_DIR": trace_dir,
                              "WEFT_JOB_ID": JOB_ID})
                    if program[0] == conformance:
                        e["WEFT_TEST_SYMMETRIC"] = "1"
                spec = {"cmd": program, "ranks": [{"env": e} for e in envs], "stream": True}
                procs.append(start_host(set_no, h + 1, spec))
            results = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                lines = out.strip().splitlines()
                left = next((json.loads(line[len("SHM-LEFT: "):]) for line in lines
                             if line.startswith("SHM-LEFT: ")), None)
                check(left == [], f"a host's /dev/shm keeps {left} after {layout}:\n{out}{err}")
                try:
                    ranks = json.loads(lines[-1])
                except (ValueError, IndexError):
                    ranks = [{"rc": p.returncode, "out": out + err}]
                results.append((p.returncode, ranks))
            text = all_output(results)
            what = f"{os.path.basename(program[0])} on hosts of {layout} ranks"
            check(all(rc == 0 for rc, _ in results), f"{what} failed:\n{text}")
            if program[0] == conformance:
                check_conformance_ran(text, 6, what)
            else:
                oks = text.count("symmetric check ok")
                check(oks == sum(layout), f"{what}: {oks} ranks said ok:\n{text}")
                check_symmetric_traces(text, sum(layout), len(set(layout)) == 1, what)
        print(f"ok: {what}")


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
        intrude(sys.argv[2], int(sys.argv[3]))
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
        if case.startswith("mpirun"):
            need_open_mpi()
        set_no = set_id(case)
        try:
            {"weftrun": case_weftrun, "torchrun": case_torchrun, "ifname": case_ifname,
             "loopback": case_loopback, "token": case_token, "soak": case_soak,
             "mpirun": case_mpirun, "mpirun_uneven": case_mpirun_uneven,
             "hierarchical": case_hierarchical, "ucx": case_ucx,
             "symmetric": case_symmetric}[case](build, set_no)
        finally:
            netns("down", set_no)
        nothing_left(set_no)
        no_segments_left(case)
    except Skip as s:
        print(s)
        return 77
    except Failure as f:
        print(f"FAIL: {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
