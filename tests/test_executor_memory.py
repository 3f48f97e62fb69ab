"""The CPU live-tensor tracker counts what is alive, frees what is collected, keeps the peak."""

from __future__ import annotations

import torch

from meshplan.executor.memory import LiveTensorTracker, held_tensors


def test_tracker_counts_live_storages_and_keeps_the_peak():
    with LiveTensorTracker() as tracker:
        a = torch.ones(1024)  # 4 KiB
        b = torch.ones(2048)  # 8 KiB
        del a
        assert tracker.current_bytes == 8192
        c = torch.ones(512)  # 2 KiB
        total = (b * 2).sum()  # an 8 KiB temporary and a 4-byte result
    assert tracker.peak_bytes == 8192 + 2048 + 8192 + 4
    assert tracker.current_bytes == 8192 + 2048 + 4
    assert c.numel() and total.item() == 4096


def test_tracker_starts_from_held_parameters_grads_and_optimizer_state():
    model = torch.nn.Linear(64, 64)  # 4096 + 64 floats
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 64)).sum().backward()
    opt.step()  # momentum buffers
    held = held_tensors(list(model.parameters()), [opt])
    tracker = LiveTensorTracker(held)
    assert tracker.current_bytes == 3 * (4096 + 64) * 4  # params, grads, momentum
    with tracker:
        x = torch.randn(8, 64)
        model(x).sum()
    held_bytes = 3 * (4096 + 64) * 4
    assert tracker.peak_bytes >= held_bytes + 2 * x.numel() * 4  # + the input and the (8, 64) output
