"""sync=master: master-aggregation data parallelism (the parameter-server description).

Each step every worker computes its gradients alone, sends them to the master (group rank 0),
which averages them, clips and steps its optimizer, and sends the updated parameters back to
every worker. Exact: the master applies DDP's averaged gradient with DDP's optimizer, so the
iterates equal all-reduce's (up to summation order). Workers keep no optimizer state.

Traffic is explicit point-to-point (isend / irecv), so the master's link carries what the classic
description says: (N-1) x the gradients in, (N-1) x the parameters out, one flat fp32 vector each.
Counted (meshplan/comm_bytes.py, bytes each rank sends): a worker "send_recv" of the gradients,
the master one "send_recv" of the parameters per worker; `received_bytes` keeps what the master
took in (checked against the model's size in tests).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from meshplan.executor.methods.sync import SyncMethod, flat, no_ddp_comm_hook, tensor_bytes, trainable, unflat

USES_DDP = False
ddp_comm_hook = no_ddp_comm_hook


class MasterAggregation(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        self.master = dist.get_global_rank(self.group, 0)
        self.received_bytes = 0

    def wrap_optimizers(self, optimizers, name, lr, weight_decay):
        return optimizers if self.rank == 0 else []  # only the master steps

    def train_step(self, par, optimizers, batch, grad_clip):
        params = trainable(par.parameters())
        for p in params:
            p.grad = None
        loss = par.step_local(*batch)
        for p in params:
            if p.grad is None:  # a parameter this batch did not reach
                p.grad = torch.zeros_like(p)
        grads = flat([p.grad for p in params])
        self._gather(grads, params)
        norm = par.clip_grad_norm_(grad_clip) if self.rank == 0 else torch.zeros(())
        for opt in optimizers:
            opt.step()
        self._broadcast(params)
        return loss, norm

    def _gather(self, grads: torch.Tensor, params) -> None:
        """Workers send their gradients; the master sums them with its own and averages."""
        if self.rank != 0:
            self.counter.add("dp_replicate", "send_recv", self.world, tensor_bytes(grads))
            dist.send(grads, dst=self.master, group=self.group)
            return
        inbox = [torch.empty_like(grads) for _ in range(self.world - 1)]
        works = [
            dist.irecv(buf, src=dist.get_global_rank(self.group, r), group=self.group)
            for r, buf in enumerate(inbox, start=1)
        ]
        for w in works:
            assert w is not None  # None only on a rank outside the group
            w.wait()
        self.received_bytes += sum(tensor_bytes(b) for b in inbox)
        total = grads.clone()
        for buf in inbox:
            total += buf
        unflat(total / self.world, [p.grad for p in params])

    @torch.no_grad()
    def _broadcast(self, params) -> None:
        """The master sends the updated parameters to every worker, one message each."""
        if self.rank == 0:
            vector = flat(params)
            works = []
            for r in range(1, self.world):
                self.counter.add("dp_replicate", "send_recv", self.world, tensor_bytes(vector))
                works.append(dist.isend(vector, dst=dist.get_global_rank(self.group, r), group=self.group))
            for w in works:
                assert w is not None  # None only on a rank outside the group
                w.wait()
            return
        vector = flat(params)
        dist.recv(vector, src=self.master, group=self.group)
        unflat(vector, params)


def build(par, params, counter):
    return MasterAggregation(par, params, counter)
