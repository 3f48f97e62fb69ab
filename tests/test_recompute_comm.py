"""Which tensor-parallel collectives a recompute repeats, counted on 2 real gloo ranks over one
forward+backward of a TP block: the executor's selective recompute (the attention core) repeats
none, which the cost model charges none; torchtitan's op-level policy keeps reduce_scatter outputs
only, so its recompute runs the forward's all-gathers (with sequence parallelism) or all-reduces
(without) again, which the cost model charges (layer_cost._selective_tp_rerun)."""

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


def _torchtitan_op_policy():
    """torchtitan's selective op policy (models/llama3 parallelize_llama `_save_list`,
    `_custom_policy`): save mm outputs but every second one, SDPA outputs, reduce_scatter_tensor
    and max; recompute everything else."""
    import collections

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    ops = torch.ops
    save = {
        ops.aten.mm.default,
        ops.aten._scaled_dot_product_efficient_attention.default,
        ops.aten._scaled_dot_product_flash_attention.default,
        ops._c10d_functional.reduce_scatter_tensor.default,
        ops.aten.max.default,
    }

    def context():
        meta = collections.defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == ops.aten.mm.default:
                meta[key] += 1
            keep = func in save and not (func == ops.aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context


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
    for mode in ("none", "selective", "full", "op"):
        model = build_model("gpt-tiny", None, "cpu", 0)
        apply_tp(model, {"layers.0": rule}, mesh, sp)
        block = model.layers["0"]
        if mode == "op":
            from torch.utils.checkpoint import checkpoint

            context_fn = _torchtitan_op_policy()

            def run(x, block=block, context_fn=context_fn):
                return checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
        else:
            apply_ac(model, {"layers.0": mode})
            run = model.layers["0"]
        x = torch.randn(2, 32, 64, requires_grad=True)
        run(x).float().sum().backward()  # warm-up outside the count
        with profile() as prof:
            run(x).float().sum().backward()
        counts[mode] = {
            kind: sum(1 for e in prof.events() if e.name.startswith(f"gloo:{kind}"))
            for kind in ("all_gather", "reduce_scatter", "all_reduce", "")
        }
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
        total = {mode: c[""] for mode, c in counts.items()}
        assert total["none"] > 0
        assert total["selective"] == total["none"], counts
        assert total["full"] > total["none"], counts  # full recompute repeats the forward ones
        # torchtitan's op policy reruns the forward's all-gathers (SP) or all-reduces (no SP), as a
        # full recompute does, and keeps the reduce-scatters (gloo runs them as all-reduces): what
        # layer_cost._selective_tp_rerun charges (half the forward volume with SP, all of it without)
        rerun = "all_gather" if sp else "all_reduce"
        extra = counts["op"][rerun] - counts["none"][rerun]
        assert extra > 0 and extra == counts["full"][rerun] - counts["none"][rerun], counts
        if sp:
            assert counts["op"]["all_reduce"] == counts["none"]["all_reduce"], counts
            assert counts["full"]["all_reduce"] > counts["none"]["all_reduce"], counts
