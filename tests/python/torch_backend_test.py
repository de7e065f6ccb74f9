"""weft as a torch.distributed backend: every torch.distributed call weft.torch implements, run by
each rank under weftrun, checked element by element against references computed here from every
rank's inputs; DDP over weft against DDP over gloo in the same job (same losses). Skipped (exit 77)
where PyTorch is absent (CI); run by hand in the pytorch-peer chroot (docs/python.md)."""
import faulthandler
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("skipped: PyTorch is not installed (docs/python.md: run it in the pytorch-peer chroot)")
    sys.exit(77)

import weft
import weft.torch  # registers the backend "weft"

torch.set_num_threads(1)
faulthandler.dump_traceback_later(240, exit=True)  # a hang prints every thread's stack and fails
if os.environ.get("USE_LIBUV") == "0":
    # A PyTorch built without libuv (Debian's) cannot make env://'s agent-store client: give
    # init_process_group a store made here, on the store weftrun hosts.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, use_libuv=False)
    dist.init_process_group("weft", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("weft")
R, N = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "weft", dist.get_backend()
checks = 0


def expect_equal(got, want, what, rtol=1e-6, atol=0.0):
    global checks
    checks += 1
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"rank {R}: {what}: {got.dtype}{tuple(got.shape)} != "
                             f"{want.dtype}{tuple(want.shape)}")
    bad = ~torch.isclose(got, want, rtol=rtol, atol=atol) if got.is_floating_point() else got != want
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"rank {R}/{N}: {what}: element {i} is {got.flatten()[i]}, expected "
                             f"{want.flatten()[i]} ({int(bad.sum())} of {got.numel()} differ)")


def data(rank, n, dtype=torch.float32):
    return ((torch.arange(n) * (rank + 1) + 3 * rank) % 23).to(dtype)


def ranks_sum(n, dtype=torch.float32):
    return sum(data(r, n, dtype) for r in range(N))


n = 29
for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.float16):
    t = data(R, n, dtype)
    dist.all_reduce(t)
    expect_equal(t, ranks_sum(n, dtype), f"all_reduce sum {dtype}")
t = data(R, n)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
expect_equal(t, ranks_sum(n) / N, "all_reduce AVG")
t = data(R, n)
dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
expect_equal(t, ranks_sum(n) * 0.5, "all_reduce PREMUL_SUM")
t = data(R, n)
dist.all_reduce(t, op=dist.ReduceOp.MAX)
expect_equal(t, torch.stack([data(r, n) for r in range(N)]).max(0).values, "all_reduce MAX")
t = data(R, 2 * n).view(n, 2)[:, 1]  # not contiguous: staged and copied back
dist.all_reduce(t)
expect_equal(t, ranks_sum(2 * n).view(n, 2)[:, 1], "all_reduce of a non-contiguous view")
work = dist.all_reduce(t2 := data(R, n), async_op=True)
fut = work.get_future()
work.wait()
expect_equal(fut.wait()[0], ranks_sum(n), "all_reduce async future")
expect_equal(t2, ranks_sum(n), "all_reduce async")

for root in range(N):
    t = data(R, n)
    dist.broadcast(t, src=root)
    expect_equal(t, data(root, n), f"broadcast from {root}")
    t = data(R, n, torch.int64)
    dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
    if R == root:
        expect_equal(t, ranks_sum(n, torch.int64), f"reduce to {root}")
    gl = [torch.zeros(n) for _ in range(N)] if R == root else None
    dist.gather(data(R, n), gl, dst=root)
    if R == root:
        for r in range(N):
            expect_equal(gl[r], data(r, n), f"gather to {root}, block {r}")
    out = torch.zeros(n)
    dist.scatter(out, [data(100 + r, n) for r in range(N)] if R == root else None, src=root)
    expect_equal(out, data(100 + R, n), f"scatter from {root}")

outs = [torch.zeros(n) for _ in range(N)]
dist.all_gather(outs, data(R, n))
for r in range(N):
    expect_equal(outs[r], data(r, n), f"all_gather block {r}")
big = torch.zeros(N * n)
dist.all_gather_into_tensor(big, data(R, n))
expect_equal(big, torch.cat([data(r, n) for r in range(N)]), "all_gather_into_tensor")
out = torch.zeros(n)
dist.reduce_scatter(out, [data(R * N + j, n) for j in range(N)])
expect_equal(out, sum(data(r * N + R, n) for r in range(N)), "reduce_scatter")
for op, scale in ((dist.ReduceOp.SUM, 1.0), (dist.ReduceOp.AVG, 1.0 / N)):
    out = torch.zeros(n)
    dist.reduce_scatter_tensor(out, data(R, N * n), op=op)
    expect_equal(out, ranks_sum(N * n)[R * n:(R + 1) * n] * scale, f"reduce_scatter_tensor {op}")

inp = torch.cat([torch.full((3,), float(100 * R + j)) for j in range(N)])
out = torch.zeros(3 * N)
dist.all_to_all_single(out, inp)
expect_equal(out, torch.cat([torch.full((3,), float(100 * j + R)) for j in range(N)]),
             "all_to_all_single even")
split = lambda src, dst: (src + 2 * dst) % 3  # rows of 2 elements, zero-size splits included
inp = torch.cat([torch.full((split(R, j), 2), float(100 * R + j)) for j in range(N)])
out = torch.zeros(sum(split(j, R) for j in range(N)), 2)
dist.all_to_all_single(out, inp, output_split_sizes=[split(j, R) for j in range(N)],
                       input_split_sizes=[split(R, j) for j in range(N)])
expect_equal(out, torch.cat([torch.full((split(j, R), 2), float(100 * j + R)) for j in range(N)]),
             "all_to_all_single with splits")
outs = [torch.zeros(j + 1) for j in range(N)]
dist.all_to_all(outs, [torch.full((R + 1,), float(10 * R + j)) for j in range(N)])
for j in range(N):
    expect_equal(outs[j], torch.full((j + 1,), float(10 * j + R)), f"all_to_all from {j}")
dist.barrier()

if N > 1:
    got = torch.zeros(n)
    reqs = [dist.isend(data(R, n), (R + 1) % N, tag=5), dist.irecv(got, (R - 1) % N, tag=5)]
    for q in reqs:
        q.wait()
    expect_equal(got, data((R - 1) % N, n), "isend/irecv ring")
    # dist.recv with src=None: from any source, the sender returned.
    if R == 0:
        senders = set()
        for _ in range(N - 1):
            got = torch.zeros(n)
            src = dist.recv(got, tag=12)
            assert src in range(1, N) and src not in senders, (src, senders)
            senders.add(src)
            expect_equal(got, data(200 + src, n), f"recv from any source ({src})")
    else:
        dist.send(data(200 + R, n), 0, tag=12)

evens = dist.new_group([r for r in range(N) if r % 2 == 0])
if R % 2 == 0:
    t = data(R, n)
    dist.all_reduce(t, group=evens)
    expect_equal(t, sum(data(r, n) for r in range(0, N, 2)), "all_reduce on new_group")

# Coalesced calls: batch_isend_irecv, all_reduce_coalesced, and the coalescing manager.
if N > 1:
    got = [torch.zeros(n), torch.zeros(n)]
    ops = [dist.P2POp(dist.isend, data(R, n), (R + 1) % N, tag=7),
           dist.P2POp(dist.irecv, got[0], (R - 1) % N, tag=7),
           dist.P2POp(dist.isend, data(R + 50, n), (R - 1) % N, tag=8),
           dist.P2POp(dist.irecv, got[1], (R + 1) % N, tag=8)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    expect_equal(got[0], data((R - 1) % N, n), "batch_isend_irecv from the left")
    expect_equal(got[1], data((R + 1) % N + 50, n), "batch_isend_irecv from the right")
ts = [data(R, n), data(R + 3, 2 * n)]
dist.all_reduce_coalesced(ts)
expect_equal(ts[0], ranks_sum(n), "all_reduce_coalesced, first tensor")
expect_equal(ts[1], sum(data(r + 3, 2 * n) for r in range(N)),
             "all_reduce_coalesced, second tensor")
outs = [torch.zeros(N * n), torch.zeros(N * 3)]
with dist._coalescing_manager(async_ops=True) as cm:
    dist.all_gather_into_tensor(outs[0], data(R, n))
    dist.all_gather_into_tensor(outs[1], data(R + 7, 3))
cm.wait()
expect_equal(outs[0], torch.cat([data(r, n) for r in range(N)]), "coalesced all_gather_into_tensor")
expect_equal(outs[1], torch.cat([data(r + 7, 3) for r in range(N)]),
             "coalesced all_gather_into_tensor, second")

# A backend map naming weft for CPU tensors.
mapped = dist.new_group(backend="cpu:weft")
assert dist.get_backend(mapped) in ("weft", "cpu:weft"), dist.get_backend(mapped)
t = data(R, n)
dist.all_reduce(t, group=mapped)
expect_equal(t, ranks_sum(n), "all_reduce on a 'cpu:weft' group")

# DDP over weft against DDP over gloo (a gloo group in the same job): the same losses.
gloo = dist.new_group(backend="gloo")


def train(pg, steps=8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1234 + R)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        y = x.sum(1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64), [p.detach().clone() for p in model.parameters()]


weft_losses, weft_params = train(dist.group.WORLD)
gloo_losses, gloo_params = train(gloo)
# On 3+ ranks weft and gloo add the gradients in different orders: equal to rounding.
expect_equal(weft_losses, gloo_losses, "DDP losses, weft vs gloo", rtol=1e-5, atol=1e-6)
for a, b in zip(weft_params, gloo_params):
    expect_equal(a, b, "DDP parameters after training, weft vs gloo", rtol=1e-5, atol=1e-6)
if R == 0:
    print(f"DDP losses over weft: {weft_losses.tolist()}")

dist.barrier()
dist.destroy_process_group()
print(f"rank {R}/{N}: {checks} checks passed (torch {torch.__version__})")
