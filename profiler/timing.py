"""Measured per-layer timing and peak memory on the local device (CPU here, CUDA where present).

For each representative layer and microbatch size: `WARMUP` forward+backward passes, then the
median of `REPEATS` timed passes, forward and backward separately (perf_counter on CPU, CUDA
events on GPU), with `concurrent - 1` busy neighbour processes when asked. Then one more pass
measures the peak memory (live-tensor tracker on CPU, allocator peak on CUDA) beside the
analytic prediction. Identical layers copy the representative's timings (`reused_from`).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Callable

import torch

from meshplan.model_profile import LayerTiming, ModelProfile
from meshplan.profiler.capture import LayerCapture
from meshplan.profiler.concurrency import BusyNeighbours
from meshplan.errors import MeshplanError
from meshplan.profiler.memory import LiveBytes, layer_param_bytes, available_memory_bytes, predict_peak_bytes
from meshplan.profiler.runner import InputSpec, make_input, materialise_layer, run_dtype
from meshplan.profiler.zoo.base import LayeredModel

WARMUP = 2
REPEATS = 5


def time_layers(profile: ModelProfile, model: LayeredModel, rep_of: dict[str, str],
                inputs: dict[str, InputSpec], captures: dict[str, LayerCapture], *, spec: str,
                overrides: dict | None, device: str, microbatch_sizes: list[int], concurrent: int,
                progress: Callable = lambda items, label: items) -> None:
    """Fill `profile.layers[*].timings` (and device, concurrent, notes) by measuring representatives."""
    reps = list(dict.fromkeys(rep_of.values()))
    check_fits(model, reps, inputs, captures, device, max(microbatch_sizes))
    measured: dict[str, list[LayerTiming]] = {}
    neighbours = _neighbours(device, concurrent, profile.notes)
    busy = BusyNeighbours(neighbours, spec, overrides, device) if neighbours else None
    with busy or contextlib.nullcontext():
        for rep in progress(reps, f"timing on {device}"):
            layer = materialise_layer(model, rep, device)
            measured[rep] = [_measure(layer, model, rep, inputs[rep], captures[rep], b, device, busy)
                             for b in microbatch_sizes]
            del layer
    for lp in profile.layers:
        rep = rep_of[lp.name]
        lp.timings = [LayerTiming(**{**t.__dict__, "reused_from": "" if rep == lp.name else rep})
                      for t in measured[rep]]
    profile.device = device_name(device)
    profile.concurrent = neighbours + 1
    profile.notes.append(f"timed {len(reps)} representative layer(s) on {profile.device} in "
                         f"{str(run_dtype(device)).removeprefix('torch.')}: {WARMUP} warm-up passes, median of "
                         f"{REPEATS}, with {neighbours} busy neighbour process(es); identical layers reuse "
                         "the timings (timings[].reused_from)")


def _neighbours(device: str, concurrent: int, notes: list[str]) -> int:
    """Busy processes besides the timed one; on CUDA one per *other* GPU (a rank owns its GPU)."""
    wanted = concurrent - 1
    if not device.startswith("cuda") or wanted == 0:
        return wanted
    others = torch.cuda.device_count() - 1
    if others < wanted:
        notes.append(f"--concurrent {concurrent}: only {others} other GPU(s) here, so {others} busy "
                     "neighbour(s); ranks sharing one GPU would not be how a job runs")
    return min(wanted, others)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    return device


def _measure(layer, model, fqn, spec, capture, batch, device, busy) -> LayerTiming:
    x = make_input(model, spec, batch, device)
    if busy is not None:
        busy.run(fqn, batch, spec)
    forward_s, backward_s = measure_times(layer, x, device)
    predicted = predict_peak_bytes(layer_param_bytes(layer, run_dtype(device)), capture, batch,
                                   run_dtype(device), x.numel() * x.element_size(), x.requires_grad)
    return LayerTiming(microbatch_size=batch, forward_s=forward_s, backward_s=backward_s,
                       peak_bytes=measure_peak_bytes(layer, x, device), predicted_peak_bytes=predicted)


def check_fits(model: LayeredModel, reps: list[str], inputs: dict[str, InputSpec],
               captures: dict[str, LayerCapture], device: str, batch: int) -> None:
    """Refuse to time a layer whose predicted forward+backward exceeds the device's memory."""
    dtype = run_dtype(device)
    if device.startswith("cuda"):
        capacity = torch.cuda.mem_get_info(torch.device(device))[0]
    else:
        capacity = available_memory_bytes()
    for rep in reps:
        spec = inputs[rep]
        elem = torch.finfo(dtype).bits // 8 if "float" in spec.dtype else 8
        need = predict_peak_bytes(layer_param_bytes(model.get_submodule(rep), dtype), captures[rep], batch,
                                  dtype, batch * math.prod(spec.shape) * elem)
        if capacity and need > 0.9 * capacity:
            raise MeshplanError(f"--device {device}: timing {rep} at microbatch {batch} needs about "
                                f"{need / 2**30:.1f} GiB, {capacity / 2**30:.1f} GiB is free; use "
                                "--device meta, smaller --microbatch, or smaller shapes with --set")


def measure_times(layer: torch.nn.Module, x: torch.Tensor, device: str,
                  warmup: int = WARMUP, repeats: int = REPEATS) -> tuple[float, float]:
    """Median forward and backward seconds of `layer` on `x` after `warmup` passes."""
    cuda = device.startswith("cuda")
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        t = _clock(cuda)
        y = layer(x)
        t_mid = _clock(cuda)
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        t_end = _clock(cuda)
        if i >= warmup:
            fwd.append(_elapsed_s(t, t_mid, cuda))
            bwd.append(_elapsed_s(t_mid, t_end, cuda))
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
    x.grad = None
    resident = sum(p.numel() * p.element_size() for p in layer.parameters()) + x.numel() * x.element_size()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = layer(x)
        y.backward(torch.ones_like(y)) if y.requires_grad else None
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base + resident
    with LiveBytes(resident) as tracker:
        y = layer(x)
        if y.requires_grad:
            y.backward(torch.ones_like(y))
        del y
    return tracker.peak_bytes
