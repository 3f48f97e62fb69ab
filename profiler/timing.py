"""Measured per-layer timing and peak memory on the local device (CPU here, CUDA where present).

For each representative layer and microbatch size: `WARMUP` forward+backward passes, then the
median of `REPEATS` timed passes (on CPU: at least `MIN_WINDOW_S` of them, in `CPU_ROUNDS`
round-robin rounds over the sizes, the median of the rounds), forward and backward
separately (CUDA events on GPU; on CPU the median process CPU time times the host share, wall/CPU
over all timed passes: see step_timing.py), with `concurrent - 1` busy neighbour processes when
asked. Each representative's once-per-step optimizer work (clip + AdamW + zero_grad) is timed
the same way (LayerProfile.optimizer_step_s). Then one more pass
measures the peak memory (live-tensor tracker on CPU, allocator peak on CUDA) beside the
analytic prediction. Identical layers copy the representative's timings (`reused_from`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable

import torch

from meshplan.errors import MeshplanError
from meshplan.model_profile import LayerTiming, ModelProfile
from meshplan.models.zoo.base import LayeredModel
from meshplan.profiler.capture import LayerCapture
from meshplan.profiler.concurrency import SYNC_PAUSE_S, BusyNeighbours
from meshplan.profiler.memory import LiveBytes, available_memory_bytes, layer_param_bytes, predict_peak_bytes
from meshplan.profiler.runner import (
    InputSpec,
    backward_ones,
    call,
    clear_grad,
    make_input,
    materialise_layer,
    nbytes,
    run_dtype,
)
from meshplan.profiler.step_timing import HostShare, cores_available, optimizer_step_cpu_s
from meshplan.profiler.wrapper_timing import clamped, wrapper_overheads

WARMUP = 2
REPEATS = 5
MIN_WINDOW_S = 0.25
"""CPU: keep timing passes until their wall time covers many scheduler time slices."""
MAX_REPEATS = 400
CPU_ROUNDS = 3
"""CPU: microbatch sizes are timed round-robin in this many rounds (see _measure_sizes)."""
RANK_THREADS = 1
"""Intra-op threads of one CPU rank (executor/launch.py runs every rank with OMP_NUM_THREADS=1)."""


def time_layers(
    profile: ModelProfile,
    model: LayeredModel,
    rep_of: dict[str, str],
    inputs: dict[str, InputSpec],
    captures: dict[str, LayerCapture],
    *,
    spec: str,
    overrides: dict | None,
    device: str,
    microbatch_sizes: list[int],
    concurrent: int,
    progress: Callable = lambda items, label: items,
) -> None:
    """Fill `profile.layers[*].timings` (and device, concurrent, notes) by measuring representatives."""
    reps = list(dict.fromkeys(rep_of.values()))
    check_fits(model, reps, inputs, captures, device, max(microbatch_sizes))
    measured: dict[str, list[LayerTiming]] = {}
    optimizer_s: dict[str, float] = {}
    call_s: dict[str, float] = {}
    neighbours = _neighbours(device, concurrent, profile.notes)
    share = HostShare(floor=max(1.0, (neighbours + 1) / cores_available()))
    busy = BusyNeighbours(neighbours, spec, overrides, device) if neighbours else None
    with busy or contextlib.nullcontext(), rank_threads(device):
        for rep in progress(reps, f"timing on {device}"):
            layer = materialise_layer(model, rep, device)
            measured[rep] = _measure_sizes(
                layer, model, rep, inputs[rep], captures[rep], microbatch_sizes, device, busy, share
            )
            if not device.startswith("cuda"):
                optimizer_s[rep], call_s[rep] = optimizer_step_cpu_s(layer, make_input(model, inputs[rep], 1, device))
            del layer
        overheads = (
            {} if device.startswith("cuda") else _wrapper_overheads(profile, model, reps, inputs, microbatch_sizes)
        )
    factor = 1.0 if device.startswith("cuda") else share.factor
    for lp in profile.layers:
        rep = rep_of[lp.name]
        lp.timings = [
            LayerTiming(
                **{
                    **t.__dict__,
                    "forward_s": t.forward_s * factor,
                    "backward_s": t.backward_s * factor,
                    "reused_from": "" if rep == lp.name else rep,
                }
            )
            for t in measured[rep]
        ]
        lp.optimizer_step_s = optimizer_s.get(rep, 0.0) * factor
        lp.framework_overhead_s = {k: v * factor for k, v in overheads.get(rep, {}).items()}
        if rep in call_s:
            lp.framework_overhead_s["optimizer_call"] = call_s[rep] * factor
    if factor != 1.0 or not device.startswith("cuda"):
        profile.notes.append(
            f"host share {factor:.2f}: CPU timings are median process CPU time x wall/CPU "
            f"over all timed passes (ranks and other load sharing the cores; measured "
            f"{share.wall_s / max(share.cpu_s, 1e-12):.2f}, floor {share.floor:.2f} = "
            f"{neighbours + 1} ranks / {cores_available()} cores)"
        )
    profile.device = device_name(device)
    profile.concurrent = neighbours + 1
    profile.notes.append(
        f"timed {len(reps)} representative layer(s) on {profile.device} in "
        f"{str(run_dtype(device)).removeprefix('torch.')}: {WARMUP} warm-up passes, median of "
        f"{REPEATS}, with {neighbours} busy neighbour process(es); identical layers reuse "
        "the timings (timings[].reused_from)"
    )


@contextlib.contextmanager
def rank_threads(device: str):
    """On CPU, time with the intra-op thread count every rank runs with (executor/launch.py sets
    OMP_NUM_THREADS=1 per rank; the busy neighbours run one thread too). With more, the timed
    process's idle OpenMP threads spin on the shared cores and its CPU time grows several-fold."""
    if device.startswith("cuda"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(RANK_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _wrapper_overheads(
    profile: ModelProfile, model: LayeredModel, reps: list[str], inputs, batches: list[int]
) -> dict[str, dict[str, float]]:
    """TP (DTensor), FSDP2 and recompute overheads of each representative on a one-rank mesh
    (wrapper_timing), recompute at the smallest and largest microbatch; clamped at zero."""
    rules = {lp.name: lp.tp for lp in profile.layers}
    layers = {rep: materialise_layer(model, rep, "cpu") for rep in reps}
    sizes = sorted({min(batches), max(batches)})
    xs = {rep: {b: make_input(model, inputs[rep], b, "cpu") for b in sizes} for rep in reps}
    return clamped(
        wrapper_overheads(layers, rules, xs, functools.partial(measure_times, min_window_s=0.0), window_s=MIN_WINDOW_S)
    )


def _neighbours(device: str, concurrent: int, notes: list[str]) -> int:
    """Busy processes besides the timed one; on CUDA one per *other* GPU (a rank owns its GPU)."""
    wanted = concurrent - 1
    if not device.startswith("cuda") or wanted == 0:
        return wanted
    others = torch.cuda.device_count() - 1
    if others < wanted:
        notes.append(
            f"--concurrent {concurrent}: only {others} other GPU(s) here, so {others} busy "
            "neighbour(s); ranks sharing one GPU would not be how a job runs"
        )
    return min(wanted, others)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    return device


def _measure_sizes(
    layer, model, fqn, spec, capture, sizes: list[int], device, busy, share: HostShare | None = None
) -> list[LayerTiming]:
    """One LayerTiming per microbatch size. On CPU the sizes are timed round-robin in CPU_ROUNDS
    rounds of MIN_WINDOW_S / CPU_ROUNDS each, and each time is the median of the rounds'
    medians: a burst of other load on a shared host then spoils one round of one size, not the
    size's whole measurement (it had doubled one size's time against its neighbours)."""
    rounds = 1 if device.startswith("cuda") else CPU_ROUNDS
    xs = {b: make_input(model, spec, b, device) for b in sizes}
    times: dict[int, list[tuple[float, float]]] = {b: [] for b in sizes}
    for _ in range(rounds):
        for b in sizes:
            if busy is not None:
                busy.run(fqn, b, spec)
            times[b].append(measure_times(layer, xs[b], device, share=share, min_window_s=MIN_WINDOW_S / rounds))
    out = []
    for b in sizes:
        x = xs[b]
        predicted = predict_peak_bytes(
            layer_param_bytes(layer, run_dtype(device)),
            capture,
            b,
            run_dtype(device),
            nbytes(x),
            (x[0] if isinstance(x, tuple) else x).requires_grad,
        )
        out.append(
            LayerTiming(
                microbatch_size=b,
                forward_s=statistics.median(t[0] for t in times[b]),
                backward_s=statistics.median(t[1] for t in times[b]),
                peak_bytes=measure_peak_bytes(layer, x, device),
                predicted_peak_bytes=predicted,
            )
        )
    return out


def check_fits(
    model: LayeredModel,
    reps: list[str],
    inputs: dict[str, InputSpec],
    captures: dict[str, LayerCapture],
    device: str,
    batch: int,
) -> None:
    """Refuse to time a layer whose predicted forward+backward exceeds the device's memory."""
    dtype = run_dtype(device)
    if device.startswith("cuda"):
        capacity = torch.cuda.mem_get_info(torch.device(device))[0]
    else:
        capacity = available_memory_bytes()
    for rep in reps:
        spec = inputs[rep]
        elem = torch.finfo(dtype).bits // 8 if "float" in spec.dtype else 8
        need = predict_peak_bytes(
            layer_param_bytes(model.get_submodule(rep), dtype),
            captures[rep],
            batch,
            dtype,
            sum(batch * math.prod(shape) * elem for shape, _ in spec.parts or [(spec.shape, spec.dtype)]),
        )
        if capacity and need > 0.9 * capacity:
            raise MeshplanError(
                f"--device {device}: timing {rep} at microbatch {batch} needs about "
                f"{need / 2**30:.1f} GiB, {capacity / 2**30:.1f} GiB is free; use "
                "--device meta, smaller --microbatch, or smaller shapes with --set"
            )


def measure_times(
    layer: torch.nn.Module,
    x: torch.Tensor,
    device: str,
    warmup: int = WARMUP,
    repeats: int = REPEATS,
    share: HostShare | None = None,
    min_window_s: float = MIN_WINDOW_S,
) -> tuple[float, float]:
    """Median forward and backward seconds of `layer` on `x` after `warmup` passes: CUDA event
    time on GPU; on CPU process CPU time (wall and CPU totals go to `share`)."""
    cuda = device.startswith("cuda")
    fwd, bwd = [], []
    window_s, i = 0.0, 0
    while i < warmup + repeats or (not cuda and window_s < min_window_s and i < warmup + MAX_REPEATS):
        for p in layer.parameters():
            p.grad = None
        clear_grad(x)
        c0, t = time.process_time(), _clock(cuda)
        y = call(layer, x)
        c_mid, t_mid = time.process_time(), _clock(cuda)
        backward_ones(y)
        c_end, t_end = time.process_time(), _clock(cuda)
        if i >= warmup:
            fwd.append(_elapsed_s(t, t_mid, cuda) if cuda else c_mid - c0)
            bwd.append(_elapsed_s(t_mid, t_end, cuda) if cuda else c_end - c_mid)
            if not cuda:
                window_s += t_end - t
                if share is not None:
                    share.add(t_end - t, c_end - c0)
        if not cuda and share is not None:
            time.sleep(SYNC_PAUSE_S)  # like the busy neighbours: a rank's wait on its peers
        i += 1
    return statistics.median(fwd), statistics.median(bwd)


def _clock(cuda: bool):
    if not cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _elapsed_s(start, end, cuda: bool) -> float:
    if not cuda:
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure_peak_bytes(layer: torch.nn.Module, x: torch.Tensor, device: str) -> int:
    """Peak bytes during one forward+backward, parameters and input included."""
    for p in layer.parameters():
        p.grad = None
    clear_grad(x)
    resident = sum(p.numel() * p.element_size() for p in layer.parameters()) + nbytes(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        backward_ones(call(layer, x))
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base + resident
    with LiveBytes(resident) as tracker:
        backward_ones(call(layer, x))
    return tracker.peak_bytes
