"""Data-parallel training with one compile: precompile on rank 0, load everywhere.

    torchrun --nproc-per-node 2 examples/distributed_train.py OUT_DIR [--steps 3]

The model is wrapped in ``DistributedDataParallel`` as usual, and the whole
iteration -- forward, backward, DDP's gradient all-reduce and the optimizer
step -- is precompiled on rank 0 (backend "inductor") into one artifact.  The
``(python_code, cache)`` pair travels to every rank with
``torch.distributed.broadcast_object_list``; every rank loads it, and each
training iteration is one call.  The artifact holds no weights and bakes no
rank, so one pair serves every rank.

What DDP does is part of the graph: after ``loss.backward()`` inside the step
every rank's ``.grad`` holds the average over the ranks, as DDP's reducer
leaves it, computed with bucketed functional collectives (DDP's bucket sizes,
in the order backward produces the gradients) that overlap the rest of
backward; then ``optimizer.step()`` reads them.  DDP's own reducer never runs
for a precompiled call.  At every call the artifact checks the DDP object: the
same world size and default process group, ``find_unused_parameters``,
``static_graph`` and comm hook as at capture, and whether gradients are
synchronized: for gradient accumulation precompile a second step under
``with ddp.no_sync():`` and call it inside ``no_sync()``.  Refused with a
PrecompileError naming the fix: FSDP1 (``fully_shard``, FSDP2, is supported:
examples/fsdp2_train.py), comm hooks other than
``default_hooks.allreduce_hook``, a step captured inside ``no_sync()`` for a
model with buffers DDP broadcasts (use ``broadcast_buffers=False``; from
torch 2.13 ``forward_sync_buffers=False``), parameters that get no gradient
without ``find_unused_parameters=True``.  Buffers are broadcast from rank 0
before the forward, in the graph, where DDP would.

Only rank 0 pays the compile: the cache holds the compiled kernels, so
``precompile.load`` on the other ranks compiles nothing.  To prove it, ranks > 0
run with recording stub compilers (``g++``, ``gcc``, ``c++``, ``cc``, ``clang``,
``clang++`` that append to a log and fail) first on ``PATH`` and ``CXX``, and
with an empty ``TORCHINDUCTOR_CACHE_DIR`` of their own.  Each rank writes
``OUT_DIR/rank{r}.pt`` (final parameters, losses, and, on ranks > 0, the
compiler invocations the stubs recorded).

With a mean loss and equal shard sizes, the averaged shard gradients equal
the full-batch gradient, so the result matches single-process training on the
whole batch (up to float rounding).

Loading a broadcast artifact executes it: only broadcast pairs from a rank
you trust (``broadcast_object_list`` itself unpickles what it receives).
"""

import argparse
import os
import stat
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_precompile
from torch.nn.parallel import DistributedDataParallel


STUB_COMPILERS = ("g++", "gcc", "c++", "cc", "clang", "clang++")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_data(steps: int, global_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batches, identical on every rank: (steps, global_batch, 8), (steps, global_batch, 1)."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(steps, global_batch, 8, generator=generator)
    y = torch.randn(steps, global_batch, 1, generator=generator)
    return x, y


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """What gets precompiled: one whole iteration (with a DDP model, backward all-reduces the gradients)."""
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def install_stub_compilers(directory: str, log_file: str) -> None:
    """Put failing, recording compilers first on PATH (and in CXX/CC) for this process."""
    os.makedirs(directory, exist_ok=True)
    for name in STUB_COMPILERS:
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\necho "{name} $*" >> "{log_file}"\nexit 1\n')
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = directory + os.pathsep + os.environ.get("PATH", "")
    os.environ["CXX"] = os.path.join(directory, "c++")
    os.environ["CC"] = os.path.join(directory, "cc")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="where each rank writes rank{r}.pt")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=8)
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world_size:
        raise SystemExit(f"--global-batch {args.global_batch} must be divisible by the world size {world_size}")
    os.makedirs(args.out_dir, exist_ok=True)
    compiler_log = os.path.join(args.out_dir, f"compiler_calls_rank{rank}.log")
    if rank > 0:
        # Any compiler this rank runs from here on is recorded, and fails.
        open(compiler_log, "w").close()
        install_stub_compilers(os.path.join(args.out_dir, f"stub_compilers_rank{rank}"), compiler_log)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"inductor_rank{rank}_", dir=args.out_dir)

    # Same seed on every rank, and DDP broadcasts rank 0's parameters anyway.
    model = DistributedDataParallel(make_model())
    optimizer = make_optimizer(model)
    xs, ys = make_data(args.steps, args.global_batch)
    shard = args.global_batch // world_size
    mine = slice(rank * shard, (rank + 1) * shard)

    # 1. Compile once, on rank 0, against this rank's shard shapes.
    artifact = [None]
    if rank == 0:
        artifact[0] = torch_precompile.precompile(
            train_step, model, optimizer, xs[0, mine], ys[0, mine], backend="inductor"
        )
    # 2. Ship the (python_code, cache) pair to every rank.
    dist.broadcast_object_list(artifact, src=0)
    python_code, cache = artifact[0]
    # 3. Load everywhere (rank 0 too): the cached kernels, no compiler.
    step = torch_precompile.load(python_code, cache)

    # 4. Data-parallel training: one call per iteration.
    losses = [step(model, optimizer, xs[i, mine], ys[i, mine]).item() for i in range(args.steps)]

    compiler_calls = []
    if rank > 0:
        with open(compiler_log) as f:
            compiler_calls = f.read().splitlines()
    torch.save(
        {
            "parameters": {name: p.detach().clone() for name, p in model.module.named_parameters()},
            "losses": losses,
            "compiler_calls": compiler_calls,
        },
        os.path.join(args.out_dir, f"rank{rank}.pt"),
    )
    print(f"rank {rank}/{world_size}: losses {[round(v, 4) for v in losses]}, compiler calls {len(compiler_calls)}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
