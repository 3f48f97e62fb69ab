"""Selective recompute never repeats a tensor-parallel collective (the cost model charges it none):
the gloo collectives of one forward+backward of a TP block are counted on 2 real ranks."""

from __future__ import annotations

import os
import socket

import pytest
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count(rank: int, port: int, sp: bool, queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import profile

    from meshplan.executor.activation_checkpoint import apply_ac
    from meshplan.executor.tensor_parallel import apply_tp
    from meshplan.models.zoo import build_model
    from meshplan.profiler import profile_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rule = profile_model("gpt-tiny", None, device="meta").layers[1].tp
    mesh = init_device_mesh("cpu", (2,))
    counts = {}
    for mode in ("none", "selective", "full"):
        model = build_model("gpt-tiny", None, "cpu", 0)
        apply_tp(model, {"layers.0": rule}, mesh, sp)
        apply_ac(model, {"layers.0": mode})
        x = torch.randn(2, 32, 64, requires_grad=True)
        model.layers["0"](x).float().sum().backward()  # warm-up outside the count
        with profile() as prof:
            model.layers["0"](x).float().sum().backward()
        counts[mode] = sum(1 for e in prof.events() if e.name.startswith("gloo:"))
    queue.put((rank, counts))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_selective_recompute_does_not_repeat_collectives(sp):
    os.environ["OMP_NUM_THREADS"] = "1"
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_count, args=(r, port, sp, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for counts in results.values():
        assert counts["none"] > 0
        assert counts["selective"] == counts["none"], counts
        assert counts["full"] > counts["none"], counts  # full recompute repeats the forward ones
