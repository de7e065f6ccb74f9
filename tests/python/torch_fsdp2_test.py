"""PyTorch's own FSDP2 (fully_shard) over the weft backend against single-process training: each
rank trains the sharded model on its batch; every rank also trains an unsharded copy on the
whole global batch (the mean of every rank's loss, which is what FSDP2's averaged reduce-scatter
computes) and the losses and the gathered parameters must agree. Skipped (exit 77) where PyTorch
is absent (CI); run by hand in the pytorch-peer chroot (docs/python.md)."""
import faulthandler
import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("skipped: PyTorch is not installed (docs/python.md: run it in the pytorch-peer chroot)")
    sys.exit(77)
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
import contextlib

import weft.torch  # noqa: F401  registers the backend "weft"

torch.set_num_threads(1)
# PyTorch 2.6's FSDP2 records and waits for stream events, which its CPU Stream stub lacks: on CPU
# every op has run when the call returns, and FSDP2 waits for each collective's Work itself, so an
# event that is always complete is exact (this is PyTorch's gap, the same over gloo).
if not hasattr(torch.cpu.Stream, "record_event"):
    torch.cpu.Stream.record_event = lambda self, event=None: event or torch.cpu.Event()
    torch.cpu.Stream.wait_event = lambda self, event: None
# And its all-gather copy-out bumps the version counter of the unsharded parameters on CPU, which
# a parameter resharded after forward and gathered again for backward then fails autograd's check
# (the same over gloo); the data is the same as in forward, which CUDA's path relies on too.
_copy_out = torch.ops.fsdp.split_with_sizes_copy


def _copy_out_keeping_versions(all_gather_output, split_sizes, dim=0, *, out):
    with contextlib.ExitStack() as keep:
        for t in out:
            keep.enter_context(torch.autograd._unsafe_preserve_version_counter(t))
        _copy_out(all_gather_output, split_sizes, dim=dim, out=out)


torch.ops.fsdp.split_with_sizes_copy = _copy_out_keeping_versions
faulthandler.dump_traceback_later(240, exit=True)  # a hang prints every thread's stack and fails
backend = os.environ.get("WEFT_TEST_TORCH_BACKEND", "weft")  # "gloo" shows gloo's AVG bug
if os.environ.get("USE_LIBUV") == "0":
    # Debian's PyTorch lacks libuv: give init_process_group a store on the one weftrun hosts.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, use_libuv=False)
    dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group(backend)
R, N = dist.get_rank(), dist.get_world_size()
STEPS, BATCH, DIM = 6, 4, 24


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 40), torch.nn.GELU(), torch.nn.Linear(40, 40),
                               torch.nn.GELU(), torch.nn.Linear(40, 1))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, DIM, generator=g)
    return x, x.sin().sum(1, keepdim=True)


# Sharded: FSDP2 with default settings on a 1-D mesh over the default (weft) group.
mesh = init_device_mesh("cpu", (N,))
model = make_model()
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sharded_losses = []
for step in range(STEPS):
    x, y = batch(R, step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sharded_losses.append(loss.item())

# Reference: one process, the unsharded model, the mean of every rank's loss per step.
ref = make_model()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
ref_losses = []
for step in range(STEPS):
    losses = [torch.nn.functional.mse_loss(ref(x), y) for x, y in (batch(r, step) for r in range(N))]
    ref_opt.zero_grad()
    (sum(losses) / N).backward()
    ref_opt.step()
    ref_losses.append(losses[R].item())

got, want = torch.tensor(sharded_losses, dtype=torch.float64), torch.tensor(ref_losses, dtype=torch.float64)
if not torch.allclose(got, want, rtol=1e-4, atol=1e-6):
    raise AssertionError(f"rank {R}/{N} over {backend}: FSDP2 losses {got.tolist()} != "
                         f"single-process {want.tolist()}")
checks = 1
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    full = p.full_tensor()  # a DTensor sharded over the mesh: all_gather through the backend
    if not torch.allclose(full, q, rtol=1e-4, atol=1e-5):
        worst = float((full - q).abs().max())
        raise AssertionError(f"rank {R}/{N} over {backend}: parameter {name} differs from "
                             f"single-process training by up to {worst}")
    checks += 1
if R == 0:
    print(f"FSDP2 losses over {backend}: {sharded_losses}")
dist.barrier()
dist.destroy_process_group()
print(f"rank {R}/{N}: FSDP2 over {backend} matches single-process training ({checks} checks, "
      f"torch {torch.__version__})")
