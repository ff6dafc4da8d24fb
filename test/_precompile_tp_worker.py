"""One rank of test_precompile_distributed.py's tensor parallel job (run with torch.distributed.run).

    python -m torch.distributed.run --nproc-per-node 2 test/_precompile_tp_worker.py OUT_DIR BACKEND...

Rank 0 precompiles each step over a tiny MLP that parallelize_module split
(ColwiseParallel, then RowwiseParallel, a last layer left whole), and over a
residual block with a sequence parallel norm (SequenceParallel, and the same
with PrepareModuleInputOutput), per backend, and broadcasts the pairs; every
rank loads them and runs 3 iterations with each, and the same iterations
eagerly on an identically parallelized model.
Each rank saves ``OUT_DIR/rank{r}.pt``: per run the outputs and the local
shards of the gradients, parameters and optimizer state after every step,
artifact and eager; on ranks > 0 the compilers it ran; the PrecompileError
messages of the refusal checks, with whether the refused call left the model
as it was; the checks listing and the captured graph's collectives.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_precompile
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    parallelize_module,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from _precompile_ddp_worker import refusal, start_rank
from _precompile_fsdp_worker import (
    clipped_step,
    sets_grad,
    forward,
    graph_ops,
    iterate,
    make_data,
    MIXED_PRECISION,
    optimizer_for,
    refused_calls,
    save_rank,
    shipped_and_loaded,
    snapshot,
    step,
    step_with_optimizer,
    with_replicated_grad,
)


RUNS = ("accumulate", "outside", "forward", "sgd", "adamw", "clip")
BLOCK_RUNS = ("sequence_parallel", "prepared")  # the block's: accumulating, and AdamW outside fn


def make_model(mesh: DeviceMesh, plan: dict | None = None) -> nn.Module:
    """The same weights on every rank, then parallelized: 0 column-wise, 2 row-wise, 4 whole."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    return parallelized(model, mesh, plan or {"0": ColwiseParallel(), "2": RowwiseParallel()})


def model_for(name: str, mesh: DeviceMesh) -> nn.Module:
    """Run ``name``'s model.  clip_grad_norm_ needs every gradient a DTensor (eager refuses a mix
    of DTensors and tensors), so "clip" has only the column-wise and the row-wise layer."""
    if name != "clip":
        return make_model(mesh)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return parallelized(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def parallelized(model: nn.Module, mesh: DeviceMesh, plan: dict) -> nn.Module:
    """parallelize_module, each rank sharding its own (identical) weights: no collective, so
    that rank 0 alone can make the models it captures."""
    return parallelize_module(model, mesh, plan, src_data_rank=None)


class Block(nn.Module):
    """x + mlp(norm(x)): a transformer block's feed-forward half."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def block_plan(name: str) -> dict:
    """Sequence parallel: the norm computes on this rank's part of the sequence (dim 1), its
    Replicate parameters' gradients are Partial(sum); the MLP all-gathers the sequence and
    reduce-scatters its output back, by the linears' layouts or by PrepareModuleInputOutput."""
    if name == "sequence_parallel":
        return {"norm": SequenceParallel(), "mlp.0": ColwiseParallel(input_layouts=Shard(1)), "mlp.2": RowwiseParallel(output_layouts=Shard(1))}
    return {
        "norm": SequenceParallel(),
        "mlp": PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
            output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),),
        ),
        "mlp.0": ColwiseParallel(),
        "mlp.2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }  # fmt: skip


def make_block(mesh: DeviceMesh, name: str, plan: dict | None = None) -> nn.Module:
    torch.manual_seed(0)
    return parallelized(Block(), mesh, plan or block_plan(name))


def block_data(rank: int) -> list:
    """This rank's part of the sequence: (batch 2, 4 of 8 positions, 16)."""
    generator = torch.Generator().manual_seed(300 + rank)
    return [(torch.randn(2, 4, 16, generator=generator), torch.randn(2, 4, 16, generator=generator)) for _ in range(3)]


def run_block(name: str, fn, rank: int, mesh: DeviceMesh) -> list:
    model, seen = make_block(mesh, name), []
    optimizer = optimizer_for("adamw", model) if name == "sequence_parallel" else None
    for x, y in block_data(rank):
        out = fn(model, x, y)
        if optimizer is not None:  # eager AdamW on the gradients the artifact wrote, Partial ones included
            optimizer.step()
            optimizer.zero_grad()
        seen.append({"out": out.clone(), **snapshot(model, optimizer)})
    return seen


def run(name: str, fn, rank: int, mesh: DeviceMesh) -> list:
    """3 iterations of run ``name`` with fn (an artifact, or the eager step it captured)."""
    return iterate(name, fn, model_for(name, mesh), 0)  # every rank the same batch: Replicate inputs


def steps() -> dict:
    return {
        "accumulate": step, "outside": step, "forward": forward,
        "sgd": step_with_optimizer, "adamw": step_with_optimizer, "clip": clipped_step,
    }  # fmt: skip


def precompile_all(backend: str, mesh: DeviceMesh) -> dict:
    x, y = make_data(0)[0]
    pairs = {}
    for name, fn in steps().items():
        model = model_for(name, mesh)
        arguments = {"forward": (model, x), **{o: (model, optimizer_for(o, model), x, y) for o in ("sgd", "adamw")}}
        arguments["clip"] = (model, optimizer_for("adamw", model), x, y)
        with torch.no_grad() if name == "forward" else torch.enable_grad():
            pairs[name] = torch_precompile.precompile(fn, *arguments.get(name, (model, x, y)), backend=backend)
    for name in BLOCK_RUNS:
        pairs[name] = torch_precompile.precompile(step, make_block(mesh, name), *block_data(0)[0], backend=backend)
    return pairs


# -- refusals -------------------------------------------------------------------


def call_refusals(runnable, mesh: DeviceMesh) -> dict:
    """What a call refuses before it communicates; the model must stay as it was (rank 0 alone)."""
    x, y = make_data(0)[0]
    one_rank = dist.new_group([0])  # every rank creates it; only rank 0 uses it
    if dist.get_rank() != 0:
        return {}
    return refused_calls(runnable, x, y, (
        ("world_size", lambda: make_model(DeviceMesh.from_group(one_rank, "cpu"))),
        ("placements", lambda: make_model(mesh, {"0": RowwiseParallel(), "2": ColwiseParallel()})),
        ("hooks", lambda: make_model(mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(0))})),
        ("replicated_grad", lambda: with_replicated_grad(make_model(mesh))),
        ("plain_model", lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))),
    ))


def capture_refusals(backend: str, mesh: DeviceMesh) -> dict:
    """What capture refuses (rank 0 alone; nothing communicates)."""
    x, y = make_data(0)[0]
    ids = torch.randint(0, 16, (4, 8))

    def embedding() -> nn.Module:  # row-wise embedding: each rank masks ids by its own vocabulary offset
        torch.manual_seed(0)
        return parallelized(nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 8)), mesh, {"0": RowwiseParallel()})

    block = make_block(mesh, "sequence_parallel")
    return {
        "sets_grad": refusal(lambda: torch_precompile.precompile(sets_grad, make_model(mesh), x, y, backend=backend)),
        "partial_grad_optimizer": refusal(lambda: torch_precompile.precompile(
            step_with_optimizer, block, optimizer_for("adamw", block), *block_data(0)[0], backend=backend)),
        "embedding": refusal(lambda: torch_precompile.precompile(lambda m, i: m(i).sum(), embedding(), ids, backend=backend)),
        "uneven": refusal(lambda: torch_precompile.precompile(
            step, parallelized(nn.Sequential(nn.Linear(16, 7)), mesh, {"0": ColwiseParallel()}), x, y, backend=backend)),
    }


# -- fully_shard over tensor parallel: 4 ranks, a 2 x 2 mesh -------------------


RUNS_2D = {"accumulate": step, "adamw": step_with_optimizer, "bf16_adamw": step_with_optimizer}


def make_model_2d(mesh_2d: DeviceMesh, name: str = "accumulate") -> nn.Module:
    """Tensor parallel over the mesh's "tp" dim, then fully_shard over "dp" (each Linear, the
    root); run "bf16_adamw"'s computes in bfloat16 (fully_shard's mixed precision policy, as
    the FSDP2 worker's run of that name)."""
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy

    policy = {"mp_policy": MixedPrecisionPolicy(**MIXED_PRECISION[name])} if name in MIXED_PRECISION else {}
    model = make_model(mesh_2d["tp"])
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh_2d["dp"], **policy)
    return fully_shard(model, mesh=mesh_2d["dp"], **policy)


def main_2d(out_dir: str, backends: list) -> None:
    """Each run with the artifact and eagerly, per backend; the tensor parallel ranks of one
    data-parallel rank share its batch."""
    rank, compiler_log = start_rank(out_dir)
    mesh_2d = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    x, y = make_data(0)[0]
    result = {"artifact": {}}
    for backend in backends:  # rank 0 makes and captures its models alone: no collective

        def precompile_pairs() -> dict:
            models = {name: make_model_2d(mesh_2d, name) for name in RUNS_2D}
            arguments = {name: (model, optimizer_for("adamw", model), x, y) for name, model in models.items()}
            arguments["accumulate"] = (models["accumulate"], x, y)
            return {name: torch_precompile.precompile(fn, *arguments[name], backend=backend) for name, fn in RUNS_2D.items()}

        _, runnables = shipped_and_loaded(rank, precompile_pairs)
        result["artifact"][backend] = {name: iterate(name, f, make_model_2d(mesh_2d, name), rank // 2) for name, f in runnables.items()}
        one_dim = make_model(mesh_2d["tp"])  # tensor parallel alone
        if rank == 0:
            result["refusal"] = refusal(lambda: runnables["accumulate"](one_dim, x, y))
    result["eager"] = {name: iterate(name, fn, make_model_2d(mesh_2d, name), rank // 2) for name, fn in RUNS_2D.items()}
    save_rank(result, rank, compiler_log, out_dir)


def main(out_dir: str, backends: list) -> None:
    rank, compiler_log = start_rank(out_dir)
    world_size = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world_size,))
    result = {"artifact": {}, "eager": {}, "refusals": {}}
    for backend in backends:
        shipped, runnables = shipped_and_loaded(rank, lambda: precompile_all(backend, mesh))
        result["artifact"][backend] = {
            name: (run_block if name in BLOCK_RUNS else run)(name, f, rank, mesh) for name, f in runnables.items()
        }
        result["refusals"][backend] = call_refusals(runnables["accumulate"], mesh)
        plan = block_plan("prepared")
        block = make_block(mesh, "prepared", plan)
        plan["mlp"].prepare_module_input.desired_input_layouts = (Shard(1),)  # after parallelize_module: eager follows it
        if rank == 0:
            result["refusals"][backend]["style_changed"] = refusal(lambda: runnables["prepared"](block, *block_data(0)[0]))
        if rank == 0:
            result["refusals"][backend].update(capture_refusals(backend, mesh))
            from torch_precompile._precompile_inspect import describe

            result["checks"] = describe(*shipped["adamw"])["checks"]
            if backend == "eager":  # the captured graph's collectives, in order
                result["collectives"] = graph_ops(shipped["accumulate"][0], r"torch\.ops\._c10d_functional\.(\w+)\.")
    result["eager"] = {name: run(name, fn, rank, mesh) for name, fn in steps().items()}
    result["eager"].update({name: run_block(name, step, rank, mesh) for name in BLOCK_RUNS})
    save_rank(result, rank, compiler_log, out_dir)


if __name__ == "__main__":
    if sys.argv[2] == "2d":
        main_2d(sys.argv[1], sys.argv[3:])
    else:
        main(sys.argv[1], sys.argv[2:])
