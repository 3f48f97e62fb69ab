"""Error feedback (Stich et al. 2018; Karimireddy et al. 2019): what a biased compressor did not
send this step is kept per tensor and added to the next step's gradient.

`ErrorFeedback.accumulate(key, grad)` returns acc = grad + residual; after the compressor
decided what it sends, `keep(key, acc, sent_mask)` stores acc with the sent entries zeroed. So
sent + residual == acc exactly (disjoint supports, no arithmetic), and over a run
sum(sent) + residual_T == sum(grad) (tests/test_compression_methods.py checks both).
"""

from __future__ import annotations

import torch


class ErrorFeedback:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.residual: dict[int, torch.Tensor] = {}

    def accumulate(self, key: int, grad: torch.Tensor) -> torch.Tensor:
        """grad + this tensor's residual (a new tensor; `grad` is left as it is)."""
        held = self.residual.get(key)
        return grad.clone() if held is None or not self.enabled else grad + held

    def keep(self, key: int, acc: torch.Tensor, sent: torch.Tensor) -> None:
        """Store `acc` with the entries at `sent` (indices) zeroed as the next residual."""
        if not self.enabled:
            return
        rest = acc.clone()
        rest[sent] = 0
        self.residual[key] = rest

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.residual.values())
