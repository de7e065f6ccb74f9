# The PyTorch side of tests/compat/weft_client_on_pytorch_server: runs PyTorch 2.x's TCPStore
# server (the classic one: use_libuv=False), lets weft's client run every operation against it,
# then checks what weft wrote and writes values for weft to check.
#
# Usage: python3 weft_client_on_pytorch_server.py PORT_FILE
# Writes the server's port to PORT_FILE, exits 0 when every check passed.
import datetime
import os
import sys

import torch.distributed as dist


def expect(what, got, want):
    if got != want:
        print(f"pytorch side: {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)


def main():
    port_file = sys.argv[1]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=False,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(store.port))
    os.rename(port_file + ".tmp", port_file)

    # Phase 1: weft's client runs its own checks, then leaves these values for us.
    store.wait(["weft/done"])
    expect("get weft/text", store.get("weft/text"), b"written by weft")
    expect("get weft/binary", store.get("weft/binary"), bytes(range(256)) * 4)
    expect("get weft/empty", store.get("weft/empty"), b"")
    expect("add weft/counter", store.add("weft/counter", 0), 42)
    expect("get weft/counter (decimal text)", store.get("weft/counter"), b"42")
    expect("get weft/appended", store.get("weft/appended"), b"abcdef")
    expect("get weft/multi_1", store.get("weft/multi_1"), b"one")
    expect("get weft/multi_2", store.get("weft/multi_2"), b"two")
    expect("compare_set weft/cas", store.compare_set("weft/cas", b"old", b"new"), b"new")
    expect("check weft/deleted", store.check(["weft/deleted"]), False)

    # Phase 2: PyTorch writes, weft reads.
    store.set("torch/text", b"written by pytorch")
    store.set("torch/binary", bytes(range(255, -1, -1)) * 3)
    store.set("torch/empty", b"")
    store.add("torch/counter", 7)
    store.add("torch/counter", -2)
    store.append("torch/appended", b"xy")
    store.append("torch/appended", b"z")
    store.multi_set(["torch/multi_1", "torch/multi_2"], [b"uno", b"dos"])
    store.set("torch/done", b"1")

    store.wait(["weft/verified"])
    print("pytorch side: all checks passed")


if __name__ == "__main__":
    main()
