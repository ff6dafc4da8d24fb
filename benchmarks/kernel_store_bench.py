"""What verifying the kernel store costs on a warm load (issue 14).

Builds a training step with many distinct kernels (35 on torch 2.13 CPU; keys
are content-addressed, so the blocks get distinct widths), then times load()'s
verification steps (the stages of ``read_artifact``, then the kernels' binding
and the store) in fresh processes against a warm store:

    python benchmarks/kernel_store_bench.py [WORK_DIR] [--runs N]

WORK_DIR (default: a temp dir) keeps the artifact and the store between runs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn


CHILD = r"""
import io, sys, time, zipfile
import torch_precompile._precompile_artifact as P
import torch_precompile._precompile_format as F
work = sys.argv[1]
code, cache = open(work + "/a.py").read(), open(work + "/a.cache", "rb").read()
clock = time.perf_counter
t0 = clock(); constants = F._read_constants(code); convention = F._convention_from(constants)
t1 = clock(); zipfile.ZipFile(io.BytesIO(cache)).infolist()
t2 = clock(); envelope = F._read_envelope(cache)
t3 = clock(); assert F._pair_error(F._text_hashes(code)[1], convention, envelope) is None; kernels, digests = F._payload(envelope)
t4 = clock(); bound = P._bound_kernels(kernels, digests, F._kernel_hashes(constants))
t5 = clock(); P._prime_kernels(bound)
t6 = clock()
print(len(bound), sum(len(b) for _, b in bound.values()), *(1e3 * (b - a) for a, b in
      ((t1, t2), (t2, t3), (t3, t4), (t4, t5), (t5, t6))))
"""
STAGES = (
    "zip directory check",
    "read envelope (zip + JSON)",
    "per-kernel sha256 + payload hash",
    "bind to KERNEL_SHA256",
    "prime: read + compare files",
)


def build(work: str) -> None:
    torch.manual_seed(0)
    widths = [16 + 2 * i for i in range(13)]
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU()) for a, b in zip(widths, widths[1:])])

    def step(m, x):
        loss = m(x).pow(2).mean()
        loss.backward()
        return loss

    code, cache = torch_precompile.precompile(step, blocks, torch.randn(4, 16))
    with open(os.path.join(work, "a.py"), "w") as f:
        f.write(code)
    with open(os.path.join(work, "a.cache"), "wb") as f:
        f.write(cache)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", nargs="?", default=None)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kernel_store_bench_")
    os.makedirs(work, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(work, "inductor")  # the store, for the children too
    if not os.path.exists(os.path.join(work, "a.cache")):
        build(work)
    rows = []
    for _ in range(args.runs + 1):  # the first run warms the store
        out = subprocess.run([sys.executable, "-c", CHILD, work], capture_output=True, text=True, check=True)
        rows.append([float(v) for v in out.stdout.split()])
    count, size = int(rows[0][0]), int(rows[0][1])
    print(f"{count} kernels, {size / 1e6:.1f} MB; median of {args.runs} fresh processes, warm store:")
    for name, values in zip(STAGES, list(zip(*rows[1:]))[2:]):
        print(f"  {name:30s} {statistics.median(values):6.2f} ms")


if __name__ == "__main__":
    main()
