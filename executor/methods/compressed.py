"""The skeleton every all-gather or adaptive compressor runs in: a codec that averages a list of per-tensor
gradients over the data-parallel group through a `Comm`, plugged into DDP as a comm hook or, for
tensor-parallel (DTensor) replicas and zero-bubble schedules, into the replica reducer.

- `Codec.exchange(comm, items)`: items are (key, flat fp32 gradient view, the parameter's
  shape); on return each view
  holds the group's average of the decompressed gradients, identical on every rank (every rank
  decodes the same gathered payloads in rank order). Per-tensor state (error feedback, warm-start
  factors, levels) is keyed by the parameter; `ordinal(key)` numbers tensors in first-seen order,
  the same on every rank (same buckets, same order), for seeds that must agree across ranks.
- `DistComm`: torch.distributed on the group, every collective counted into the ByteCounter
  (meshplan/comm_bytes.py: all_gather counts this rank's contribution, all_reduce its buffer).
- `comm_hook(codec_factory)`: a DDP hook that splits the bucket's flat buffer into its
  parameters' gradients, exchanges them and returns a completed future (the hook waits for its
  collectives; DDP overlaps the next buckets' backward only until this one is called).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.allreduce import ReplicaGradReducer, buckets
from meshplan.executor.methods.counting import tensor_bytes
from meshplan.executor.shards import local_shard


class DistComm:
    """Collectives on one process group, counted on `axis`."""

    def __init__(self, group, counter: ByteCounter, axis: str):
        self.group, self.counter, self.axis = group, counter, axis
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def all_gather(self, payload: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `payload` (same size on all ranks), in rank order."""
        self.counter.add(self.axis, "all_gather", self.world, tensor_bytes(payload))
        out = torch.empty(self.world * payload.numel(), dtype=payload.dtype, device=payload.device)
        dist.all_gather_into_tensor(out, payload.contiguous(), group=self.group)
        return list(out.view(self.world, -1).unbind(0))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place."""
        self.counter.add(self.axis, "all_reduce", self.world, tensor_bytes(tensor))
        dist.all_reduce(tensor, group=self.group)
        return tensor


class Codec:
    """Base: per-tensor ordinals and the step count (one `exchange` call per bucket per step)."""

    def __init__(self, params: dict, world: int, rank: int):
        self.params, self.world, self.rank = params, world, rank
        self._ordinals: dict[int, int] = {}
        self._steps: dict[int, int] = {}

    def ordinal(self, key: int) -> int:
        return self._ordinals.setdefault(key, len(self._ordinals))

    def step_of(self, key: int) -> int:
        """How many times this tensor was exchanged before (its step)."""
        step = self._steps.get(key, 0)
        self._steps[key] = step + 1
        return step

    def exchange(self, comm, items: list[tuple[int, torch.Tensor, tuple]]) -> None:
        raise NotImplementedError

    def notes(self) -> list[str]:
        """Lines for the run's notes (e.g. Accordion's share of steps at each setting)."""
        return []


def split_bucket(bucket) -> list[tuple[int, torch.Tensor, tuple]]:
    """(key, flat view into the bucket buffer, shape) per parameter, in the buffer's order."""
    buffer, out, offset = bucket.buffer(), [], 0
    for p in bucket.parameters():
        out.append((id(p), buffer[offset : offset + p.numel()], tuple(p.shape)))
        offset += p.numel()
    return out


def comm_hook(make_codec, group, params: dict, counter: ByteCounter, axis: str):
    """(codec, hook) for DDP.register_comm_hook: `make_codec(params, world, rank)` exchanges
    each bucket's gradients; the codec is DDP's hook state."""
    codec = make_codec(params, dist.get_world_size(group), dist.get_rank(group))
    comm = DistComm(group, counter, axis)
    counter.notes_from.append(codec)

    def compressed_hook(state, bucket):  # no annotations: DDP checks them against the class
        state.exchange(comm, split_bucket(bucket))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    return codec, compressed_hook


class CompressedReplicaReducer(ReplicaGradReducer):
    """The replica reducer (TP replicas, zero-bubble) with a codec instead of the dense
    all-reduce: after backward, each bucket of local gradient shards is exchanged by the codec."""

    def __init__(
        self,
        params: list[nn.Parameter],
        group,
        *,
        counter: ByteCounter,
        axis: str,
        bucket_bytes: int,
        make_codec,
        method_params: dict,
    ):
        super().__init__(params, group, counter=counter, axis=axis, bucket_bytes=bucket_bytes)
        self.codec = make_codec(method_params, self.world, dist.get_rank(group))
        self.comm = DistComm(group, counter, axis)
        counter.notes_from.append(self.codec)

    @torch.no_grad()
    def reduce(self) -> None:
        for p in self.params:
            if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        held = {id(g): id(p) for p in self.params if p.grad is not None for g in (local_shard(p.grad),)}
        grads = [local_shard(p.grad) for p in self.params if p.grad is not None]
        for bucket in buckets(grads, self.bucket_bytes):
            flats = [g.reshape(-1).float() for g in bucket]
            self.codec.exchange(self.comm, [(held[id(g)], f, tuple(g.shape)) for g, f in zip(bucket, flats)])
            for g, flat in zip(bucket, flats):
                if flat.data_ptr() != g.data_ptr():
                    g.copy_(flat.view_as(g))


def replica_reducer(make_codec, warmup_param: str = ""):
    """A `replica_reducer(params, group, counter, axis, bucket_bytes, method_params)` for the
    module; `warmup_param` names the parameter counting the steps left out of the steady state
    (top-k's warmup_steps, Accordion's start_iter), as the module's comm_hook does."""

    def build(params, group, *, counter, axis, bucket_bytes, method_params):
        if warmup_param:
            counter.warmup_steps = max(counter.warmup_steps, method_params.get(warmup_param, 0))
        return CompressedReplicaReducer(
            params,
            group,
            counter=counter,
            axis=axis,
            bucket_bytes=bucket_bytes,
            make_codec=make_codec,
            method_params=method_params,
        )

    return build
