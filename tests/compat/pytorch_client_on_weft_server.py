"""A PyTorch TCPStore client (use_libuv=False, is_master=False) exercises every Store method
that PyTorch 2.6 exposes against a weft-store server; each result is checked against the value
PyTorch's own server gives (documented in docs/store-protocol.md).

Usage: pytorch_client_on_weft_server.py HOST PORT [--expect-refused]

With --expect-refused the server has a token (WEFT_STORE_TOKEN) that PyTorch cannot prove: the
client must fail to connect rather than be served.
"""
import datetime
import sys
import threading

import torch.distributed as dist


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])

    def connect(timeout_s: float = 10.0) -> dist.TCPStore:
        return dist.TCPStore(host, port, is_master=False, use_libuv=False,
                             timeout=datetime.timedelta(seconds=timeout_s))

    if "--expect-refused" in sys.argv[3:]:
        try:
            connect(timeout_s=2.0).set("k", b"v")
        except (dist.DistNetworkError, dist.DistStoreError, RuntimeError) as e:
            print(f"PASS: refused without the token ({type(e).__name__})")
            return
        raise SystemExit("FAIL: a client without the token was served")

    store = connect()
    checks = 0

    def expect(what: str, got, want) -> None:
        nonlocal checks
        checks += 1
        if got != want:
            raise SystemExit(f"FAIL {what}: got {got!r}, want {want!r}")

    store.set("a", b"hello")
    expect("get", store.get("a"), b"hello")
    expect("add", store.add("n", 5), 5)
    expect("add negative", store.add("n", -7), -2)
    expect("add text", store.get("n"), b"-2")
    expect("compare_set absent, empty expected", store.compare_set("c", "", "x"), b"x")
    expect("compare_set present, mismatch", store.compare_set("c", "y", "z"), b"x")
    expect("compare_set present, match", store.compare_set("c", "x", "w"), b"w")
    expect("compare_set absent, non-empty expected", store.compare_set("nope", "q", "r"), b"q")
    expect("check present", store.check(["a", "n"]), True)
    expect("check absent", store.check(["a", "zz"]), False)
    store.wait(["a", "n"])
    store.multi_set(["m1", "m2"], [b"1", b"22"])
    expect("multi_get", store.multi_get(["m2", "m1"]), [b"22", b"1"])
    store.append("log", b"ab")
    store.append("log", b"cd")
    expect("append", store.get("log"), b"abcd")
    expect("num_keys", store.num_keys(), 6)  # a n c m1 m2 log; "nope" was never stored
    expect("delete_key present", store.delete_key("a"), True)
    expect("delete_key absent", store.delete_key("a"), False)
    expect("num_keys after delete", store.num_keys(), 5)

    # A wait that times out goes through CANCEL_WAIT and leaves the connection usable.
    try:
        store.wait(["never"], datetime.timedelta(milliseconds=200))
        raise SystemExit("FAIL wait timeout: returned without the key")
    except dist.DistStoreError:
        checks += 1
    store.set("after-timeout", b"1")
    expect("get after timeout", store.get("after-timeout"), b"1")

    # get() blocks (WAIT then GET) until another client sets the key.
    other = connect()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("v", store.get("late")))
    t.start()
    other.set("late", b"arrived")
    t.join(timeout=10)
    expect("blocking get", got.get("v"), b"arrived")

    print(f"PASS: {checks} checks against weft-store {host}:{port}")


if __name__ == "__main__":
    main()
