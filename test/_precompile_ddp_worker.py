"""One rank of test_precompile_distributed.py's DDP job (run with torch.distributed.run).

    python -m torch.distributed.run --nproc-per-node 2 test/_precompile_ddp_worker.py OUT_DIR BACKEND...

Rank 0 precompiles every step (a DDP-wrapped tiny MLP) per backend and
broadcasts the pairs; every rank loads them and trains 3 iterations with each,
and the same iterations with eager DDP on an identical model.  Each rank saves
``OUT_DIR/rank{r}.pt``: per run the grads after every backward and the final
parameters, artifact and eager; on ranks > 0 the compilers it ran (they run
with recording stub compilers first on PATH, as examples/distributed_train.py
does: DDP's constructor imports torch._inductor itself, so sys.modules cannot
tell); and the PrecompileError messages of the refusal checks.
"""

import datetime
import importlib.util
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch_precompile


STEPS, SHARD = 3, 4
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "distributed_train.py")


def _example():
    """examples/distributed_train.py, for its recording stub compilers."""
    spec = importlib.util.spec_from_file_location("distributed_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WithUnused(nn.Module):
    """An MLP and a layer forward never calls: its parameters get no gradient."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return self.mlp(x)


class MixedLayouts(nn.Module):
    """A channels_last conv (its .grad keeps those strides) and a float64 head (a bucket of its own dtype)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 2).to(memory_format=torch.channels_last)
        self.head = nn.Linear(3, 4).double()

    def forward(self, x):
        image = x.view(-1, 2, 2, 2).contiguous(memory_format=torch.channels_last)
        return self.head(self.conv(image).flatten(1).double()).float()


def make_model(kind: str = "mlp") -> nn.Module:
    torch.manual_seed(0)
    if kind == "unused":
        return WithUnused()
    if kind == "mixed":
        return MixedLayouts()
    if kind == "batchnorm":  # buffers: DDP broadcasts them from rank 0 before each forward
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 4))
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def make_data(rank: int, micro: int = 1) -> list:
    """STEPS x micro (x, y) shards of this rank: different per rank, as in data-parallel training."""
    generator = torch.Generator().manual_seed(100 + rank)
    return [
        [(torch.randn(SHARD, 8, generator=generator), torch.randint(0, 4, (SHARD,), generator=generator))
         for _ in range(micro)]
        for _ in range(STEPS)
    ]


def step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def step_with_no_grad_targets(model, x, y):
    """Self-distillation: a second forward through the DDP model under no_grad() must leave the
    first forward's gradient all-reduce pending, as eager DDP's reducer does."""
    logits = model(x)
    with torch.no_grad():
        targets = model(x * 0.5).softmax(-1)
    loss = F.cross_entropy(logits, y) - (logits.log_softmax(-1) * targets).sum(-1).mean()
    loss.backward()
    return loss


def step_with_optimizer(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def optimizer_for(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def grads(model: nn.Module) -> list:
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def params(model: nn.Module) -> list:
    """Parameters, then buffers."""
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


# -- the runs: the same loop with an artifact and with eager fn -----------------


def run_plain(fn, rank, kind="mlp", **ddp_options):
    """zero_grad, fn (forward, backward), SGD step outside fn; then one eager DDP step.

    The last step checks that the artifact left DDP's reducer as it was (not
    expecting a backward, its hooks never run): eager DDP still works.
    """
    ddp = nn.parallel.DistributedDataParallel(make_model(kind), **ddp_options)
    optimizer = optimizer_for("sgd", ddp)
    seen = []
    for (x, y), in make_data(rank):
        optimizer.zero_grad(set_to_none=True)
        fn(ddp, x, y)
        seen.append(grads(ddp))
        optimizer.step()
    # How many storages the .grads of fn's last step are in (one per bucket with
    # gradient_as_bucket_view), and their strides.
    storages = len({p.grad.untyped_storage().data_ptr() for p in ddp.parameters() if p.grad is not None})
    strides = [p.grad.stride() for p in ddp.parameters() if p.grad is not None]
    optimizer.zero_grad(set_to_none=True)
    step(ddp, x, y)
    seen.append(grads(ddp))
    return {"grads": seen, "params": params(ddp), "grad_storages": storages, "grad_strides": strides}


def run_accumulating(accumulate, fn, rank):
    """Two micro-batches per iteration: the first under ddp.no_sync(), the last synchronizing."""
    ddp = nn.parallel.DistributedDataParallel(make_model())
    optimizer = optimizer_for("sgd", ddp)
    seen = []
    for (x0, y0), (x1, y1) in make_data(rank, micro=2):
        optimizer.zero_grad(set_to_none=True)
        with ddp.no_sync():
            accumulate(ddp, x0, y0)
        seen.append(grads(ddp))  # local: differs per rank
        fn(ddp, x1, y1)
        seen.append(grads(ddp))
        optimizer.step()
    return {"grads": seen, "params": params(ddp)}


def run_with_optimizer(fn, rank, name):
    ddp = nn.parallel.DistributedDataParallel(make_model())
    optimizer = optimizer_for(name, ddp)
    seen = []
    for (x, y), in make_data(rank):
        fn(ddp, optimizer, x, y)
        seen.append(grads(ddp))
    return {"grads": seen, "params": params(ddp)}


def example_ddp(kind: str = "mlp", **kwargs) -> nn.Module:
    return nn.parallel.DistributedDataParallel(make_model(kind), **kwargs)


def example_models() -> dict:
    """DDP's constructor is a collective (it broadcasts rank 0's parameters): every rank builds these."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    models = {
        "ddp": example_ddp(),
        "unused": example_ddp("unused", find_unused_parameters=True),
        "bucket_view": example_ddp(gradient_as_bucket_view=True),
        "mixed": example_ddp("mixed"),
        "unused_refused": example_ddp("unused"),
        "batchnorm": example_ddp("batchnorm"),
        "comm_hook": example_ddp(),
    }
    models["comm_hook"].register_comm_hook(None, default_hooks.fp16_compress_hook)
    models["frozen_after_wrapping"] = example_ddp()
    models["frozen_after_wrapping"].module[0].bias.requires_grad_(False)  # DDP's reducer still waits for it
    from torch.distributed.fsdp import FullyShardedDataParallel

    models["fsdp"] = FullyShardedDataParallel(make_model(), device_id=torch.device("cpu"))
    from torch.distributed.device_mesh import init_device_mesh

    MESH.append(init_device_mesh("cpu", (dist.get_world_size(),)))
    return models


MESH = []  # every rank's device mesh over the world, made with the models


def all_reduces(model, x, y):
    loss = step(model, x, y)
    dist.all_reduce(loss)
    return loss


def all_reduces_functionally(model, x, y):
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(F.cross_entropy(model(x), y), "sum", dist.group.WORLD)


def redistributes(model, x, y):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    sharded = DTensor.from_local(model(x), MESH[0], [Shard(0)], run_check=False)
    return F.cross_entropy(sharded.redistribute(sharded.device_mesh, [Replicate()]).to_local(), y.repeat(2))


def computes_with_a_dtensor(model, x, y):
    from torch.distributed.tensor import DTensor, Shard

    sharded = DTensor.from_local(model(x), MESH[0], [Shard(0)], run_check=False)
    return F.cross_entropy((sharded * 2).to_local(), y)


def precompile_all(backend: str, models: dict) -> dict:
    (x, y), = make_data(0)[0]
    ddp = models["ddp"]
    pairs = {"plain": torch_precompile.precompile(step, ddp, x, y, backend=backend)}
    with ddp.no_sync():
        pairs["accumulate"] = torch_precompile.precompile(step, ddp, x, y, backend=backend)
    for name in ("sgd", "adamw"):
        pairs[name] = torch_precompile.precompile(
            step_with_optimizer, ddp, optimizer_for(name, ddp), x, y, backend=backend
        )
    pairs["unused"] = torch_precompile.precompile(step, models["unused"], x, y, backend=backend)
    for name in ("bucket_view", "mixed"):
        pairs[name] = torch_precompile.precompile(step, models[name], x, y, backend=backend)
    pairs["batchnorm"] = torch_precompile.precompile(step, models["batchnorm"], x, y, backend=backend)
    pairs["no_grad_targets"] = torch_precompile.precompile(step_with_no_grad_targets, ddp, x, y, backend=backend)
    return pairs


def run_all(runnables: dict, rank: int) -> dict:
    return {
        "plain": run_plain(runnables["plain"], rank),
        "accumulate": run_accumulating(runnables["accumulate"], runnables["plain"], rank),
        "sgd": run_with_optimizer(runnables["sgd"], rank, "sgd"),
        "adamw": run_with_optimizer(runnables["adamw"], rank, "adamw"),
        "unused": run_plain(runnables["unused"], rank, "unused", find_unused_parameters=True),
        "bucket_view": run_plain(runnables["bucket_view"], rank, gradient_as_bucket_view=True),
        "mixed": run_plain(runnables["mixed"], rank, "mixed"),
        "batchnorm": run_plain(runnables["batchnorm"], rank, "batchnorm"),
        "no_grad_targets": run_plain(runnables["no_grad_targets"], rank),
    }


# -- refusals -------------------------------------------------------------------


def refusal(call) -> str:
    """The PrecompileError message of call(), or a note that it was not refused."""
    try:
        call()
    except torch_precompile.PrecompileError as error:
        return str(error)
    return "NOT REFUSED"


def call_refusals(runnables: dict) -> dict:
    """What a call refuses: the model, its .grad and parameters must stay as they were."""
    (x, y), = make_data(0)[0]
    runnable, accumulate = runnables["plain"], runnables["accumulate"]
    out = {}
    one_rank = dist.new_group([0])  # every rank creates it; only rank 0 uses it
    ddp, batchnorm = example_ddp(), example_ddp("batchnorm")
    ignoring = make_model()  # DDP neither averages 0.bias's gradient nor broadcasts it
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(ignoring, ["0.bias"])
    ignoring = nn.parallel.DistributedDataParallel(ignoring)
    unfrozen = make_model()  # frozen while DDP is constructed: it leaves 0.bias's gradient local
    unfrozen[0].bias.requires_grad_(False)
    unfrozen = nn.parallel.DistributedDataParallel(unfrozen)
    unfrozen.module[0].bias.requires_grad_(True)
    replaced = example_ddp()
    replaced.module = make_model()  # DDP's reducer still averages the old module's parameters
    if dist.get_rank() == 0:
        for name, model in (("ignored_parameters", ignoring), ("unfrozen_after_wrapping", unfrozen), ("module_replaced", replaced)):
            before = params(model)
            out[name] = refusal(lambda: runnable(model, x, y))
            out[f"{name}_untouched"] = all(p.grad is None for p in model.parameters()) and all(
                torch.equal(a, b) for a, b in zip(before, params(model))
            )
        small = nn.parallel.DistributedDataParallel(make_model(), process_group=one_rank)
        before = params(small)
        out["world_size"] = refusal(lambda: runnable(small, x, y))
        out["world_size_untouched"] = all(p.grad is None for p in small.parameters()) and all(
            torch.equal(a, b) for a, b in zip(before, params(small))
        )
        with ddp.no_sync():
            out["sync_inside_no_sync"] = refusal(lambda: runnable(ddp, x, y))
        out["no_sync_outside"] = refusal(lambda: accumulate(ddp, x, y))
        out["plain_module"] = refusal(lambda: runnable(make_model(), x, y))
        out["untouched"] = all(p.grad is None for p in ddp.parameters())
        # As after an eager forward inside no_sync(): DDP would not broadcast the buffers next.
        batchnorm.require_forward_param_sync = False
        before = params(batchnorm)
        out["no_buffer_broadcast"] = refusal(lambda: runnables["batchnorm"](batchnorm, x, y))
        out["batchnorm_untouched"] = all(p.grad is None for p in batchnorm.parameters()) and all(
            torch.equal(a, b) for a, b in zip(before, params(batchnorm))
        )
    return out


def capture_refusals(backend: str, models: dict) -> dict:
    """What capture refuses (rank 0 alone; nothing communicates)."""
    (x, y), = make_data(0)[0]
    out = {
        name: refusal(lambda: torch_precompile.precompile(step, models[model], x, y, backend=backend))
        for name, model in (
            ("unused", "unused_refused"), ("comm_hook", "comm_hook"), ("fsdp", "fsdp"),
            ("frozen_after_wrapping", "frozen_after_wrapping"),
        )
    }
    with models["batchnorm"].no_sync():
        out["buffers_in_no_sync"] = refusal(
            lambda: torch_precompile.precompile(step, models["batchnorm"], x, y, backend=backend)
        )
    # Collectives in fn: refused at once, though rank 1 is not capturing (it waits in a barrier).
    for name, fn, model in (
        ("all_reduce", all_reduces, make_model()),
        ("functional_all_reduce", all_reduces_functionally, make_model()),
        ("redistribute", redistributes, make_model()),
        ("dtensor_op", computes_with_a_dtensor, make_model()),
    ):
        started = time.monotonic()
        out[name] = refusal(lambda: torch_precompile.precompile(fn, model, x, y, backend=backend))
        out[f"{name}_seconds"] = time.monotonic() - started
    return out


def start_rank(out_dir: str) -> tuple[int, str]:
    """Join the job's process group; on ranks > 0 every compiler is a recording stub that
    fails, and the Inductor cache is empty.  Returns (rank, the compiler log's path)."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))  # a hang fails the job
    rank = dist.get_rank()
    os.makedirs(out_dir, exist_ok=True)
    compiler_log = os.path.join(out_dir, f"compiler_calls_rank{rank}.log")
    if rank > 0:  # any compiler this rank runs is recorded (and fails)
        open(compiler_log, "w").close()
        _example().install_stub_compilers(os.path.join(out_dir, f"stub_compilers_rank{rank}"), compiler_log)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(out_dir, f"inductor_cache_rank{rank}")
    return rank, compiler_log


def main(out_dir: str, backends: list) -> None:
    rank, compiler_log = start_rank(out_dir)
    models = example_models()
    pairs = {}
    for backend in backends:
        shipped = [precompile_all(backend, models) if rank == 0 else None]
        dist.broadcast_object_list(shipped, src=0)
        pairs[backend] = shipped[0]
    result = {"artifact": {}, "eager": {}, "refusals": {}, "grad_inputs": {}}
    for backend in backends:
        runnables = {name: torch_precompile.load(*pair) for name, pair in pairs[backend].items()}
        result["grad_inputs"][backend] = {
            name: (list(f.convention.grad_inputs), list(f.convention.grad_inputs_read_only))
            for name, f in runnables.items()
        }
        result["artifact"][backend] = run_all(runnables, rank)
        result["refusals"][backend] = call_refusals(runnables)
    if rank > 0:
        with open(compiler_log) as f:
            result["compiler_calls"] = f.read().splitlines()
    result["eager"] = run_all({"plain": step, "accumulate": step, "sgd": step_with_optimizer,
                               "adamw": step_with_optimizer, "unused": step, "batchnorm": step,
                               "bucket_view": step, "mixed": step, "no_grad_targets": step_with_no_grad_targets}, rank)
    if rank == 0:
        result["capture_refusals"] = capture_refusals(backends[0], models)
        from torch_precompile._precompile_inspect import describe

        result["inspected_modules"] = {name: describe(*pair)["modules"] for name, pair in pairs[backends[0]].items()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
