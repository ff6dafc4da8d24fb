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
# The runs whose model has a mixed precision policy: bfloat16 compute with float32 reduction,
# and bfloat16 compute and reduction with AdamW inside fn; both output float32 (on torch 2.11,
# eager's mse_loss refuses a bfloat16 input with a float32 target).
MIXED_PRECISION = {
    "bf16_accumulate": dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32),
    "bf16_adamw": dict(param_dtype=torch.bfloat16, output_dtype=torch.float32),
}


def make_model(reshard_after_forward: bool = True, **options) -> nn.Module:
    """The same weights on every rank, then sharded: each Linear, and the root."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, reshard_after_forward=reshard_after_forward, **options)
    return fully_shard(model, reshard_after_forward=reshard_after_forward, **options)


def model_for(name: str) -> nn.Module:
    """Run ``name``'s model, sharded as the run says."""
    policy = {"mp_policy": MixedPrecisionPolicy(**MIXED_PRECISION[name])} if name in MIXED_PRECISION else {}
    return make_model(reshard_after_forward=name != "no_reshard", **policy)


def optimizer_name(name: str) -> str | None:
    """The optimizer run ``name`` steps inside fn, or None."""
    return name if name in OPTIMIZERS else "adamw" if name in ("clip", "bf16_adamw") else None


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
    model = model_for(name)
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
        if optimizer_name(name) is not None:
            optimizer = optimizer or optimizer_for(optimizer_name(name), model)
            out = fn(model, optimizer, x, y)
        elif name == "outside":  # the optimizer steps eagerly on the gradients the artifact wrote
            optimizer = optimizer or optimizer_for("adamw", model)
            out = fn(model, x, y)
            optimizer.step()
            optimizer.zero_grad()
        elif name == "forward":
            with torch.no_grad():
                out = fn(model, x)
        else:  # "accumulate", "no_reshard", "bf16_accumulate": gradients accumulate over the iterations
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
        "bf16_accumulate": step, "bf16_adamw": step_with_optimizer,
    }  # fmt: skip


def precompile_all(backend: str) -> dict:
    x, y = make_data(0)[0]
    pairs = {}
    for name, fn in steps().items():
        model = model_for(name)
        optimizer = optimizer_name(name) and optimizer_for(optimizer_name(name), model)
        arguments = (model, x) if name == "forward" else (model, optimizer, x, y) if optimizer else (model, x, y)
        with torch.no_grad() if name == "forward" else torch.enable_grad():
            pairs[name] = torch_precompile.precompile(fn, *arguments, backend=backend)
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
        ("mixed_precision", lambda: model_for("bf16_adamw")),
        ("no_gradient_sync", lambda: _without_gradient_sync(make_model())),
        ("custom_reduce_scatter", lambda: _with_custom_reduce_scatter(make_model())),
        ("no_reshard_after_backward", lambda: _without_reshard_after_backward(make_model())),
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


class _SummingReduceScatter:
    """A caller's reduce-scatter (set_custom_reduce_scatter): it sums where fully_shard's averages."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def _with_custom_reduce_scatter(model: nn.Module) -> nn.Module:
    model[0].set_custom_reduce_scatter(_SummingReduceScatter())
    return model


def _without_reshard_after_backward(model: nn.Module) -> nn.Module:
    model.set_reshard_after_backward(False)  # eager leaves the unsharded parameters registered after backward
    return model


def capture_refusals(backend: str, hsdp_mesh) -> dict:
    """What capture refuses (rank 0 alone; nothing communicates)."""
    x, y = make_data(0)[0]
    models = {
        "hsdp": lambda: make_model(mesh=hsdp_mesh),
        "offload": lambda: make_model(offload_policy=CPUOffloadPolicy(pin_memory=False)),
        "no_gradient_sync": lambda: _without_gradient_sync(make_model()),
        "uneven": lambda: fully_shard(nn.Sequential(nn.Linear(16, 7))),
        "grouped": lambda: _grouped(),
    }
    out = {name: refusal(lambda: torch_precompile.precompile(step, model(), x, y, backend=backend)) for name, model in models.items()}
    out["sets_grad"] = refusal(lambda: torch_precompile.precompile(sets_grad, make_model(), x, y, backend=backend))
    # A forward in grad mode without backward: eager leaves these modules' unsharded parameters registered.
    for name, model in (("forward_in_grad_mode", _with_root_parameters), ("forward_without_reshard", lambda: make_model(False))):
        out[name] = refusal(lambda: torch_precompile.precompile(forward, model(), x, backend=backend))
    return out


def _with_root_parameters() -> nn.Module:
    """The root's own parameters (the last layer's): fully_shard keeps them unsharded after forward."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fully_shard(model[0])
    return fully_shard(model)


def _grouped() -> nn.Module:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fully_shard([model[0], model[2]])
    return fully_shard(model)


# -- the job: rank 0 precompiles, every rank loads and runs ---------------------


def shipped_and_loaded(rank: int, precompile_pairs) -> tuple[dict, dict]:
    """Rank 0's artifact pairs (``precompile_pairs()``, name -> pair), broadcast to every
    rank, and this rank's runnables of them."""
    shipped = [precompile_pairs() if rank == 0 else None]
    dist.broadcast_object_list(shipped, src=0)
    return shipped[0], {name: torch_precompile.load(*pair) for name, pair in shipped[0].items()}


def graph_ops(code: str, pattern: str) -> list:
    """What ``pattern`` matches in an artifact's graph section, in order."""
    return re.findall(pattern, code[code.index("# ==================== graph") :])


def save_rank(result: dict, rank: int, compiler_log: str, out_dir: str) -> None:
    """Save this rank's ``result`` to OUT_DIR/rank{r}.pt, with on ranks > 0 the compilers it
    ran, and end the job."""
    if rank > 0:
        with open(compiler_log) as f:
            result["compiler_calls"] = f.read().splitlines()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main(out_dir: str, backends: list) -> None:
    rank, compiler_log = start_rank(out_dir)
    from torch.distributed.device_mesh import init_device_mesh

    # A 2-D mesh (HSDP: replicate over 1, shard over 2), made on every rank: its groups are collectives.
    hsdp_mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("replicate", "shard"))
    result = {"artifact": {}, "eager": {}, "refusals": {}}
    for backend in backends:
        shipped, runnables = shipped_and_loaded(rank, lambda: precompile_all(backend))
        result["artifact"][backend] = {
            name: run_gpt2(f, rank) if name == "gpt2" else run(name, f, rank) for name, f in runnables.items()
        }
        result["refusals"][backend] = call_refusals(runnables["accumulate"])
        if rank == 0:
            other_policy = (("other_policy", lambda: model_for("bf16_adamw")),)  # bfloat16 reduction
            result["refusals"][backend].update(refused_calls(runnables["bf16_accumulate"], *make_data(0)[0], other_policy))
            result["refusals"][backend].update(capture_refusals(backend, hsdp_mesh))
            from torch_precompile._precompile_inspect import describe

            result["checks"] = describe(*shipped["adamw"])["checks"]
            result["mixed_precision_checks"] = describe(*shipped["bf16_accumulate"])["checks"]
            if backend == "eager":  # the captured graph's ops, in order
                result["graph_ops"] = graph_ops(shipped["accumulate"][0], r"= torch\.ops\.\w+\.(\w+)\.")
    result["eager"] = {name: run(name, fn, rank) for name, fn in steps().items()}
    if make_gpt2() is not None:
        result["eager"]["gpt2"] = run_gpt2(gpt2_step, rank)
    save_rank(result, rank, compiler_log, out_dir)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
