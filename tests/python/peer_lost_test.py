"""A killed rank is weft.PeerLost in Python: this driver starts three ranks of itself meeting at
tcp://127.0.0.1:PORT (not under weftrun, which would stop the survivors when one rank dies);
rank 2 SIGKILLs itself after a barrier, and ranks 0 and 1 must get weft.PeerLost from their next
all_reduce, with weft's message naming their rank, the group and the operation, and then from
every later call."""
import os
import re
import signal
import socket
import subprocess
import sys


def rank_main(rank, port):
    import weft

    world = weft.init(f"tcp://127.0.0.1:{port}", rank=rank, size=3, timeout=60)
    buf = bytearray(64)
    world.all_reduce(buf)
    world.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        world.all_reduce(bytearray(1 << 20))
    except weft.PeerLost as e:
        assert isinstance(e, weft.Error) and isinstance(e, ConnectionError), type(e).__mro__
        assert e.code == 2 and e.code_name == "WEFT_ERR_PEER_LOST", (e.code, e.code_name)
        # weft's whole message: rank, group, operation and sequence number, then the cause. A
        # survivor may notice the other survivor's exit first, so the gone rank is not fixed.
        want = f'rank {rank}/3 group "world" all_reduce #3 (uint8 x 1048576, sum): PeerLost: '
        assert str(e).startswith(want), f"{str(e)!r} does not start with {want!r}"
        # The killed rank, or the survivor that broke on it and hung up (either is first seen).
        other = "|".join(str(r) for r in range(3) if r != rank)
        assert re.search(rf"rank ({other}) (is gone|aborted its process group)", str(e)), str(e)
        print(f"rank {rank}: {e}")
        first = str(e)
    else:
        raise AssertionError(f"rank {rank}: all_reduce succeeded with rank 2 killed")
    try:
        world.barrier()
    except weft.PeerLost as e:
        # A broken group fails every later call at once, with the error that broke it.
        assert str(e) == first, f"{str(e)!r} != {first!r}"
    else:
        raise AssertionError(f"rank {rank}: barrier succeeded on a failed group")
    world.destroy()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) == 3:
        rank_main(int(sys.argv[1]), int(sys.argv[2]))
        return 0
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, __file__, str(r), str(port)]) for r in range(3)]
    codes = []
    for p in ranks:
        try:
            codes.append(p.wait(timeout=90))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    print("exit codes:", codes)
    if codes != [0, 0, -signal.SIGKILL]:
        print(f"expected [0, 0, {-signal.SIGKILL}]", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
