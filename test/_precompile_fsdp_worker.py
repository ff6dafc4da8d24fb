"""One rank of test_precompile_distributed.py's fully_shard (FSDP2) job (run with torch.distributed.run).

    python -m torch.distributed.run --nproc-per-node 2 test/_precompile_fsdp_worker.py OUT_DIR BACKEND...

Rank 0 precompiles each step over a tiny MLP that fully_shard sharded per layer
and at the root, per backend, and broadcasts the pairs; every rank loads them
and runs 3 iterations with each, and the same iterations eagerly on an
identically sharded model.  Each rank saves ``OUT_DIR/rank{r}.pt``: per run the
local shards of the gradients after every step, of the final parameters and of
the optimizer state, artifact and eager; on ranks > 0 the compilers it ran
(recording stub compilers first on PATH, as examples/distributed_train.py
installs them); and the PrecompileError messages of the refusal checks, with
whether the refused call left the model as it was.
"""

import os
import re
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch_precompile
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard, MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from _precompile_ddp_worker import refusal, start_rank


STEPS = 3
OPTIMIZERS = ("sgd", "adam", "adamw")


def make_model(reshard_after_forward: bool = True, **options) -> nn.Module:
    """The same weights on every rank, then sharded: each Linear, and the root."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard_after_forward, **options)
    return fully_shard(model, reshard_after_forward=reshard_after_forward, **options)


def make_data(rank: int) -> list:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    return [(torch.randn(4, 16, generator=generator), torch.randn(4, 8, generator=generator)) for _ in range(STEPS)]


def step(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.detach()


def step_with_optimizer(model, optimizer, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def clipped_step(model, optimizer, x, y):
    """The usual LLM step: clip_grad_norm_ over the DTensor gradients (a norm all-reduced across
    the ranks, each rank's shard scaled in place) between backward and the optimizer."""
    loss = F.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()


def sets_grad(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    model[0].weight.grad = torch.zeros_like(model[0].weight)  # a new tensor, not an in-place write: refused
    return loss.detach()


def forward(model, x):
    return model(x)


def optimizer_for(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return (torch.optim.Adam if name == "adam" else torch.optim.AdamW)(model.parameters(), lr=0.01)


def local(tensor):
    """A DTensor's local shard (what this rank holds), as a plain tensor; None stays None."""
    if tensor is None:
        return None
    return tensor.to_local().clone() if isinstance(tensor, DTensor) else tensor.clone()


def snapshot(model: nn.Module, optimizer=None) -> dict:
    """The model's parameter and gradient shards, their types, and the optimizer's state."""
    return {
        "params": [local(p.detach()) for p in model.parameters()],
        "grads": [local(p.grad) for p in model.parameters()],
        "types": [(type(p).__name__, type(p.grad).__name__, tuple(map(repr, getattr(p.grad, "placements", ())))) for p in model.parameters()],
        "optimizer": None if optimizer is None else [
            {key: (type(value).__name__, local(value)) for key, value in optimizer.state[p].items()}
            for p in model.parameters()
        ],
    }


# -- the runs: the same loop with an artifact and with eager fn -----------------


def run(name: str, fn, rank: int) -> dict:
    """3 iterations of run ``name`` with fn (an artifact, or the eager step it captured)."""
    model = make_model(reshard_after_forward=name != "no_reshard")
    seen = iterate(name, fn, model, rank)
    # An eager step after the artifact's: fully_shard's state was left as eager leaves it.
    if name != "forward":
        step(model, *make_data(rank)[0])
        seen.append(snapshot(model))
    return seen


def iterate(name: str, fn, model: nn.Module, rank: int) -> list:
    """The snapshots after each of 3 iterations of run ``name`` with fn on ``model``."""
    seen, optimizer = [], None
    for x, y in make_data(rank):
        if name in OPTIMIZERS or name == "clip":
            optimizer = optimizer or optimizer_for("adamw" if name == "clip" else name, model)
            out = fn(model, optimizer, x, y)
        elif name == "outside":  # the optimizer steps eagerly on the gradients the artifact wrote
            optimizer = optimizer or optimizer_for("adamw", model)
            out = fn(model, x, y)
            optimizer.step()
            optimizer.zero_grad()
        elif name == "forward":
            with torch.no_grad():
                out = fn(model, x)
        else:  # "accumulate", "no_reshard": gradients accumulate over the iterations
            out = fn(model, x, y)
        seen.append({"out": out.clone(), **snapshot(model, optimizer)})
    return seen


def make_gpt2() -> nn.Module | None:
    """A tiny Hugging Face GPT-2 (tied embeddings), fully_shard each block and the root; None without transformers."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:
        fully_shard(block)
    return fully_shard(model)


def gpt2_step(model, ids):
    loss = model(ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach()


def run_gpt2(fn, rank: int) -> list:
    """2 accumulating iterations of the GPT-2 step on this rank's token ids."""
    model, generator = make_gpt2(), torch.Generator().manual_seed(200 + rank)
    seen = []
    for _ in range(2):
        out = fn(model, torch.randint(0, 128, (2, 16), generator=generator))
        seen.append({"out": out.clone(), **snapshot(model)})
    return seen


def steps() -> dict:
    """Each run's step, as captured."""
    return {
        "accumulate": step, "no_reshard": step, "outside": step, "forward": forward,
        **dict.fromkeys(OPTIMIZERS, step_with_optimizer), "clip": clipped_step,
    }  # fmt: skip


def precompile_all(backend: str) -> dict:
    x, y = make_data(0)[0]
    pairs = {}
    for name, fn in steps().items():
        model = make_model(reshard_after_forward=name != "no_reshard")
        arguments = {"forward": (model, x), **{o: (model, optimizer_for(o, model), x, y) for o in OPTIMIZERS}}
        arguments["clip"] = (model, optimizer_for("adamw", model), x, y)
        with torch.no_grad() if name == "forward" else torch.enable_grad():
            pairs[name] = torch_precompile.precompile(fn, *arguments.get(name, (model, x, y)), backend=backend)
    gpt2 = make_gpt2() if backend == "eager" else None  # a real model's graph; one backend keeps the job short
    if gpt2 is not None:
        pairs["gpt2"] = torch_precompile.precompile(gpt2_step, gpt2, torch.randint(0, 128, (2, 16)), backend=backend)
    return pairs


# -- refusals -------------------------------------------------------------------


def state(model: nn.Module) -> list:
    """Each parameter's local shard, and its .grad object with a copy of its values."""
    return [(local(p.detach()), p.grad, local(p.grad)) for p in model.parameters()]


def untouched(model: nn.Module, before: list) -> bool:
    return all(
        torch.equal(local(p.detach()), value) and p.grad is grad and (grad is None or torch.equal(local(grad), grad_value))
        for p, (value, grad, grad_value) in zip(model.parameters(), before)
    )


def call_refusals(runnable) -> dict:
    """What a call refuses (before it communicates); the model must stay as it was."""
    x, y = make_data(0)[0]
    one_rank = dist.new_group([0])  # every rank creates it; only rank 0 uses it
    unsharded = make_model()
    unsharded[0].unshard()  # its own parameters (not recursive); a collective: on every rank
    before = state(unsharded)
    out = {"unsharded": refusal(lambda: runnable(unsharded, x, y)), "unsharded_untouched": untouched(unsharded, before)}
    if dist.get_rank() != 0:
        return out
    from torch.distributed.device_mesh import DeviceMesh

    return out | refused_calls(runnable, x, y, (
        ("world_size", lambda: make_model(mesh=DeviceMesh.from_group(one_rank, "cpu"))),
        ("no_gradient_sync", lambda: _without_gradient_sync(make_model())),
        ("requires_grad", lambda: make_model().requires_grad_(False)),
        ("replicated_grad", lambda: with_replicated_grad(make_model())),
        ("plain_model", lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))),
    ))


def refused_calls(runnable, x, y, models: tuple) -> dict:
    """For each (name, model maker): the PrecompileError message of ``runnable(model, x, y)``,
    and whether the refused call left the model's shards and .grad as they were."""
    out = {}
    for name, make in models:
        model = make()
        before = state(model)
        out[name] = refusal(lambda: runnable(model, x, y))
        out[f"{name}_untouched"] = untouched(model, before)
    return out


def with_replicated_grad(model: nn.Module) -> nn.Module:
    """The first parameter's .grad a whole (Replicate) DTensor, not a shard placed like it."""
    from torch.distributed.tensor import Replicate

    param = next(model.parameters())
    param.grad = DTensor.from_local(torch.ones(param.shape), param.device_mesh, [Replicate()], run_check=False)
    return model


def _without_gradient_sync(model: nn.Module) -> nn.Module:
    model.set_requires_gradient_sync(False)
    return model


def capture_refusals(backend: str, hsdp_mesh) -> dict:
    """What capture refuses (rank 0 alone; nothing communicates)."""
    x, y = make_data(0)[0]
    models = {
        "hsdp": lambda: make_model(mesh=hsdp_mesh),
        "mixed_precision": lambda: make_model(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)),
        "offload": lambda: make_model(offload_policy=CPUOffloadPolicy(pin_memory=False)),
        "no_gradient_sync": lambda: _without_gradient_sync(make_model()),
        "uneven": lambda: fully_shard(nn.Sequential(nn.Linear(16, 7))),
        "grouped": lambda: _grouped(),
    }
    out = {name: refusal(lambda: torch_precompile.precompile(step, model(), x, y, backend=backend)) for name, model in models.items()}
    out["sets_grad"] = refusal(lambda: torch_precompile.precompile(sets_grad, make_model(), x, y, backend=backend))
    return out


def _grouped() -> nn.Module:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fully_shard([model[0], model[2]])
    return fully_shard(model)


def main(out_dir: str, backends: list) -> None:
    rank, compiler_log = start_rank(out_dir)
    from torch.distributed.device_mesh import init_device_mesh

    # A 2-D mesh (HSDP: replicate over 1, shard over 2), made on every rank: its groups are collectives.
    hsdp_mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("replicate", "shard"))
    result = {"artifact": {}, "eager": {}, "refusals": {}}
    for backend in backends:
        shipped = [precompile_all(backend) if rank == 0 else None]
        dist.broadcast_object_list(shipped, src=0)
        runnables = {name: torch_precompile.load(*pair) for name, pair in shipped[0].items()}
        result["artifact"][backend] = {
            name: run_gpt2(f, rank) if name == "gpt2" else run(name, f, rank) for name, f in runnables.items()
        }
        result["refusals"][backend] = call_refusals(runnables["accumulate"])
        if rank == 0:
            result["refusals"][backend].update(capture_refusals(backend, hsdp_mesh))
            from torch_precompile._precompile_inspect import describe

            result["checks"] = describe(*shipped[0]["adamw"])["checks"]
            if backend == "eager":  # the captured graph's ops, in order
                code = shipped[0]["accumulate"][0]
                result["graph_ops"] = re.findall(r"= torch\.ops\.\w+\.(\w+)\.", code[code.index("# ==================== graph"):])
    if rank > 0:
        with open(compiler_log) as f:
            result["compiler_calls"] = f.read().splitlines()
    result["eager"] = {name: run(name, fn, rank) for name, fn in steps().items()}
    if make_gpt2() is not None:
        result["eager"]["gpt2"] = run_gpt2(gpt2_step, rank)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
