"""fully_shard (FSDP2) models at capture (Note [precompile programming model], invariant 17).

A model whose submodules ``torch.distributed.fsdp.fully_shard`` sharded is a
module argument like any other.  Each sharded parameter is a DTensor placed
``Shard(0)`` on a 1-D device mesh; its local shard is lifted (the graph input),
its ``ShardSpec`` (whole shape, group, world size) recorded and checked at every
call (``runtime.check_sharded_parameters``, ``runtime.sharded_inputs``).  What
fully_shard does around the model is traced instead of run, as SimpleFSDP
formulates it:

- its forward pre- and post-hooks never run (``hooks_as_casts``): before fn,
  the graph all-gathers each parameter group from its shards (one functional
  collective per group and dtype, as fully_shard's) and the modules compute
  with the whole parameters; ``_overlap`` then moves each wait to where its
  result is first used and each reduce-scatter to where its gradient is ready;
- the all-gather's backward reduce-scatters the whole gradient, averaged over
  the ranks as fully_shard's reduce-scatter averages it, so backward leaves
  each local shard its part of the gradient; the driver writes it to ``.grad``
  as a DTensor placed like the parameter (``runtime.ShardedGradient``);
- a mixed precision policy's casts are in the graph where fully_shard makes
  them (``Precision``): the shards before the all-gather, each sharded module's
  inputs and outputs (its hooks' casts alone stay), the gradient before the
  reduce-scatter and back to the shard's dtype after it.

Capture runs no collective: the trace calls stand-in ops that compute nothing
(``_stand_in_ops``) and ``use_collectives`` turns them into the functional
collectives afterwards, so one rank precompiles alone.  Refused at capture:
FSDP1, offload policies, settings that change the gradient reduction
(``runtime.fully_shard_unsupported``), a forward in grad mode without backward
of a module fully_shard leaves unsharded after it (``hooks_as_casts``), modules sharded together in one call,
parameters whose dim 0 does not divide evenly over the ranks, and meshes other
than 1-D, or 2-D with tensor parallel on the second dim.
"""

import contextlib
import functools
import sys
from typing import Any, NamedTuple

import torch

from . import _precompile_compat as compat, _precompile_runtime as runtime, _precompile_tp as tp
from ._precompile_schema import PrecompileError, ShardSpec


def is_fully_shard_module(module: Any) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # no module is sharded before its import
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def check_module(where: str, module: torch.nn.Module) -> list:
    """Refuse a fully_shard submodule whose settings the graph does not reproduce; return the
    (path, policy) of each with a mixed precision policy, which a call checks."""
    policies = []
    for path, sub in module.named_modules():
        if not is_fully_shard_module(sub):
            continue
        name = f"{where}.{path}" if path else where
        policy = runtime.mixed_precision(runtime.fully_shard_state(sub))
        policies += [(name, policy)] if policy is not None else []
        runtime.check_fully_shard([(name, sub)], policies)
        hooks = [h for attribute in runtime.MODULE_HOOK_DICTS for h in getattr(sub, attribute).values()]
        if not any(map(runtime.is_fully_shard_hook, hooks)):
            raise PrecompileError(
                f"{name} was sharded by one fully_shard call together with other modules (fully_shard([...])), "
                "whose shared hooks precompile does not support yet: call fully_shard on each module"
            )
    return policies


def shard_spec(where: str, param: Any) -> ShardSpec:
    """A fully_shard parameter's ShardSpec; refuse what the graph's all-gather cannot reproduce.

    On a 1-D mesh it is placed Shard(0).  Over tensor parallel, on a 2-D mesh, fully_shard
    shards dim 0 of tensor parallel's local shard over the first dim (placed Shard(0), or
    _StridedShard(0) where tensor parallel shards dim 0 too), and the graph all-gathers that
    local shard, which tensor parallel's DTensor then holds (``_precompile_tp.local_layout``)."""
    dtensor = sys.modules["torch.distributed.tensor"]
    mesh, placements = param.device_mesh, tuple(param.placements)
    over_parallel = mesh.ndim == 2 and mesh.mesh_dim_names is not None and getattr(placements[0], "dim", None) == 0
    if not over_parallel and (mesh.ndim != 1 or placements != (dtensor.Shard(0),)):
        raise PrecompileError(
            f"{where} is placed {placements} on a {mesh.ndim}-D device mesh: precompile supports fully_shard "
            "with its default Shard(0) placement on a 1-D mesh, or on the first dim of a named 2-D mesh whose "
            "second dim tensor parallel shards (HSDP and shard_placement_fn are not supported yet)"
        )
    group = mesh.get_group(0)
    rows = tp.local_layout(where, param)[0][0] if over_parallel else param.shape[0]
    if rows % group.size():
        raise PrecompileError(
            f"{where} has {rows} rows over {group.size()} ranks: its shards differ in size from rank "
            "to rank, and one artifact serves every rank; precompile supports parameters whose dim 0 is a "
            "multiple of the world size (pad the layer, or change its size)"
        )
    spec = ShardSpec(
        shape=tuple(param.shape), world_size=group.size(), group_name=group.group_name,
        mesh_ranks=runtime.root_mesh_ranks(mesh),
    )  # fmt: skip
    if not over_parallel:
        return spec
    parallel = mesh.get_group(1)
    return spec._replace(
        placements=tuple(map(repr, placements)), parallel_group_name=parallel.group_name, parallel_world_size=parallel.size()
    )


def local_shard(param: Any) -> torch.Tensor:
    """What capture lifts for a fully_shard parameter: its local shard's storage, with the
    parameter's requires_grad (the shard itself never requires grad)."""
    return getattr(param, runtime.DTENSOR_LOCAL).detach().requires_grad_(param.requires_grad)


def parameter_groups(model: torch.nn.Module) -> list[tuple]:
    """(group, its sharded parameters) of each fully_shard parameter group in ``model`` (each
    group is all-gathered in one collective, as eager FSDP2 does)."""
    states = [state for state in map(runtime.fully_shard_state, model.modules()) if state is not None]
    return [
        (group, compat.fully_shard_group_parameters(group))
        for state in states
        for group in runtime.fully_shard_param_groups(state)
    ]


class Precision(NamedTuple):
    """The dtypes one parameter group's all-gather and gradient reduce-scatter compute in, as
    its mixed precision policy has fully_shard's (FSDPParam.init_dtype_attrs, foreach_reduce):
    the shards are cast to ``param_dtype`` and gathered; the whole gradient (in that dtype) is
    cast to ``reduce_dtype``, divided by ``predivide``, reduced by ``reduce_op`` ("avg" or
    "sum"), divided by ``postdivide`` and cast back to the shard's dtype."""

    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    reduce_op: str
    predivide: float | None
    postdivide: float | None


def precision(group: Any, param: Any) -> Precision:
    """How ``param``'s fully_shard parameter ``group`` gathers it and reduces its gradient."""
    policy, dtype = group.mp_policy, param.dtype
    param_dtype = policy.param_dtype if policy.param_dtype is not None and dtype.is_floating_point else dtype
    reduce_dtype = policy.reduce_dtype or param_dtype  # the gradient's own dtype where the policy has none
    predivide, postdivide, op = compat.fully_shard_divide_factors(param.device_mesh.get_group(0), reduce_dtype, param.device.type)
    return Precision(param_dtype, reduce_dtype, op.name.lower(), predivide, postdivide)


def gathered(shards: list, spec: ShardSpec, how: Precision) -> list:
    """The whole parameters from their ``shards`` (one group's: one all-gather of them
    flattened into one tensor, and one reduce-scatter of their gradients, as fully_shard's
    own flat collectives), through the trace's stand-in ops."""
    world_size = spec.world_size
    with torch.enable_grad():  # backward reaches the shards through it, whatever fn's grad mode
        flat = torch.cat([shard.reshape(-1) for shard in shards]) if len(shards) > 1 else shards[0].reshape(-1)
        whole = _GatherShards.apply(flat, spec, how).view(world_size, -1)  # a row per rank
        params, offset = [], 0
        for shard in shards:
            part = whole[:, offset : offset + shard.numel()]  # each rank's shard of this parameter
            params.append(part.reshape(world_size * shard.shape[0], *shard.shape[1:]))
            offset += shard.numel()
    return params


class _GatherShards(torch.autograd.Function):
    """A parameter group's flat shard, cast and all-gathered; backward casts the whole
    gradient, reduce-scatters it and casts this rank's part back, as ``Precision`` says."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, spec: ShardSpec, how: Precision) -> torch.Tensor:
        ctx.spec, ctx.how, ctx.dtype = spec, how, flat.dtype
        all_gather, _, wait = _stand_in_ops()
        return wait(all_gather(flat.to(how.param_dtype), spec.world_size, spec.group_name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        _, reduce_scatter, wait = _stand_in_ops()
        spec, how = ctx.spec, ctx.how
        grad = grad.to(how.reduce_dtype).contiguous()
        if how.predivide not in (None, 1):
            grad = grad / how.predivide
        shard = wait(reduce_scatter(grad, how.reduce_op, spec.world_size, spec.group_name))
        if how.postdivide not in (None, 1):
            shard = shard / how.postdivide
        return shard.to(ctx.dtype), None, None


@contextlib.contextmanager
def hooks_as_casts(modules: list, positions: list):
    """While fn is traced, each of fully_shard's forward hooks only casts as its mixed
    precision policy says (the graph gathers the parameters itself), or is out of its
    module's hook dict where it casts nothing; put back, in order, on exit.

    Refuses, after fn, a forward in grad mode that no backward in fn went through, of a
    module whose parameters fully_shard then leaves unsharded (the root's; those of
    reshard_after_forward=False): eager's module holds them after the call, the
    artifact's its shards."""
    saved, pending = [], {}  # the paths of modules with a forward in grad mode no backward went through yet
    try:
        for module, position in zip(modules, positions):
            for path, sub in module.named_modules():
                if is_fully_shard_module(sub):
                    for attribute in runtime.MODULE_HOOK_DICTS:
                        hooks = getattr(sub, attribute)
                        saved.append((hooks, dict(hooks)))
                        for key in [k for k, hook in hooks.items() if runtime.is_fully_shard_hook(hook)]:
                            cast = _policy_cast(hooks[key])
                            if cast is None:
                                del hooks[key]
                            else:
                                hooks[key] = cast  # in the fully_shard hook's place
                    state = runtime.fully_shard_state(sub)
                    if compat.fully_shard_keeps_unsharded(state, runtime.fully_shard_param_groups(state), root=not path):
                        where = f"args[{position}]{'.' + path if path else ''}"
                        # Into the saved dict (no handle: not a hook of fn's), removed on exit.
                        compat.put_forward_hook(sub, functools.partial(_note_forward, pending, where))
        yield
    finally:
        for hooks, entries in saved:
            hooks.clear()
            hooks.update(entries)
    if pending:
        where = next(iter(pending))
        raise PrecompileError(
            f"{where}: fn runs its forward with grad enabled and no backward through it; eager fully_shard then "
            "leaves its unsharded parameters registered on the module (the root's, or reshard_after_forward=False), "
            "the artifact its shards: run that forward under torch.no_grad(), or call backward on its output inside fn"
        )


def _note_forward(pending: dict, where: str, module: torch.nn.Module, args: Any, output: Any) -> None:
    """Forward post-hook: a forward in grad mode is pending until a backward goes through its output."""
    outputs = [t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not (torch.is_grad_enabled() and outputs):
        return
    pending[where] = True  # as eager, a backward through any of its forwards reshards it
    torch.autograd.graph.register_multi_grad_hook(outputs, lambda grads: pending.pop(where, None), mode="any")


def _policy_cast(hook: Any) -> Any:
    """The cast of fully_shard's forward pre-hook (its inputs, to ``param_dtype`` where the
    policy says cast_forward_inputs) or post-hook (its output, to ``output_dtype``), or None."""
    policy = runtime.fully_shard_policy(hook.__self__)
    if compat.is_fully_shard_pre_hook(hook):
        if not (policy.cast_forward_inputs and policy.param_dtype):
            return None
        return lambda module, args, kwargs: (compat.fully_shard_cast(policy.param_dtype, args), compat.fully_shard_cast(policy.param_dtype, kwargs))
    if policy.output_dtype is None:
        return None
    return lambda module, args, output: compat.fully_shard_cast(policy.output_dtype, output)


@functools.cache
def _stand_in_ops() -> tuple[Any, Any, Any]:
    """``(all_gather(shard, world_size, group_name), reduce_scatter(whole, reduce_op,
    world_size, group_name), wait(tensor))`` for the trace: shapes right, values not
    communicated.

    ``use_collectives`` retargets them to ``_c10d_functional.all_gather_into_tensor``,
    ``reduce_scatter_tensor`` and ``wait_tensor`` (same schemas).  make_fx runs every op
    it records, and capture must not run a collective: the other ranks do not join it.
    """
    namespace = torch.ops.precompile_fsdp
    if not hasattr(namespace, "all_gather"):  # registered once per process (another copy of this module)

        @torch.library.custom_op("precompile_fsdp::all_gather", mutates_args=())
        def all_gather(shard: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
            return shard.repeat(world_size, *[1] * (shard.dim() - 1))

        @torch.library.custom_op("precompile_fsdp::reduce_scatter", mutates_args=())
        def reduce_scatter(whole: torch.Tensor, reduce_op: str, world_size: int, group_name: str) -> torch.Tensor:
            return whole[: whole.shape[0] // world_size].clone()

        @torch.library.custom_op("precompile_fsdp::wait", mutates_args=())
        def wait(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.clone()

        all_gather.register_fake(lambda shard, world_size, group_name: shard.new_empty((shard.shape[0] * world_size, *shard.shape[1:])))
        reduce_scatter.register_fake(
            lambda whole, reduce_op, world_size, group_name: whole.new_empty((whole.shape[0] // world_size, *whole.shape[1:]))
        )
        wait.register_fake(lambda tensor: torch.empty_like(tensor))
    return namespace.all_gather.default, namespace.reduce_scatter.default, namespace.wait.default


def use_collectives(graph: torch.fx.GraphModule) -> None:
    """Retarget the trace's stand-in ops to the functional collectives they stand for, and
    schedule them so that communication overlaps compute (``_overlap``)."""
    stand_in_all_gather, stand_in_reduce_scatter, stand_in_wait = _stand_in_ops()
    all_gather, reduce_scatter, wait = compat.fully_shard_collectives()
    launches, waits = [], []
    for node in graph.graph.nodes:
        if node.target is stand_in_all_gather:  # each with the same arguments
            node.target = all_gather
        elif node.target is stand_in_reduce_scatter:
            node.target = reduce_scatter
            launches.append(node)
        elif node.target is stand_in_wait:
            node.target = wait
            waits.append(node)
    if waits:
        _overlap(graph.graph, launches, waits)
        graph.recompile()


def _overlap(graph: torch.fx.Graph, launches: list, waits: list) -> None:
    """Launch each reduce-scatter as soon as its gradient is computed, and wait for every
    collective only where its result is first used.

    The trace launches the all-gathers at the start of the step and waits for each at
    once; backward reaches the all-gathers' autograd formulas, which reduce-scatter, only
    after all of backward.  Moved, the forward of the layers gathered first and the rest
    of backward run while the later collectives communicate.  Only the order changes:
    each node still follows its inputs and precedes its users.
    """
    order = {node: float(i) for i, node in enumerate(graph.nodes)}  # kept current as nodes move

    def moved(node: torch.fx.Node) -> None:  # between its new neighbours
        before, after = order.get(node.prev, order[node.next] - 1.0), order.get(node.next, order[node.prev] + 1.0)
        order[node] = (before + after) / 2

    for launch in launches:  # with the ops that only it uses, right after what they need
        for node in sorted(_exclusive_producers(launch), key=order.__getitem__) + [launch]:
            latest = max(node.all_input_nodes, key=order.__getitem__)
            if node.prev is not latest:
                latest.append(node)
                moved(node)
    for wait in waits:  # and the ops computing from its result alone (division, views), each before its first use
        for node in sorted(_derived_alone(wait), key=order.__getitem__, reverse=True):
            first_use = min(node.users, key=order.__getitem__, default=None)
            if first_use is not None and node.next is not first_use:
                first_use.prepend(node)
                moved(node)
    graph.lint()  # each node still after its inputs


def _derived_alone(wait: torch.fx.Node) -> list:
    """``wait`` and the ops that compute from its result and nothing else, transitively."""
    derived, pending = [], [wait]
    while pending:
        node = pending.pop()
        derived.append(node)
        pending += [user for user in node.users if user.op == "call_function" and len(user.all_input_nodes) == 1]
    return derived


def _exclusive_producers(node: torch.fx.Node) -> set:
    """The ops computing ``node``'s inputs that nothing but ``node`` (through them) uses."""
    cone: set = set()
    pending = [i for i in node.all_input_nodes if i.op == "call_function"]
    while pending:
        producer = pending.pop()
        if producer in cone or any(user is not node and user not in cone for user in producer.users):
            continue
        cone.add(producer)
        pending += [i for i in producer.all_input_nodes if i.op == "call_function"]
    return cone
