"""Two checkouts of the package side by side: first access, warm load and artifact sizes (issue 34).

For each package root (the baseline, e.g. a ``git worktree`` of an older
commit with this checkout's ``torch_precompile/_C_*.so`` copied in, and this
checkout), in fresh processes, interleaved, medians of ``--runs``:

  * first access: ``import torch_precompile._precompile`` after ``import torch``
    (what ``torch.compiler.precompile``'s first access imports);
  * warm load: ``load(python_code, cache)`` of a GPT-2 4x256 inductor artifact
    that package wrote (its kernel store primed by two earlier loads), the
    process's first: it imports whatever the first access did not;
  * the two together, per process: what a fresh process pays to reach a loaded
    artifact, whichever of the two imports the driver;
  * the sizes of that artifact and of a ``nn.Linear(4, 4)`` eager artifact.

Children import from cached bytecode, as an installed package does.

Usage:  python benchmarks/driver_ab.py BASELINE_ROOT [--runs N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_BUILD = r"""
import sys, torch, torch_precompile
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=2048, n_positions=128)).eval()
ids = torch.randint(0, 2048, (1, 32))
code, cache = torch_precompile.precompile(lambda m, ids: m(ids, use_cache=False).logits, m, ids)
open(sys.argv[1] + ".py", "w").write(code)
open(sys.argv[1] + ".cache", "wb").write(cache)
tiny, tiny_cache = torch_precompile.precompile(lambda m, x: m(x), torch.nn.Linear(4, 4), torch.randn(2, 4), backend="eager")
print(len(code), len(cache), len(tiny), len(tiny_cache))
"""

_CHILD = r"""
import json, sys, time
import torch
t0 = time.perf_counter()
import torch_precompile._precompile as P
t1 = time.perf_counter()
code = open(sys.argv[1] + ".py").read()
cache = open(sys.argv[1] + ".cache", "rb").read()
t2 = time.perf_counter()
P.precompile.load(code, cache)
t3 = time.perf_counter()
print(json.dumps({"first_access": (t1 - t0) * 1e3, "load": (t3 - t2) * 1e3, "both": (t1 - t0 + t3 - t2) * 1e3}))
"""


def _run(code: str, root: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=root, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, *args],
        env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("baseline_root", help="the other package checkout (a directory holding torch_precompile/)")
    parser.add_argument("--runs", type=int, default=21, help="fresh processes per package and measurement")
    args = parser.parse_args()
    roots = {"baseline": os.path.abspath(args.baseline_root), "this checkout": str(Path(__file__).resolve().parent.parent)}
    with tempfile.TemporaryDirectory() as scratch:
        sizes, times = {}, {name: {"first_access": [], "load": [], "both": []} for name in roots}
        for name, root in roots.items():
            stem = os.path.join(scratch, name.replace(" ", "_"))
            sizes[name] = _run(_BUILD, root, stem).split()
            for _ in range(2):  # bytecode written, kernel store primed
                _run(_CHILD, root, stem)
        for _ in range(args.runs):
            for name, root in roots.items():
                measured = json.loads(_run(_CHILD, root, os.path.join(scratch, name.replace(" ", "_"))))
                for key, value in measured.items():
                    times[name][key].append(value)
    print(f"| | {' | '.join(roots)} |")
    print(f"|---|{'---|' * len(roots)}")
    for key, label in (
        ("first_access", "first access (import of the implementation)"),
        ("load", "warm load of the GPT-2 artifact (the first in the process)"),
        ("both", "the two together: a fresh process's way to a loaded artifact"),
    ):
        print(f"| {label} | " + " | ".join(f"{statistics.median(times[n][key]):.2f} ms" for n in roots) + " |")
    print("| GPT-2 artifact: python_code / cache | " + " | ".join(f"{int(s[0]):,} chars / {int(s[1]):,} bytes" for s in sizes.values()) + " |")
    print("| Linear(4, 4) eager artifact: python_code / cache | " + " | ".join(f"{int(s[2]):,} chars / {int(s[3]):,} bytes" for s in sizes.values()) + " |")


if __name__ == "__main__":
    main()
