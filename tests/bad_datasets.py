"""`--data` functions that are wrong in one way each (rows of tests/test_bad_inputs.py): the
launcher must refuse them before any rank starts."""

from __future__ import annotations

import torch


def not_a_dataset():
    return 5


def short_sequences():
    return [(torch.randint(0, 100, (7,)), torch.randint(0, 100, (7,))) for _ in range(64)]


def ids_outside_vocab():
    return [(torch.full((32,), 10**6), torch.zeros(32, dtype=torch.long)) for _ in range(64)]


def raises():
    raise RuntimeError("no data here")


def one_sample():
    return [(torch.zeros(32, dtype=torch.long), torch.zeros(32, dtype=torch.long))]
