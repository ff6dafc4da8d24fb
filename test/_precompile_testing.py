"""Helpers shared by the precompile test files (imported, not collected)."""

import torch
import torch.nn as nn
import torch_precompile


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
