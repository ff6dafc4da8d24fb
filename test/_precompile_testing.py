"""Helpers shared by the precompile test files (imported, not collected)."""

import unittest

import torch
import torch.nn as nn
import torch_precompile
from torch_precompile._precompile_compat import TORCH_RELEASE


# torch 2.11's mark_unbacked takes no min=/max=: a free dim's bounds need 2.12+.
MARK_BOUNDS = TORCH_RELEASE >= (2, 12)
needs_mark_bounds = unittest.skipIf(
    not MARK_BOUNDS, "torch 2.11's mark_unbacked takes no min=/max= (bounds on a free dim need torch 2.12+)"
)


class Artifacts:
    """Each ``(python_code, cache)`` pair built once per test process.

    One instance per test file: keys are short names chosen by that file,
    so files must not share a cache.
    """

    def __init__(self):
        self._pairs: dict = {}

    def __call__(self, key, fn, *example_inputs, backend="inductor"):
        if (key, backend) not in self._pairs:
            self._pairs[key, backend] = torch_precompile.precompile(fn, *example_inputs, backend=backend)
        return self._pairs[key, backend]


def load(pair):
    return torch_precompile.load(*pair)


def small_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
