"""The host optimizer step of offload=cpu (ZeRO-Offload) and offload=nvme (ZeRO-Infinity), for the
layouts FSDP2's CPUOffloadPolicy does not cover (DDP, ZeRO-1, ZeRO-2, tensor-parallel shards).

`HostOptimizer` wraps the run's torch optimizer class (AdamW or SGD): each step it copies this
rank's gradients device -> host, runs the *same* torch optimizer on host fp32 master copies (one
inner optimizer per parameter, so the arithmetic is torch's own single-tensor loop, parameter by
parameter: bit-equal to the in-memory optimizer on CPU) and copies the parameters host -> device.
Where the device is the host (CPU ranks) the master is the parameter itself: nothing moves and
nothing is counted; on a GPU the gradients down and parameters up are counted on the
"host_device" axis, which is what the cost model predicts (planner/methods/offload.py).

- offload=nvme: every tensor state of the size of its parameter (Adam's exp_avg / exp_avg_sq,
  SGD's momentum) lives in an `NvmeStore` file, read from the disk (not the page cache) when that
  parameter is stepped and written through after; the next parameter's states are read ahead on
  a thread while this one computes (prefetch), so host memory holds about two parameters' states
  at a time. Bytes read and
  written are counted on the "nvme" axis.
- delayed_update (DPU, Ren et al. 2021 Sec 5): the host step of step t runs on a thread during
  step t+1 and its result is copied to the device at the end of step t+1, so
  x_{t+1} = x_t - lr u(g(x_{t-1})) (x_1 = x_0): one step of staleness, approximate.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.distributed.tensor import DTensor

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.counting import tensor_bytes
from meshplan.executor.methods.nvme_store import NvmeStore
from meshplan.executor.methods.param_pager import pager_of
from meshplan.executor.shards import local_shard


def _placed_like(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The gradient in its parameter's placements: a tensor-parallel weight's gradient can come
    back Replicate while the weight is Shard(0) (the shard is then a local slice, no traffic)."""
    if isinstance(grad, DTensor) and isinstance(param, DTensor) and grad.placements != param.placements:
        return grad.redistribute(param.device_mesh, param.placements)
    return grad


class HostOptimizer(torch.optim.Optimizer):
    """torch.optim.Optimizer whose step runs on the host (module docstring). Keyword-only extras:
    `inner_class` (the torch optimizer), `counter`, `store` (an NvmeStore or None), `delayed`."""

    def __init__(
        self,
        params,
        *,
        inner_class: type,
        counter: ByteCounter | None = None,
        store: NvmeStore | None = None,
        delayed: bool = False,
        **defaults,
    ):
        super().__init__(params, defaults)
        self.counter = counter if counter is not None else ByteCounter()
        self.store, self.delayed = store, delayed
        self.entries = []  # (param, group index, master, inner optimizer)
        self._on_host = []  # master IS the parameter (CPU device, no DPU)
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                local = local_shard(p).detach()
                on_host = local.device.type == "cpu" and not delayed
                master = local if on_host else local.to("cpu", copy=True)
                master = torch.nn.Parameter(master, requires_grad=False) if not on_host else master
                inner = inner_class([master], **{k: v for k, v in group.items() if k != "params"})
                self.state[p] = inner.state[master]  # the same dict: what a step holds (executor/memory.py)
                self.entries.append((p, gi, master, inner))
                self._on_host.append(on_host)
        self._pending = None  # DPU: the host step running on a thread
        self._pool = ThreadPoolExecutor(max_workers=1) if (store is not None or delayed) else None

    # --- one step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "HostOptimizer takes no closure"
        grads = []
        for (p, gi, master, inner), on_host in zip(self.entries, self._on_host):
            if on_host:  # ZeroRedundancyOptimizer re-points parameters into its buckets after init
                master.data = local_shard(p).data
            inner.param_groups[0].update({k: v for k, v in self.param_groups[gi].items() if k != "params"})
            g = None if p.grad is None else local_shard(_placed_like(p.grad, p))
            if g is not None:
                if g.device.type != "cpu":  # a copy that crosses devices (none on CPU ranks)
                    self.counter.add("host_device", "send_recv", 2, tensor_bytes(g))  # gradient down
                g = g.to("cpu", copy=self.delayed or g.device.type != "cpu")
            grads.append(g)
        if not self.delayed:
            self._host_step(grads)
            self._upload()
            return None
        if self._pending is not None:  # DPU: last step's update is ready: it becomes the parameters
            self._pending.result()
            self._upload()
        self._pending = self._pool.submit(self._host_step, grads)
        return None

    def _host_step(self, grads: list) -> None:
        """Each parameter's optimizer step on its master, its states paged in from the store
        (prefetching the next parameter's) when offload=nvme."""
        live = [i for i, g in enumerate(grads) if g is not None]
        ahead = self._prefetch(self.store, live[0]) if self.store is not None and live else None
        for n, i in enumerate(live):
            _, _, master, inner = self.entries[i]
            if self.store is not None:
                assert ahead is not None  # each live parameter's states were prefetched
                states = ahead.result()
                ahead = self._prefetch(self.store, live[n + 1]) if n + 1 < len(live) else None
                inner.state[master].update(states)
            paged = pager_of(self.entries[i][0])  # offload=nvme params=true: the shard from its file
            if paged is not None:
                paged[0].page_in(paged[1])
            master.grad = grads[i]
            inner.step()
            master.grad = None
            if paged is not None:
                paged[0].page_out(paged[1])
            if self.store is not None:
                self._page_out(self.store, i, inner.state[master])

    def _prefetch(self, store: NvmeStore, i: int) -> Future:
        return self._pool_io().submit(store.read, i)

    def _pool_io(self) -> ThreadPoolExecutor:
        if not hasattr(self, "_io"):
            self._io = ThreadPoolExecutor(max_workers=1)
        return self._io

    def _page_out(self, store: NvmeStore, i: int, state: dict, count: bool = True) -> None:
        """Write the parameter-sized states to the store and drop them from memory."""
        master = self.entries[i][2]
        big = {k: v for k, v in state.items() if torch.is_tensor(v) and v.shape == master.shape}
        store.write(i, big, count)
        for k in big:
            del state[k]

    def _upload(self) -> None:
        for (p, _, master, _), on_host in zip(self.entries, self._on_host):
            local = local_shard(p)
            if not on_host:  # parameters up, where they cross devices
                self.counter.add("host_device", "send_recv", 2, tensor_bytes(local))
                local.copy_(master)
        if self.store is not None:
            self.counter.add("nvme", "send_recv", 2, self.store.take_bytes())

    # --- checkpoints (executor/checkpoint.py) ---------------------------------------------------
    def entry_state(self, i: int) -> dict:
        """Parameter i's whole optimizer state: the inner optimizer's, the tensors paged out to
        the NVMe store, and with delayed_update the host master (the update not yet uploaded)."""
        self._settle()
        _, _, master, inner = self.entries[i]
        state = dict(inner.state.get(master, {}))
        if self.store is not None:
            state.update(self.store.read(i, count=False))
        if self.delayed and state:
            state["host_master"] = master.detach()
        return state

    def set_entry_state(self, i: int, state: dict) -> None:
        """Restore what entry_state(i) returned (tensors copied to fresh host tensors)."""
        _, _, master, inner = self.entries[i]
        state = {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in state.items()}
        if "host_master" in state:  # DPU: the saved update lands at the next step, as it would have
            master.data.copy_(state.pop("host_master"))
            self._pending = self._done()
        inner.state[master] = self.state[self.entries[i][0]] = state
        if self.store is not None:
            self._page_out(self.store, i, state, count=False)

    def init_states(self) -> None:
        """Create every parameter's state as torch creates a template to load into: one inner step
        with a zero gradient at lr 0 (parameters unchanged, nothing counted or uploaded)."""
        for i, (_, _, master, inner) in enumerate(self.entries):
            if inner.state.get(master):
                continue
            lr = inner.param_groups[0]["lr"]
            inner.param_groups[0]["lr"] = 0.0
            master.grad = torch.zeros_like(master)
            inner.step()
            master.grad, inner.param_groups[0]["lr"] = None, lr
            if self.store is not None:
                self._page_out(self.store, i, inner.state[master], count=False)

    def state_dict(self) -> dict:
        """torch.optim's layout (states by parameter index, in param_groups order) over entry_state."""
        groups, index = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append(
                {**{k: v for k, v in group.items() if k != "params"}, "params": list(range(index, index + n))}
            )
            index += n
        states = {i: self.entry_state(i) for i in range(len(self.entries))}
        return {"state": {i: st for i, st in states.items() if st}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        for i, state in state_dict["state"].items():
            self.set_entry_state(int(i), state)

    def _settle(self) -> None:
        """A delayed step in flight finishes first (its upload stays for the next step)."""
        if self._pending is not None:
            self._pending.result()

    @staticmethod
    def _done():
        from concurrent.futures import Future

        done: Future = Future()
        done.set_result(None)
        return done

    # --- lifecycle -----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)

    def close(self) -> None:
        """Finish a pending delayed step and remove the NVMe files."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        for pool in (self._pool, getattr(self, "_io", None)):
            if pool is not None:
                pool.shutdown(wait=True)
        if self.store is not None:
            self.store.remove()


def host_optimizer_class(inner_class: type, *, counter: ByteCounter, store_factory=None, delayed: bool = False) -> type:
    """A HostOptimizer subclass taking (params, **optimizer kwargs) only, as
    ZeroRedundancyOptimizer's `optimizer_class` must; `store_factory(params)` makes the NVMe store."""

    class Host(HostOptimizer):
        def __init__(self, params, **defaults):
            params = list(params)
            flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
            store = store_factory(flat) if store_factory is not None else None
            super().__init__(params, inner_class=inner_class, counter=counter, store=store, delayed=delayed, **defaults)

    Host.__name__ = f"Host{inner_class.__name__}"
    return Host


def close_all(optimizers) -> None:
    """close() every HostOptimizer among `optimizers` (also inside ZeroRedundancyOptimizer)."""
    for opt in optimizers:
        inner = getattr(opt, "optim", opt)
        if isinstance(inner, HostOptimizer):
            inner.close()
