"""What does attaching torch.compiler.precompile add to ``import torch``?

The torch-precompile package attaches ``precompile`` / ``PrecompileError`` to
``torch.compiler`` through an entry point of the group ``torch.backends``,
which ``import torch`` runs at its end unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
This script measures, each in fresh processes (median over ``--runs``):

  1. wall time of ``import torch`` with autoload on vs off (end to end; noisy,
     since ``import torch`` itself takes ~2 s);
  2. in-process, after ``import torch`` with autoload off, exactly what torch's
     ``_import_device_backends`` does -- ``entry_points(group="torch.backends")``
     then ``ep.load()()`` for each -- split into the entry-point scan (paid by
     every torch install with autoload on, with or without this package) and
     the load + attach of ours (the cost this package adds to ``import torch``;
     the attach is lazy), then the first access to ``torch.compiler.precompile``
     (which imports the implementation, paid only by programs that use it);
  3. in-process ``import torch_precompile._precompile`` alone (module import + attach).

Usage: python benchmarks/attach_cost.py [--runs N]   (goal: attach < 10 ms)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


GOAL_MS = 10.0

_CHILD_IMPORT = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
assert hasattr(torch.compiler, "precompile") == (__import__("os").environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "1")
print((t1 - t0) * 1e3)
"""

_CHILD_INPROCESS = """
import json, sys, time
import torch  # TORCH_DEVICE_BACKEND_AUTOLOAD=0: nothing attached yet
assert "torch_precompile._precompile" not in sys.modules and not hasattr(torch.compiler, "precompile")
from importlib.metadata import entry_points
t0 = time.perf_counter()
eps = list(entry_points(group="torch.backends"))
t1 = time.perf_counter()
c0 = time.process_time()
for ep in eps:
    ep.load()()
t2 = time.perf_counter()
c1 = time.process_time()
assert "precompile" in torch.compiler.__all__
lazy = "torch_precompile._precompile" not in sys.modules
t3 = time.perf_counter()
torch.compiler.precompile  # first access: imports torch_precompile._precompile when attached lazily
t4 = time.perf_counter()
assert torch.compiler.precompile is sys.modules["torch_precompile._precompile"].precompile
print(json.dumps({"scan": (t1 - t0) * 1e3, "load_attach": (t2 - t1) * 1e3,
                  "load_attach_cpu": (c1 - c0) * 1e3, "first_access": (t4 - t3) * 1e3,
                  "lazy": lazy, "entry_points": [ep.value for ep in eps]}))
"""

_CHILD_MODULE = """
import sys, time
import torch  # TORCH_DEVICE_BACKEND_AUTOLOAD=0
assert "torch_precompile._precompile" not in sys.modules
t0 = time.perf_counter()
import torch_precompile._precompile
t1 = time.perf_counter()
assert torch.compiler.precompile is torch_precompile._precompile.precompile
print((t1 - t0) * 1e3)
"""


def _env(autoload: bool) -> dict:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    env.pop("TORCH_LOGS", None)
    # Measure the installed steady state: bytecode cached in __pycache__ (a
    # non-editable `pip install` compiles it at install time).  The cost of
    # compiling the sources when no bytecode can be cached is reported apart.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(code: str, autoload: bool) -> str:
    env = _env(autoload)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def _importtime_ms(autoload: bool = True) -> dict:
    """Self+cumulative import time of our modules from ``python -X importtime``."""
    env = _env(autoload)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch"],
        env=env, capture_output=True, text=True, check=True,
    )
    found = {}
    for line in out.stderr.splitlines():
        # "import time:   self [us] | cumulative | imported package"
        parts = line.split("|")
        if len(parts) != 3 or not line.startswith("import time:"):
            continue
        name = parts[2].strip()
        if name in ("torch_precompile", "torch_precompile._precompile", "torch_precompile._precompile_runtime"):
            try:
                found[name] = int(parts[1]) / 1e3
            except ValueError:
                pass
    return found


def _source_compile_ms() -> float:
    """Compiling our sources to bytecode: paid at every import when no
    __pycache__ can be written or read (PYTHONDONTWRITEBYTECODE=1 with an
    editable install, a read-only checkout)."""
    import importlib.util

    total = 0.0
    for name in ("torch_precompile._precompile", "torch_precompile._precompile_runtime"):
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        with open(spec.origin, encoding="utf-8") as f:
            source = f.read()
        t0 = time.perf_counter()
        compile(source, spec.origin, "exec")
        total += time.perf_counter() - t0
    return total * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="fresh processes per measurement")
    args = parser.parse_args()

    on, off, scan, load_attach, load_attach_cpu, first_access, module = [], [], [], [], [], [], []
    entry, lazy = None, False
    _run(_CHILD_MODULE, autoload=False)  # warm-up: writes __pycache__ if it can
    for i in range(args.runs):
        # Alternate the order so slow drift on a shared machine hits both sides.
        for autoload in ((True, False) if i % 2 == 0 else (False, True)):
            (on if autoload else off).append(float(_run(_CHILD_IMPORT, autoload)))
        record = json.loads(_run(_CHILD_INPROCESS, autoload=False))
        scan.append(record["scan"])
        load_attach.append(record["load_attach"])
        load_attach_cpu.append(record["load_attach_cpu"])
        first_access.append(record["first_access"])
        lazy = record["lazy"]
        entry = record["entry_points"]
        module.append(float(_run(_CHILD_MODULE, autoload=False)))
    importtime = _importtime_ms()
    compile_ms = statistics.median(_source_compile_ms() for _ in range(args.runs))

    med = statistics.median
    rows = [
        ("import torch, autoload on (attached)", med(on)),
        ("import torch, TORCH_DEVICE_BACKEND_AUTOLOAD=0", med(off)),
        ("  difference (on - off)", med(on) - med(off)),
        ("entry_points(group='torch.backends') scan", med(scan)),
        ("ep.load()() of ours  <- added to import torch", med(load_attach)),
        ("  same, process CPU time", med(load_attach_cpu)),
        ("first torch.compiler.precompile access" + (" (lazy import)" if lazy else ""), med(first_access)),
        ("import torch_precompile._precompile (autoload off)", med(module)),
        ("(no __pycache__: first access also compiles)", compile_ms),
    ]
    print(f"torch {__import__('torch').__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus, {args.runs} fresh processes per row, medians")
    print(f"torch.backends entry points: {entry}")
    width = max(len(name) for name, _ in rows)
    print(f"{'measurement':<{width}}  {'ms':>9}")
    for name, value in rows:
        print(f"{name:<{width}}  {value:9.2f}")
    print(f"ratio import torch on/off: {med(on) / med(off):.3f}")
    print("python -X importtime of `import torch`: "
          + (", ".join(f"{k} {v:.2f} ms cumulative" for k, v in importtime.items())
             or "torch_precompile._precompile / torch_precompile._precompile_runtime not imported (lazy attach)"))
    added = med(load_attach)
    verdict = "OK" if added < GOAL_MS else "OVER GOAL"
    print(f"attach cost {added:.2f} ms (goal < {GOAL_MS:.0f} ms): {verdict}")


if __name__ == "__main__":
    main()
