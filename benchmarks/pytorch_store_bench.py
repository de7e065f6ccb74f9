# The set+get load of store_bench, driven by PyTorch's own TCPStore clients, against PyTorch's
# server (started here) or any server given by --host/--port (weft-store, store_bench's). Run it
# in the PyTorch chroot:
#
#   /work/shared/tools/pytorch-peer/pytorch-python benchmarks/pytorch_store_bench.py
#   /work/shared/tools/pytorch-peer/pytorch-python benchmarks/pytorch_store_bench.py \
#       --host 127.0.0.1 --port 29500 --clients 1,16 --seconds 3
#
# Each client is a thread with its own TCPStore (its own connection), repeating set of its own
# key then get of it; ops/s counts both. PyTorch releases the GIL inside store calls, so threads
# overlap on the network as store_bench's do. Values are checked: a wrong reply exits 1.
import argparse
import datetime
import platform
import threading
import time

import torch
import torch.distributed as dist


def run(host, port, clients, seconds, run_id):
    stores = [dist.TCPStore(host, port, is_master=False, use_libuv=False,
                            timeout=datetime.timedelta(seconds=60)) for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop = threading.Event()
    counts = [0] * clients
    wrong = [0] * clients

    def client(c):
        store = stores[c]
        key = f"pybench/{run_id}/{c}"
        ops = 0
        start.wait()
        while not stop.is_set():
            value = bytes([ops & 0xFF]) * 32
            store.set(key, value)
            if store.get(key) != value:
                wrong[c] += 1
            ops += 2
        counts[c] = ops

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.monotonic()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - began
    if sum(wrong):
        raise SystemExit(f"pytorch_store_bench: {sum(wrong)} wrong get replies")
    return sum(counts) / elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--clients", default="1,16,256")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    server = None
    host, port = args.host, args.port
    if not host:
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=False,
                               wait_for_workers=False)
        host, port = "127.0.0.1", server.port
        where = f"PyTorch {torch.__version__} TCPStore (use_libuv=False), in-process, {host}:{port}"
    else:
        where = f"external, {host}:{port}"
    print("pytorch_store_bench")
    print(f"Date:       {datetime.datetime.utcnow():%Y-%m-%d %H:%M:%S} UTC")
    print(f"Python:     {platform.python_version()}, torch {torch.__version__}")
    print(f"Kernel:     {platform.system()} {platform.release()}")
    print(f"Server:     {where}")
    print(f"Load:       {args.seconds:.1f} s per figure, median of {args.repeat} run(s)")
    print("-" * 72)
    run_id = 0
    for clients in [int(c) for c in args.clients.split(",") if c]:
        figures = []
        for _ in range(args.repeat):
            figures.append(run(host, port, clients, args.seconds, run_id))
            run_id += 1
        figures.sort()
        print(f"set+get  {clients:5d} clients : {figures[len(figures) // 2]:10.0f} ops/s", flush=True)


if __name__ == "__main__":
    main()
