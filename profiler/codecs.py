"""Measured compute of the gradient compressors: each registry compressor's codec,
as the executor runs it (executor/wrappers.py: codec, LoopbackComm), timed on the profile's
device at the registry's default settings on every distinct layer's real parameter shapes
(LayerProfile.param_shapes), one intra-op thread on CPU like the layer timings.

Per layer (its trainable tensors exchanged as one bucket, DDP's unit of a hook call), after
WARMUP rounds, REPEATS rounds (round-robin over the codecs: each round times every codec on every
layer before the next round starts, so a drift of the shared host's speed lands on all codecs
alike rather than on whichever was being timed), each time one exchange at a group of 1 and one
at a group of GROUP (LoopbackComm: GROUP payloads decoded, nothing sent), and for adaptive level
sets, in the last REFIT_REPEATS rounds, one more exchange at a group of 1 that re-fits the levels
(refit_every = 1; warmed in the warm-up rounds too, so each timed re-fit starts from the last fit,
as every re-fit of a run but its first does: ALQ's coordinate descent takes about 8 ms a tensor
from a cold start, 1-2 ms from the last levels):
  decode_s = (t_GROUP - t_1) / (GROUP - 1)   per rank of the group (all-gather compressors)
  encode_s = t_1 - decode_s                  compression + what does not grow with the group
  refit_s  = t_refit - t_1                   one re-fit, paid every refit_every steps
the differences taken within each round (same host state), each term the median over the
rounds, decode_s clamped to [0, t_1] and refit_s at zero. CPU: process CPU time x the host share
a rank will see: with `profile --concurrent N` the codecs are timed beside N - 1 busy neighbour
processes running the model's largest layer (codec_neighbours, as the layers are timed), and the
share is the timed exchanges' wall / CPU; timed alone, `rank_share` adds the other ranks' demand
to the host's load that wall / CPU saw. At least the profile's ranks / cores.
CUDA: wall time between synchronisations. A codec that cannot run on the device (an error) is
left untimed with a note; the planner then models it (planner/compression.py).
Cost: gpt-tiny on this 2-core host about 1-2 s for the nine compressors.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from meshplan import dp_methods
from meshplan.executor.wrappers import CODECS, LoopbackComm, codec
from meshplan.model_profile import CodecTiming, ModelProfile
from meshplan.profiler.step_timing import HostShare, cores_available

WARMUP = 1
REPEATS = 5
GROUP = 2
"""Group size of the second timing (decoding GROUP payloads); any > 1 separates the two terms."""
REFIT_REPEATS = 2
"""Re-fits timed (the last rounds; ALQ/AMQ's fit is the slowest part, a few times the exchange)."""
ADAPTIVE = ("alq", "amq")


@contextlib.contextmanager
def codec_neighbours(analysis, spec: str, overrides: dict | None, device: str, concurrent: int, sizes: list[int]):
    """On CPU with concurrent > 1: concurrent - 1 busy neighbour processes (concurrency.py)
    running the model's largest layer at the largest microbatch while the codecs are timed, so the
    timing's wall / CPU sees the other ranks as well as the host's own load; yields how many."""
    if device.startswith("cuda") or concurrent <= 1:
        yield 0
        return
    from meshplan.profiler.concurrency import BusyNeighbours

    reps = list(dict.fromkeys(analysis.rep_of.values()))
    by_name = {lp.name: lp for lp in analysis.profile.layers}
    rep = max(reps, key=lambda r: by_name[r].forward_flops if r in by_name else 0.0)
    with BusyNeighbours(concurrent - 1, spec, overrides, device) as busy:
        busy.run(rep, max(sizes), analysis.inputs[rep])
        yield concurrent - 1


def time_codecs(profile: ModelProfile, device: str, neighbours: int = 0) -> None:
    """Fill `profile.codec_timings` for every compressor the executor has a codec for; with
    `neighbours` busy processes running beside the timing (codec_neighbours), the measured host
    share is what a rank sees, else rank_share adds the other ranks to it."""
    cuda = device.startswith("cuda")
    share = HostShare(floor=1.0 if cuda else max(1.0, profile.concurrent / cores_available()))
    groups = _distinct_layers(profile)
    timed: dict[str, CodecTiming] = {}
    timers: dict[str, dict[tuple, _LayerTimer]] = {}
    for name in dp_methods.names("compression"):
        if name in CODECS:
            try:
                timers[name] = {shapes: _LayerTimer(name, _timed_params(name), shapes, device) for shapes in groups}
            except Exception as exc:  # e.g. a codec's CPU generator on a CUDA device
                _untimed(profile, name, device, exc)
    for i in range(WARMUP + REPEATS):  # round-robin: a drift of the host's speed hits every codec alike
        for name, per in list(timers.items()):
            try:
                for timer in per.values():
                    timer.round(i, share)
            except Exception as exc:
                _untimed(profile, name, device, exc)
                del timers[name]
    per_shape_of = {name: {shapes: t.result() for shapes, t in per.items()} for name, per in timers.items()}
    factor = 1.0 if cuda else (share.factor if neighbours else rank_share(share, profile.concurrent))
    for name, per_shape in per_shape_of.items():
        timed[name] = _timing(_timed_params(name), per_shape, groups, factor)
    profile.codec_timings = timed
    profile.notes.append(
        f"timed {len(timed)} gradient compressors' codecs at their default settings on {len(groups)} "
        f"distinct layer shape set(s) (profiler/codecs.py; host share {factor:.2f}, measured "
        f"{share.factor:.2f} with {neighbours} busy neighbour(s))"
    )


def rank_share(share: HostShare, ranks: int) -> float:
    """Wall seconds per CPU second a rank's codec will see: the codecs are timed in one process
    with no busy neighbours, so its wall / CPU, m, saw only the host's other load L (m = (1 + L) / C
    on C cores once 1 + L > C). The ranks run theirs all at once beside that load: (R + L) / C =
    m + (R - 1) / C. On an otherwise idle host (m = 1) the R ranks alone: R / C. At least 1."""
    cores = cores_available()
    measured = share.wall_s / share.cpu_s if share.cpu_s > 0 else 1.0
    if measured <= 1.0:
        return max(1.0, ranks / cores)
    return max(1.0, ranks / cores, measured + (ranks - 1) / cores)


def _distinct_layers(profile: ModelProfile) -> dict[tuple, list[str]]:
    """Parameter shape sets -> the layers that have them (trainable parameters only)."""
    out: dict[tuple, list[str]] = {}
    for lp in profile.layers:
        if lp.param_shapes:
            out.setdefault(tuple(tuple(s) for s in lp.param_shapes), []).append(lp.name)
    return out


def _timed_params(name: str) -> dict:
    params = dp_methods.method("compression", name).resolve({}, f"compression {name}")
    if "critical_fraction" in params:  # Accordion: every timed step is in the first window, critical
        params["critical_fraction"] = 1.0
    return params


def _timing(params: dict, per_shape: dict, groups: dict, factor: float) -> CodecTiming:
    out = CodecTiming(params=params)
    for shapes, (encode, decode, refit) in per_shape.items():
        for fqn in groups[shapes]:
            out.encode_s[fqn], out.decode_s[fqn] = encode * factor, decode * factor
            if refit is not None:
                out.refit_s[fqn] = refit * factor
    return out


def _untimed(profile: ModelProfile, name: str, device: str, exc: Exception) -> None:
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    profile.notes.append(f"codec {name} not timed on {device} ({type(exc).__name__}: {first}): modelled")


class _LayerTimer:
    """One codec on one layer's tensors: a round at a time (time_codecs interleaves the codecs
    round by round), then (encode_s, decode_s, refit_s or None) (module docstring)."""

    def __init__(self, name: str, params: dict, shapes: tuple, device: str):
        gen = torch.Generator().manual_seed(0)
        self.shapes, self.device = shapes, device
        self.grads = [torch.randn(s, generator=gen).reshape(-1).to(device) for s in shapes]
        self.runs = {
            "one": (codec(name, params, 1), LoopbackComm(1)),
            "group": (codec(name, params, GROUP), LoopbackComm(GROUP)),
        }
        if name in ADAPTIVE:
            self.runs["refit"] = (codec(name, {**params, "refit_every": 1}, 1), LoopbackComm(1))
        self.timed: list[dict[str, float]] = []

    @torch.no_grad()
    def round(self, i: int, share: HostShare) -> None:
        rounds, got = WARMUP + REPEATS, {}
        for key, (c, comm) in self.runs.items():
            if key == "refit" and WARMUP <= i < rounds - REFIT_REPEATS:
                continue  # warmed once like the others: a re-fit starts from the last fit
            items = [(j, g.clone(), shape) for j, (g, shape) in enumerate(zip(self.grads, self.shapes))]
            got[key] = _exchange_s(c, comm, items, self.device, share)
        if i >= WARMUP:
            self.timed.append(got)

    def result(self) -> tuple[float, float, float | None]:
        """Differences within a round (the same host state), then the median over the rounds."""
        timed = self.timed
        one = statistics.median(t["one"] for t in timed)
        decode = min(one, max(0.0, statistics.median((t["group"] - t["one"]) / (GROUP - 1) for t in timed)))
        refits = [t["refit"] - t["one"] for t in timed if "refit" in t]
        return one - decode, decode, (max(0.0, statistics.median(refits)) if refits else None)


def _exchange_s(c, comm, items, device: str, share: HostShare) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        c.exchange(comm, items)
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    c.exchange(comm, items)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    share.add(wall, cpu)
    return cpu
