#!/usr/bin/env python3
"""Faults across hosts made of network namespaces (tests/support/netns-hosts): ranks killed,
stopped, the store's host killed, a job restarted on the same port, mismatched ranks.

  fault_kill_test.py CASE BUILD_DIR

Every case runs 2 hosts x 2 ranks of tests/hosts/fault_worker (ranks 0, 1 on host 1, ranks 2, 3
on host 2), launched with torchrun's variables by one agent per host (this file run as `agent`
inside the host), which relays every line the ranks print. The store is on host 1: weft-store's,
as torchrun's agent hosts it (so that it outlives a failed rank 0), or rank 0's in store_host
and restart. Faults are triggered by what a rank prints (never by sleeping), and each survivor
must fail with the error the case names within a bound; then nothing may be left: processes,
the job's /dev/shm segments (each host's own and the root one), namespaces, links.

CASE is one of the following, or allreduce_ucx, sigstop_ucx, store_agent_ucx: the same over the
UCX backend (skipped, 77, where it is not built):
  rendezvous   rank 3 is killed before it joins, while the others wait in rendezvous: they
               fail with Timeout naming it as missing (nothing tells a dead rank from a slow
               one there; WEFT_TIMEOUT=5).
  mesh         rank 1 kills itself while the world connects its TCP mesh, after publishing its
               address (WEFT_TEST_KILL_AT=mesh_connect): the others fail within 10 s (WEFT_TIMEOUT
               60), naming rank 1.
  allreduce    rank 2 is killed mid-ring of a 64 MiB all_reduce across hosts: every other rank
               fails with PeerLost naming rank 2 within 10 s (WEFT_TIMEOUT 60).
  symmetric    the allreduce case with the data in a symmetric buffer of the world (zero-copy on
               each host, hierarchical across hosts): rank 1 is killed mid-collective, then, in
               a second job, rank 2; every survivor fails with PeerLost naming the victim within
               5 s (a local peer in its barrier, the others through the rail or the group's
               failure), and no host's /dev/shm keeps the buffer.
  symmetric_full
               host 1's /dev/shm (24 MiB) has no room for its two ranks' 16 MiB blocks of a
               symmetric buffer of the world, host 2's has: every rank fails allocate_symmetric
               with Io at once (not at WEFT_TIMEOUT 60), host 2's naming host 1's leader (rank
               0), and neither host's /dev/shm keeps a segment.
  shm          rank 1 is killed in a 64 MiB all_reduce of host 1's group (shared memory): rank 0
               fails with PeerLost naming it within 10 s; host 2's group is unharmed.
  split        rank 3 is killed while the others are in split() (before it enters): they fail
               with PeerLost naming it within 10 s; then, in a second job, rank 1 dies while
               its split group connects (WEFT_TEST_KILL_AT=mesh_connect:2): its peer there
               fails within 10 s naming it, the others time out (WEFT_TIMEOUT 8) in the next
               group's set-up naming ranks 1 and 3 (a forming group does not learn that a
               member died: only the timeout ends that wait).
  sigstop      rank 2 is stopped (SIGSTOP) in a loop of all_reduces: the others fail with
               Timeout naming the op, its sequence number and rank 2 as the one that did not
               time out with them (WEFT_TIMEOUT=4); continued once they have exited, rank 2
               fails with an error too, and exits.
  store_host   every process of host 1 (ranks 0 and 1, and rank 0's store) is killed: host 2's
               ranks fail within 10 s with an error that names the store's address as
               unreachable.
  store_agent  the same with the store in a process of its own on host 1 (weft-store, as
               torchrun's agent or weftrun host it), killed with the host.
  restart      a job is killed whole (kill -9 of every rank) with a stale segment of it in each
               host's /dev/shm, and the same job is started again at once on the same port: it
               runs and checks its results; the stale segments are not used and are removed.
  mismatch     rank 3 claims another weft version (WEFT_TEST_FAKE_VERSION), then, in a second
               job, runs with WEFT_DEBUG=detail where the others do not: every rank is refused at
               rendezvous with a message naming both versions or settings.
Exit 0 on success, 1 on failure, 77 (meson's "skipped") without root or namespaces.
"""
import json
import os
import queue
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import multi_host_test as hosts
from multi_host_test import Failure, check

CASES = {"rendezvous": 120, "mesh": 121, "allreduce": 122, "shm": 123, "split": 124,
         "sigstop": 125, "store_host": 126, "restart": 127, "mismatch": 128, "store_agent": 129,
         "allreduce_ucx": 130, "sigstop_ucx": 131, "store_agent_ucx": 132, "symmetric": 133,
         "symmetric_full": 134}
# The /dev/shm size of some hosts, per case (netns-hosts' NETNS_HOSTS_SHM_SIZE; default 2g).
SHM_SIZES = {"symmetric_full": {1: "24M"}}
# Variables every rank gets on top of the case's: the *_ucx cases run their case over the UCX
# backend (the module's folder from WEFT_TEST_UCX_DIR, as meson passes it).
BACKEND_ENV = {}


# ---- The agent: runs inside one host, starts its ranks, relays their lines and exits.

def agent():
    """Reads commands (one JSON object a line) on stdin, answers with events (one JSON list a
    line) on stdout: ["pid", job, rank, pid], ["out", job, rank, line], ["exit", job, rank, rc],
    ["shm", [names]]. On EOF it kills what still runs and exits."""
    lock = threading.Lock()
    procs = []

    def emit(*event):
        with lock:
            sys.stdout.write(json.dumps(list(event)) + "\n")
            sys.stdout.flush()

    def relay(job, rank, proc):
        for line in proc.stdout:
            emit("out", job, rank, line.rstrip("\n"))
        emit("exit", job, rank, proc.wait())

    for command in sys.stdin:
        command = json.loads(command)
        if "start" in command:
            spec = command["start"]
            for r in spec["ranks"]:
                env = dict(os.environ)
                env.update(r["env"])
                proc = subprocess.Popen(spec["cmd"], env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
                procs.append(proc)
                emit("pid", spec["job"], r["rank"], proc.pid)
                threading.Thread(target=relay, args=(spec["job"], r["rank"], proc),
                                 daemon=True).start()
        elif "plant" in command:
            # A segment as a killed rank of the job leaves it: its name, garbage inside.
            with open(os.path.join("/dev/shm", command["plant"]), "wb") as f:
                f.write(b"\xde\xad" * 2048)
            emit("planted", command["plant"])
        elif "shm" in command:
            emit("shm", sorted(n for n in os.listdir("/dev/shm")
                               if n.startswith(f"weft-{command['shm']}-")))
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


# ---- The harness: one agent per host, their events in one queue.

class Job:
    """The hosts of one case and the ranks running on them. Events from every host arrive in
    one queue; wait_for() reads them up to a deadline and keeps them all for messages."""

    def __init__(self, set_no, nhosts=2, shm_sizes=None):
        self.set_no = set_no
        self.events = queue.Queue()
        self.seen = []  # (time, host, event)
        self.pids = {}  # (job, rank) -> pid
        self.exits = {}  # (job, rank) -> (rc, time)
        self.lines = {}  # (job, rank) -> [(time, line)]
        self.agents = []
        hosts.netns("up", set_no, nhosts)
        for h in range(1, nhosts + 1):
            env = dict(os.environ)
            if (shm_sizes or {}).get(h):
                env["NETNS_HOSTS_SHM_SIZE"] = shm_sizes[h]
            p = subprocess.Popen([hosts.NETNS, "exec", str(set_no), str(h), sys.executable,
                                  os.path.abspath(__file__), "agent"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            self.agents.append(p)
            threading.Thread(target=self._read, args=(h, p), daemon=True).start()

    def _read(self, host, proc):
        for line in proc.stdout:
            self.events.put((time.monotonic(), host, json.loads(line)))
        self.events.put((time.monotonic(), host, ["agent-exit"]))

    def send(self, host, command):
        agent = self.agents[host - 1]
        agent.stdin.write(json.dumps(command) + "\n")
        agent.stdin.flush()

    def start(self, job, host, ranks, cmd):
        """Starts `ranks` ([(rank, env)]) on `host`."""
        self.send(host, {"start": {"job": job, "cmd": cmd,
                                   "ranks": [{"rank": r, "env": e} for r, e in ranks]}})

    def _take(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            t, host, event = self.events.get(timeout=left)
        except queue.Empty:
            return None
        self.seen.append((t, host, event))
        kind = event[0]
        if kind == "pid":
            self.pids[(event[1], event[2])] = event[3]
        elif kind == "out":
            self.lines.setdefault((event[1], event[2]), []).append((t, event[3]))
        elif kind == "exit":
            self.exits[(event[1], event[2])] = (event[3], t)
        return t, host, event

    def wait_for(self, what, predicate, seconds):
        """Reads events until predicate() holds (it looks at this object's state); Failure naming
        `what` and the events so far past `seconds`."""
        deadline = time.monotonic() + seconds
        while not predicate():
            if self._take(deadline) is None:
                raise Failure(f"{what}: not within {seconds} s\n{self.transcript()}")

    def line(self, job, rank, pattern):
        """The time and text of rank's first line matching `pattern`, or None."""
        for t, text in self.lines.get((job, rank), []):
            if re.search(pattern, text):
                return t, text
        return None

    def wait_line(self, job, rank, pattern, seconds):
        self.wait_for(f"rank {rank} of {job} printing /{pattern}/",
                      lambda: self.line(job, rank, pattern) is not None, seconds)
        return self.line(job, rank, pattern)

    def wait_exits(self, job, ranks, seconds):
        self.wait_for(f"ranks {ranks} of {job} exiting",
                      lambda: all((job, r) in self.exits for r in ranks), seconds)

    def kill(self, job, rank, sig=signal.SIGKILL):
        os.kill(self.pids[(job, rank)], sig)
        return time.monotonic()

    def shm_left(self, host, job):
        """The job's segments in host's /dev/shm."""
        start = len(self.seen)
        self.send(host, {"shm": job})

        def answer():
            return next((e[1] for _, h, e in self.seen[start:] if h == host and e[0] == "shm"),
                        None)
        self.wait_for(f"host {host} listing /dev/shm", lambda: answer() is not None, 10)
        return answer()

    def transcript(self):
        return "\n".join(f"  [{t:.3f}] host {h}: {' '.join(str(x) for x in e)}"
                         for t, h, e in self.seen[-80:])

    def close(self):
        for a in self.agents:
            try:
                a.stdin.close()
            except OSError:
                pass
        for a in self.agents:
            try:
                a.wait(timeout=20)
            except subprocess.TimeoutExpired:
                a.kill()
                a.wait()
        hosts.netns("down", self.set_no)


# ---- Cases.

WORKER = None  # set in main: BUILD/tests/hosts/fault_worker
STORE = None  # BUILD/tools/weft-store
PORT_BASE = 29720
TRACE_DIR = None


def job_id(case, n=0):
    # [A-Za-z0-9._] only, so that /dev/shm names carry it as it is (runtime/shm_names.h).
    return f"kill{os.getpid()}x{case}{n}"


def port_of(set_no, n=0):
    return PORT_BASE + 10 * (set_no - 120) + n


def start_store(job, set_no, name, port):
    """Starts weft-store on host 1 at 10.77.<set>.1:port, as torchrun's agent hosts the store, and
    waits until it listens. Its events are job `name`-store, rank 0."""
    job.start(f"{name}-store", 1, [(0, {})],
              [STORE, "--host", f"10.77.{set_no}.1", "--port", str(port)])
    job.wait_line(f"{name}-store", 0, "listening on", 30)


def stop_store(job, name):
    job.kill(f"{name}-store", 0, signal.SIGTERM)
    job.wait_exits(f"{name}-store", [0], 10)


def launch(job, set_no, name, args, port, timeout="60", extra_by_rank=None, only=None,
           agent_store=True):
    """Starts 2 hosts x 2 ranks of the worker with torchrun's variables: ranks 0, 1 on host 1,
    ranks 2, 3 on host 2. The store at 10.77.<set>.1:port is weft-store's on host 1, started
    here (as under torchrun, whose agent hosts it: it outlives the ranks, so that a survivor can
    still read what failed first), or with agent_store=False rank 0's. `extra_by_rank` adds
    variables per rank; `only` limits which ranks start."""
    if agent_store:
        start_store(job, set_no, name, port)
    master = f"10.77.{set_no}.1"
    for h in range(2):
        ranks = []
        for i in range(2):
            r = 2 * h + i
            if only is not None and r not in only:
                continue
            extra = {"WEFT_JOB_ID": name, "WEFT_TIMEOUT": timeout, "WEFT_TRACE_DIR": TRACE_DIR}
            extra.update(BACKEND_ENV)
            if agent_store:
                extra["TORCHELASTIC_USE_AGENT_STORE"] = "True"
            extra.update((extra_by_rank or {}).get(r, {}))
            ranks.append((r, hosts.torchrun_env(r, 4, i, 2, master, port, extra)))
        if ranks:
            job.start(name, h + 1, ranks, [WORKER] + args)


def expect_failures(job, name, survivors, t_fault, code, patterns, bound):
    """Every survivor prints an ERROR line whose code matches `code` and whose text matches each
    of `patterns`, within `bound` seconds of `t_fault`, and exits 3."""
    job.wait_exits(name, survivors, bound + 30)
    for r in survivors:
        found = job.line(name, r, r"^ERROR ")
        check(found is not None, f"rank {r} of {name} printed no ERROR line:\n{job.transcript()}")
        t, text = found
        rc, _ = job.exits[(name, r)]
        check(rc == 3, f"rank {r} exited {rc}, not 3 (a weft::Error):\n{job.transcript()}")
        check(re.match(rf"ERROR ({code}):", text), f"rank {r} failed with another code: {text}")
        for pattern in patterns:
            check(re.search(pattern, text), f"rank {r}'s error does not say /{pattern}/: {text}")
        check(t - t_fault < bound, f"rank {r} took {t - t_fault:.1f} s to fail (bound {bound} s)")
        print(f"  rank {r} failed {t - t_fault:.2f} s after the fault: {text}")


def finish_job(job, name, live_hosts=(1, 2)):
    """Stops the job's weft-store if it runs, then checks that the job left no segment in the
    /dev/shm of any host still running, nor in the root one."""
    store = (f"{name}-store", 0)
    if store in job.pids and store not in job.exits:
        stop_store(job, name)
    for h in live_hosts:
        left = job.shm_left(h, name)
        check(not left, f"host {h}'s /dev/shm keeps segments of {name}: {left}")
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"weft-{name}-")]
    check(not left, f"the root /dev/shm keeps segments of {name}: {left}")


def kill_when(job, name, victim, triggers, sig=signal.SIGKILL):
    """Sends `sig` to `victim` once every (rank, regex) of `triggers` has been printed."""
    for rank, pattern in triggers:
        job.wait_line(name, rank, pattern, 60)
    return job.kill(name, victim, sig)


def killed_itself(job, name, victim):
    """Waits for `victim` to die of its WEFT_TEST_KILL_AT hook; returns when it did."""
    job.wait_exits(name, [victim], 60)
    rc, t = job.exits[(name, victim)]
    check(rc == -signal.SIGKILL, f"rank {victim} exited {rc}, not by SIGKILL:\n{job.transcript()}")
    return t


def case_rendezvous(job, set_no):
    name = job_id("rdzv")
    launch(job, set_no, name, ["allreduce", "--mib", "1"], port_of(set_no), timeout="5",
           extra_by_rank={3: {"FAULT_WORKER_HOLD": "rendezvous"}})
    t = kill_when(job, name, 3, [(0, "^phase rendezvous"), (1, "^phase rendezvous"),
                                 (2, "^phase rendezvous"), (3, "^holding rendezvous")])
    expect_failures(job, name, [0, 1, 2], t, "Timeout",
                    [r"rendezvous", r"3/4 ranks arrived", r"missing rank\(s\) 3\b"], 5 + 5)
    finish_job(job, name)


def case_mesh(job, set_no):
    name = job_id("mesh")
    launch(job, set_no, name, ["allreduce", "--mib", "1"], port_of(set_no),
           extra_by_rank={1: {"WEFT_TEST_KILL_AT": "mesh_connect"}})
    t = killed_itself(job, name, 1)
    expect_failures(job, name, [0, 2, 3], t, "Io|PeerLost|Timeout", [r"rank 1\b"], 10)
    finish_job(job, name)


def case_allreduce(job, set_no):
    name = job_id("ring")
    launch(job, set_no, name, ["allreduce", "--mib", "64", "--iterations", "6"], port_of(set_no))
    t = kill_when(job, name, 2, [(r, "^iteration 1 ok") for r in range(4)] +
                  [(2, "^iteration 2 start")])
    expect_failures(job, name, [0, 1, 3], t, "PeerLost",
                    [r"all_reduce #\d+", r"rank 2\b"], 10)
    finish_job(job, name)


def case_symmetric(job, set_no):
    for n, victim in enumerate((1, 2)):
        name = job_id("sym", n)
        launch(job, set_no, name, ["symmetric", "--mib", "64", "--iterations", "6"],
               port_of(set_no, n))
        t = kill_when(job, name, victim, [(r, "^iteration 1 ok") for r in range(4)] +
                      [(victim, "^iteration 2 start")])
        survivors = [r for r in range(4) if r != victim]
        expect_failures(job, name, survivors, t, "PeerLost",
                        [r"all_reduce #\d+", rf"rank {victim}\b"], 5)
        finish_job(job, name)


def case_symmetric_full(job, set_no):
    name = job_id("symfull")
    launch(job, set_no, name, ["symmetric", "--mib", "16", "--iterations", "1"], port_of(set_no))
    ready = [job.wait_line(name, r, "^phase ready", 60)[0] for r in range(4)]
    expect_failures(job, name, [0, 1], max(ready), "Io",
                    [r"allocate_symmetric", r"symmetric buffer #0"], 5)
    expect_failures(job, name, [2, 3], max(ready), "Io",
                    [r"allocate_symmetric", r"the host of rank 0 could not map it"], 5)
    finish_job(job, name)


def case_shm(job, set_no):
    name = job_id("shm")
    launch(job, set_no, name, ["host", "--mib", "64", "--iterations", "6"], port_of(set_no))
    t = kill_when(job, name, 1, [(0, "^iteration 1 ok"), (1, "^iteration 2 start")])
    expect_failures(job, name, [0], t, "PeerLost",
                    [r"group \"host0\" all_reduce #\d+", r"rank 1\b"], 10)
    # Host 2's group ran its own all_reduces to the end, every element checked; its ranks fail
    # afterwards, at the world's final barrier (ranks 0 and 1 have left).
    job.wait_exits(name, [2, 3], 10)
    for r in (2, 3):
        check(job.line(name, r, "^iteration 5 ok") is not None,
              f"host 2's rank {r} did not finish its own group's all_reduces:\n{job.transcript()}")
    finish_job(job, name)


def case_split(job, set_no):
    # Rank 3 stops before the second split; the others are in it (its all_gather of colours).
    name = job_id("split", 0)
    launch(job, set_no, name, ["split", "--iterations", "3"], port_of(set_no, 0),
           extra_by_rank={3: {"FAULT_WORKER_HOLD": "split"}})
    t = kill_when(job, name, 3, [(r, "^phase split 1") for r in range(3)] +
                  [(3, "^holding split")])
    expect_failures(job, name, [0, 1, 2], t, "PeerLost", [r"split", r"rank 3\b"], 10)
    finish_job(job, name)
    # Rank 1 dies inside the second group's TCP mesh set-up (the first split's odd half, "half0"),
    # after publishing its address (WEFT_TEST_KILL_AT=mesh_connect:2): rank 3, its only peer
    # there, connects to it and fails within seconds naming it (as that group's rank 0). Ranks 0
    # and 2 finish the even
    # half and wait for ranks 1 and 3 in the next group's set-up: nothing tells a forming group
    # that a member died, so they fail at WEFT_TIMEOUT (8 s here), naming both.
    name = job_id("split", 1)
    launch(job, set_no, name, ["split", "--iterations", "3"], port_of(set_no, 1), timeout="8",
           extra_by_rank={1: {"WEFT_TEST_KILL_AT": "mesh_connect:2"}})
    t = killed_itself(job, name, 1)
    expect_failures(job, name, [3], t, "Io|PeerLost", [r"group \"half0\"", r"rank 0\b"], 10)
    # (The group is the world backwards: its ranks 0 and 2 are world ranks 3 and 1.)
    expect_failures(job, name, [0, 2], t, "Timeout",
                    [r"group \"backwards0\"", r"ranks 0, 2 did not publish"], 8 + 7)
    finish_job(job, name)


def case_sigstop(job, set_no):
    name = job_id("stop")
    launch(job, set_no, name, ["allreduce", "--mib", "1", "--iterations", "100000"],
           port_of(set_no), timeout="4")
    t = kill_when(job, name, 2, [(r, "^iteration 3 ok") for r in range(4)], signal.SIGSTOP)
    # Each times out on the peer it waits for (in a ring, a neighbour), then names rank 2 among
    # the ones that did not time out with it; one that learns of it second-hand (PeerLost) reads
    # that from the first failure's record. The 1 MiB all_reduce runs hierarchically (2 nodes x
    # 2 ranks), where rank 3 also waits on rank 2 inside their node and its own Timeout comes
    # late (withdrawing a single-copy transfer from a stopped peer waits for its ack): it may be
    # named beside rank 2.
    expect_failures(job, name, [0, 1, 3], t, "Timeout|PeerLost",
                    [r"all_reduce #\d+", r"ranks? (\d+, )*2(, \d+)* did not time out in #\d+"],
                    4 + 6)
    # At least one survivor must have seen the stop itself: a Timeout naming rank 2.
    check(any(re.search(r"Timeout", job.line(name, r, "^ERROR")[1]) for r in (0, 1, 3)),
          f"no survivor timed out on the stopped rank:\n{job.transcript()}")
    t = job.kill(name, 2, signal.SIGCONT)
    expect_failures(job, name, [2], t, "Timeout|PeerLost|Aborted", [r"rank 2/4"], 10)
    finish_job(job, name)


def store_host_killed(job, set_no, agent_store):
    name = job_id("store")
    port = port_of(set_no)
    launch(job, set_no, name, ["allreduce", "--mib", "16", "--iterations", "100000"], port,
           agent_store=agent_store)
    for r in range(4):
        job.wait_line(name, r, "^iteration 1 ok", 60)
    pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", f"wft{set_no}h1"],
                                           capture_output=True, text=True).stdout.split()]
    check(pids, "host 1 runs nothing")
    # Every process of host 1: its agent, ranks 0 and 1, and the store (rank 0's or weft-store).
    pidfds = [os.pidfd_open(p) for p in pids]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    for fd in pidfds:
        ready, _, _ = select.select([fd], [], [], 10)
        check(ready, "a process of host 1 outlived SIGKILL by 10 s")
        os.close(fd)
    for r in (0, 1):
        job.exits[(name, r)] = (-signal.SIGKILL, t)
    if agent_store:
        job.exits[(f"{name}-store", 0)] = (-signal.SIGKILL, t)
    expect_failures(job, name, [2, 3], t, "PeerLost|Io",
                    [rf"store 10\.77\.{set_no}\.1:{port}\b", r"unreachable"], 10)
    finish_job(job, name, live_hosts=(2,))


def case_store_host(job, set_no):
    store_host_killed(job, set_no, agent_store=False)


def case_store_agent(job, set_no):
    store_host_killed(job, set_no, agent_store=True)


def case_restart(job, set_no):
    name = job_id("again")
    port = port_of(set_no)
    args = ["allreduce", "--mib", "16", "--iterations", "100000"]
    launch(job, set_no, name, args, port, agent_store=False)
    for r in range(4):
        job.wait_line(name, r, "^iteration 2 ok", 60)
    # What a rank killed in its shared-memory set-up leaves: its segment, named after the job,
    # a group and its pid, which no longer exists (the agent's pid is alive; pid 0x7fffffff no).
    stale = {h: f"weft-{name}-00000000deadbeef-2147483647-r{2 * h - 2}" for h in (1, 2)}
    for h in (1, 2):
        job.send(h, {"plant": stale[h]})
    for r in range(4):
        job.kill(name, r)
    job.wait_exits(name, list(range(4)), 10)
    for h in (1, 2):
        left = job.shm_left(h, name)
        check(left == [stale[h]], f"host {h}'s /dev/shm before the restart: {left}")
    waiting = subprocess.run(["ip", "netns", "exec", f"wft{set_no}h1", "ss", "-tanH", "state",
                              "time-wait", f"( sport = :{port} )"],
                             capture_output=True, text=True).stdout.strip().splitlines()
    print(f"  killed; the store's port {port} has {len(waiting)} connections in TIME_WAIT")
    # The same job at once: the store's port has connections in TIME_WAIT, /dev/shm a stale
    # segment on each host.
    t = time.monotonic()
    launch(job, set_no, name + "b", ["allreduce", "--mib", "16", "--iterations", "3"], port,
           extra_by_rank={r: {"WEFT_JOB_ID": name} for r in range(4)}, agent_store=False)
    job.wait_exits(name + "b", list(range(4)), 60)
    for r in range(4):
        rc, _ = job.exits[(name + "b", r)]
        check(rc == 0, f"the restarted job's rank {r} exited {rc}:\n{job.transcript()}")
        check(job.line(name + "b", r, "^iteration 2 ok") and job.line(name + "b", r, "^done"),
              f"the restarted job's rank {r} did not finish:\n{job.transcript()}")
    print(f"  the job restarted on port {port} ran to the end in {time.monotonic() - t:.1f} s")
    finish_job(job, name)


def case_mismatch(job, set_no):
    name = job_id("version", 0)
    launch(job, set_no, name, ["allreduce", "--mib", "1"], port_of(set_no, 0),
           extra_by_rank={3: {"WEFT_TEST_FAKE_VERSION": "0.0.9"}})
    t = time.monotonic()
    expect_failures(job, name, [0, 1, 2, 3], t, "InvalidArgument",
                    [r"rendezvous", r"weft 0\.0\.9", r"weft \d+\.\d+\.\d+[^ ]* ", r"rank 3\b"], 30)
    finish_job(job, name)
    name = job_id("setting", 1)
    launch(job, set_no, name, ["allreduce", "--mib", "1"], port_of(set_no, 1),
           extra_by_rank={3: {"WEFT_DEBUG": "detail"}})
    t = time.monotonic()
    expect_failures(job, name, [0, 1, 2, 3], t, "InvalidArgument",
                    [r"rendezvous", r"WEFT_DEBUG=detail", r"WEFT_DEBUG=off", r"rank 3\b"], 30)
    finish_job(job, name)


def main():
    global WORKER, STORE, TRACE_DIR
    if len(sys.argv) == 2 and sys.argv[1] == "agent":
        agent()
        return 0
    if len(sys.argv) != 3 or sys.argv[1] not in CASES:
        print(__doc__, file=sys.stderr)
        return 2
    case, build = sys.argv[1], os.path.abspath(sys.argv[2])
    probe = subprocess.run([hosts.NETNS, "check"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(probe.stdout + probe.stderr)
        return 77
    WORKER = os.path.join(build, "tests", "hosts", "fault_worker")
    STORE = os.path.join(build, "tools", "weft-store")
    set_no = CASES[case]
    TRACE_DIR = tempfile.mkdtemp(prefix=f"weft-fault-{case}-")
    job = None
    if case.endswith("_ucx"):
        ucx_dir = os.environ.get("WEFT_TEST_UCX_DIR") or os.path.join(build, "backends", "ucx")
        if not os.path.exists(os.path.join(ucx_dir, "libweft-backend-ucx.so")):
            print(f"skipped: the UCX backend is not built ({ucx_dir} has no "
                  "libweft-backend-ucx.so: install libucx-dev and rebuild)")
            return 77
        BACKEND_ENV.update({"WEFT_BACKEND": "ucx", "WEFT_PLUGIN_PATH": ucx_dir})
        case = case[:-len("_ucx")]
    try:
        job = Job(set_no, shm_sizes=SHM_SIZES.get(case))
        globals()[f"case_{case}"](job, set_no)
        running = [key for key in job.pids if key not in job.exits]
        check(not running, f"ranks still running at the end: {running}")
        job.close()
        job = None
        hosts.nothing_left(set_no)
    except Failure as f:
        print(f"FAIL: {f}")
        return 1
    finally:
        if job is not None:
            job.close()
        hosts.netns("down", set_no)  # idempotent: also after a half-made set
        shutil.rmtree(TRACE_DIR, ignore_errors=True)
    print(f"ok: {case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
