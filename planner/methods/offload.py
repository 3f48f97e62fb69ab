"""State placement's cost objects (the offload axis of meshplan/dp_methods.py): what offload=cpu
(ZeRO-Offload, Ren et al. 2021) and offload=nvme (ZeRO-Infinity, Rajbhandari et al. 2021) take
off the device, and what they cost per step; planner/rank/dp_cost.py delegates to `offload_cost()`.

Who steps the optimizer (executor/methods/offload_*.py):
- FSDP2's CPUOffloadPolicy (offload=cpu, ZeRO-2/3, no delayed update): the sharded weights,
  gradients and states live on the host; each gather first copies the fp32 shard host -> device
  (twice per microbatch with ZeRO-3), the reduce-scattered gradient shard goes back once per step,
  the host steps the shard.
- meshplan's HostOptimizer (offload=cpu on ZeRO-0/1 or with delayed_update; offload=nvme on
  every stage): weights and gradients stay on the device; once per step the rank's gradients go
  down and its parameters come up over PCIe (4 + 4 bytes per fp32 parameter), the host runs the
  step; offload=nvme reads and writes the states from disk, prefetched behind the host step.
Time, once per step: the gradients' copy down hidden behind backward up to the calibration's
dp_overlap (ZeRO-Offload streams them per bucket), then max(host step, NVMe traffic) and the
parameters' copy up, exposed. NVMe traffic: the states read and written at the nvme link's read
and write bandwidths, plus its latency twice per state file (nvme_store.py keeps one file per
parameter tensor, each synced on write; profile-links measures the latency on 4 KiB files). The host step is memory-bound (CPU Adam reads parameter, gradient,
m, v and writes parameter, m, v: 28 bytes per fp32 parameter) at cluster.host_memory_gbps.
delayed_update runs all of it behind the next step's compute: only the excess over the
forward+backward window (backward x 1.5) shows. On a CPU cluster the host is the device: PCIe
and the host step's memory traffic cost nothing beyond the device's own optimizer step (which
stays in the layer costs), but HostOptimizer steps each parameter tensor with an optimizer of its
own and handles each tensor in Python (gradient placement, its group's settings, the master),
so part of an optimizer call's fixed cost is paid once per tensor (CpuOffload._calls_s,
HOST_TENSOR_CALL_SHARE); offload=cpu saves no memory; offload=nvme still moves the states to
disk, and no host_device bytes are counted (no copy crosses devices).
offload=nvme params=true (ZeRO-3, ZeRO-Infinity's parameter tier): the weight shards leave the
device too; each layer's shard is read from disk before each gather (forward and backward, per
microbatch, exposed) and read + written again by the host step: 4 bytes per shard element each.
"""

from __future__ import annotations

from fractions import Fraction

from meshplan.comm_bytes import wire_bytes
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.optimizer import optimizer_call_s
from meshplan.planner.cost.state import state_bytes
from meshplan.planner.methods.axes import OffloadCost

CPU_ADAM_BYTES_PER_PARAM = 28
"""fp32 Adam step traffic per parameter: read p, g, m, v (16 B), write p, m, v (12 B)."""
HOST_TENSOR_CALL_SHARE = 0.53
"""What HostOptimizer adds per parameter tensor, as a share of the profile's optimizer call
(framework_overhead_s["optimizer_call"]: clip + AdamW + zero_grad's fixed cost), both measured on
one idle core of this host, on gpt h384 x 4 (69 tensors): HostOptimizer(AdamW).step over the
model minus AdamW.step over it, median of 30 interleaved pairs, 0.36 ms per extra tensor; the
profiler's optimizer_call 0.67 / 0.69 ms in two profiles. Both are host Python, so contention
scales them alike and the share carries to the profile's contended call."""
FORWARD_OVER_BACKWARD = 0.5
"""Forward time over backward time (2 vs 4 FLOPs per parameter and token), for DPU's window."""


class Offload:
    """offload=none: everything on the device."""

    host_step = False
    """The optimizer step runs on the host (the device's layer optimizer step is not paid)."""

    def __init__(self, ctx: Context, cand: Candidate, params: dict):
        self.ctx, self.cand, self.params = ctx, cand, params
        self.zero, self.shard = cand.zero, (cand.state_shard if cand.zero >= 2 else 1)
        self.on_cpu = ctx.cluster.device.kind == "cpu"

    def state_bytes(self, local: float, weights: float, grads: float, optim: float) -> tuple[float, float, float]:
        return weights, grads, optim

    def per_microbatch_s(self, local: float) -> float:
        return 0.0

    def step_s(self, local_params: float, backward_window_s: float) -> float:
        return 0.0

    def bytes_per_step(self, local_elems: float, paged_elems: float = 0.0) -> dict[str, float | Fraction]:
        return {}


class CpuOffload(Offload):
    """offload=cpu (module docstring)."""

    def __init__(self, ctx, cand, params):
        super().__init__(ctx, cand, params)
        self.delayed = bool(params.get("delayed_update"))
        self.policy = self.zero >= 2 and not self.delayed
        self.host_step = not self.on_cpu

    def state_bytes(self, local, weights, grads, optim):
        if self.on_cpu:
            return weights, grads, optim  # the host is the device
        if self.policy:  # FSDP2 CPUOffloadPolicy: sharded weights, grads and states on the host
            return (local * 2 if self.zero == 2 else 0.0), 0.0, 0.0
        return weights, grads, 0.0

    def per_microbatch_s(self, local: float) -> float:
        """FSDP2's policy: the fp32 shard copied host -> device before each gather."""
        link = self.ctx.cluster.host_device
        if not self.policy or link is None or self.on_cpu:
            return 0.0
        shard_bytes = 4 * local / self.shard
        return (2 if self.zero == 3 else 1) * (link.latency_s + shard_bytes / (link.bandwidth_gbps * 1e9))

    def _host_params(self, local_params: float) -> float:
        """Parameters this rank's host steps: its ZeRO-1 partition or FSDP shard."""
        if self.zero == 1:
            return local_params / self.cand.dp
        return local_params / self.shard

    def _pcie_s(self, nbytes: float) -> float:
        link = self.ctx.cluster.host_device
        if link is None or self.on_cpu or nbytes <= 0:
            return 0.0
        return link.latency_s + nbytes / (link.effective_gbps("default") * 1e9)

    def _host_s(self, params: float) -> float:
        bw = self.ctx.cluster.host_memory_gbps
        if self.on_cpu or not bw:
            return 0.0
        return params * CPU_ADAM_BYTES_PER_PARAM / (bw * 1e9)

    def _io_s(self, params: float) -> float:
        return 0.0

    def _calls_s(self) -> float:
        """HostOptimizer's step calls on CPU ranks: it builds one inner torch optimizer per
        parameter tensor it steps (host_optimizer.py), so where the host is the device the fixed
        cost of an optimizer call (the profile's framework_overhead_s["optimizer_call"], scaled
        like the layers' steps) is paid once per tensor instead of once per step. FSDP2's policy
        steps one optimizer over its shards and pays nothing here; on accelerators the host's
        calls run beside the device's and are not counted."""
        if self.policy or not self.on_cpu:
            return 0.0
        return max(0.0, self._files() - 1) * HOST_TENSOR_CALL_SHARE * optimizer_call_s(self.ctx)

    def _files(self) -> float:
        """Parameter tensors one step handles one by one: one inner optimizer (and with
        offload=nvme one state file) per trainable parameter tensor the rank steps: its pipeline
        stage's share of the model's tensors (layers spread evenly; a tensor-parallel or FSDP
        shard of every one of them), a ZeRO-1 partition 1/dp of those; 1 where the profile lists
        no parameter shapes."""
        tensors = sum(len(layer.param_shapes) for layer in self.ctx.profile.layers) / self.cand.pp
        return max(1.0, tensors / self.cand.dp if self.zero == 1 else tensors)

    def step_s(self, local_params: float, backward_window_s: float) -> float:
        host = self._host_params(local_params)
        if self.on_cpu:  # the device's own step is in the layer costs; one call per tensor is extra
            return self._calls_s()
        hidden = self.ctx.cluster.calibration.dp_overlap * backward_window_s
        down = self._pcie_s(4 * host)
        up = 0.0 if self.policy else self._pcie_s(4 * host)  # the policy's copies up are per gather
        work = max(self._host_s(host), self._io_s(host))
        if self.delayed:  # DPU: behind the next step's forward + backward
            return max(0.0, down + work + up - (1 + FORWARD_OVER_BACKWARD) * backward_window_s)
        return max(0.0, down - hidden) + work + up

    def bytes_per_step(self, local_elems: float, paged_elems: float = 0.0) -> dict[str, float | Fraction]:
        """What the HostOptimizer counts (executor/methods/host_optimizer.py): gradients down and
        parameters up, 4 bytes each per parameter it steps, where a copy crosses devices (none
        on CPU ranks: the host is the device); FSDP2's policy copies are not counted."""
        if self.policy or self.on_cpu:
            return {}
        return {"host_device": 2 * wire_bytes("send_recv", 2, 4 * local_elems)}


class NvmeOffload(CpuOffload):
    """offload=nvme: as the HostOptimizer path of offload=cpu, plus the states read and written
    from disk every step, prefetched behind the host step."""

    def __init__(self, ctx, cand, params):
        super().__init__(ctx, cand, {})
        self.policy = False
        self.host_step = not self.on_cpu
        self.paged = bool(params.get("params")) and self.zero == 3
        """params=true: the parameter shards on NVMe too (executor/methods/param_pager.py)."""

    def _state_bytes_per_param(self) -> float:
        return state_bytes(self.ctx)[2]

    def state_bytes(self, local, weights, grads, optim):
        """The states on disk; with params=true the weight shards too (the gathered unit in
        flight is the working set's, not a resident shard)."""
        return (0.0 if self.paged else weights), grads, 0.0

    def per_microbatch_s(self, local: float) -> float:
        """params=true: the layer's shard read from disk before its forward and its backward
        gather (param_pager.py reads on the training thread: exposed)."""
        link = self.ctx.cluster.nvme
        if not self.paged or link is None:
            return 0.0
        return 2 * (link.latency_s + 4 * local / self.shard / (link.effective_gbps("read") * 1e9))

    def _io_s(self, params: float) -> float:
        """Each file's latency twice (a synced write, a read: the link's latency is profile-links'
        4 KiB write + fsync and cold read, averaged) plus the states read and written at the
        link's bandwidths."""
        link = self.ctx.cluster.nvme
        if link is None:
            return float("inf")
        nbytes = params * (self._state_bytes_per_param() + 4 * self.paged)  # params=true: the shard too
        return (
            2 * link.latency_s * self._files() * (1 + self.paged)
            + nbytes / (link.effective_gbps("read") * 1e9)
            + nbytes / (link.effective_gbps("write") * 1e9)
        )

    def step_s(self, local_params: float, backward_window_s: float) -> float:
        base = super().step_s(local_params, backward_window_s)
        if self.on_cpu:  # the device's own step is in the layer costs; the disk traffic is extra
            return self._io_s(self._host_params(local_params)) + self._calls_s()
        return base

    def bytes_per_step(self, local_elems: float, paged_elems: float = 0.0) -> dict[str, float | Fraction]:
        """Gradients down and parameters up where they cross devices, the states read + written
        (steady state), and with params=true each shard read at every gather (`paged_elems`: the
        gathered shards, counted per gather) and read + written by the step."""
        states = 2 * self._state_bytes_per_param() * local_elems
        if self.paged:
            states += 4 * (paged_elems + 2 * local_elems)
        out: dict[str, float | Fraction] = {"nvme": wire_bytes("send_recv", 2, states)}
        if not self.on_cpu:
            out["host_device"] = 2 * wire_bytes("send_recv", 2, 4 * local_elems)
        return out


OFFLOADS = {"none": Offload, "cpu": CpuOffload, "nvme": NvmeOffload}
"""The offload axis' cost objects by registry name."""


def offload_cost(ctx: Context, cand: Candidate) -> OffloadCost:
    name, params = cand.method("offload")
    return OFFLOADS[name](ctx, cand, params)
