"""Golden artifacts: the programs whose pairs test_precompile_golden.py loads and calls.

Each pair under ``test/precompile_golden/convention-C-cache-K/`` was written
by this script, run against the package of the format it is named for::

    # the current format, from this checkout
    python test/_precompile_golden.py test/precompile_golden
    # an earlier one, from a worktree of the commit that wrote it
    git worktree add /tmp/old <commit> && cd /tmp
    PYTHONPATH=/tmp/old python /path/to/test/_precompile_golden.py /path/to/test/precompile_golden

It uses the public API alone (``torch.compiler.precompile`` once
``torch_precompile`` is imported), so every version that can write an
artifact runs it.  The files are gzipped: the pairs of cache versions 7..10
carry the driver's bytecode.  The models are rebuilt by the test from the
same seeds: an artifact holds no weights.
"""

import ast
import gzip
import io
import json
import os
import sys
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F


BACKENDS = ("eager", "inductor")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def optimizer(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(3, 4, generator=generator), torch.randn(3, 2, generator=generator)


def forward(m, x):
    return m(x)


def train_step(m, opt, x, y):
    loss = F.mse_loss(m(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def programs() -> dict:
    """Name -> (fn, the example arguments, given a fresh model) of each golden program."""
    return {
        "forward": (forward, lambda m: (m, inputs()[0])),
        "train_step": (train_step, lambda m: (m, optimizer(m), *inputs())),
    }


def versions(python_code: str, cache: bytes) -> tuple[int, int]:
    """(python_code's convention version, the cache envelope's version), read with the standard library."""
    tree = ast.parse(python_code)
    literal = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CALLING_CONVENTION"
    )
    with zipfile.ZipFile(io.BytesIO(cache)) as archive:
        envelope = json.loads(archive.read("envelope.json"))
    return ast.literal_eval(literal)["format_version"], envelope["version"]


def directory_name(convention_version: int, cache_version: int) -> str:
    return f"convention-{convention_version}-cache-{cache_version}"


def write(root: str) -> str:
    """Write every golden pair the installed package makes; returns the directory."""
    import torch_precompile  # noqa: F401  (registers torch.compiler.precompile)

    written = {}
    for name, (fn, arguments) in programs().items():
        for backend in BACKENDS:
            python_code, cache = torch.compiler.precompile(fn, *arguments(model()), backend=backend)
            written[f"{name}_{backend}"] = (python_code, cache)
    (first_version, *others) = {versions(*pair) for pair in written.values()}
    assert not others, "one package writes one format"
    directory = os.path.join(root, directory_name(*first_version))
    os.makedirs(directory, exist_ok=True)
    for stem, (python_code, cache) in written.items():
        # mtime=0: the same pair gives the same bytes.
        with gzip.GzipFile(os.path.join(directory, stem + ".py.gz"), "wb", mtime=0) as f:
            f.write(python_code.encode())
        with gzip.GzipFile(os.path.join(directory, stem + ".cache.gz"), "wb", mtime=0) as f:
            f.write(cache)
    return directory


if __name__ == "__main__":
    print(write(sys.argv[1]))
