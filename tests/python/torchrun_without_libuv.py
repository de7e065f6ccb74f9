"""torchrun for a PyTorch built without libuv (Debian's, in the pytorch-peer chroot): stock torchrun
asks every TCPStore for libuv, which that build refuses, so this runs torch.distributed.run with
use_libuv=False forced on its stores. Usage: same arguments as torchrun (docs/python.md)."""
import sys

import torch.distributed as dist
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend
import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static_rendezvous


class TCPStoreWithoutLibuv(dist.TCPStore):
    def __init__(self, *args, **kwargs):
        kwargs["use_libuv"] = False
        super().__init__(*args, **kwargs)


dist.TCPStore = static_rendezvous.TCPStore = c10d_backend.TCPStore = TCPStoreWithoutLibuv

from torch.distributed.run import main  # noqa: E402

sys.exit(main())
