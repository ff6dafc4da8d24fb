"""Tensor parallel models at capture (Note [precompile programming model], invariant 17).

A model that ``torch.distributed.tensor.parallel.parallelize_module`` parallelized
is a module argument like any other.  Each DTensor parameter (on a 1-D device mesh,
placed ``Shard(d)`` or ``Replicate()``) is lifted as its local shard, its
``ShardSpec`` (whole shape, placements, group, world size) recorded and checked at
every call.  Unlike fully_shard's, tensor parallel's hooks are part of what the
model computes, and they run in the trace:

- inside fn, each such parameter is a DTensor made from its traced local shard
  (``as_dtensor``), so the ParallelStyles' hooks and DTensor's sharding
  propagation run on the trace's tensors, and the graph holds the local ops;
- the collectives they run (``_c10d_functional``'s) are traced as stand-in ops
  that communicate nothing (``stand_in``), which ``use_collectives`` turns back
  into the functional collectives, so one rank captures alone;
- each hook is recorded by its code and closure (``parallel_hooks``) and a call
  accepts exactly those hooks (``runtime.find_hook``).

With fully_shard over tensor parallel (a 2-D mesh), the graph first gathers
fully_shard's shards into tensor parallel's local shard (``local_layout``), and
that is what the DTensor holds.  Backward computes each parameter's gradient as
a DTensor placed like the parameter, or Partial(sum) for a Replicate one, as
eager's; one placed otherwise is refused at capture (``GradientPlacements``).
Refused at capture: other meshes than those, Partial placements, dims that do
not divide evenly over the ranks, hooks whose closure holds anything but
layouts, meshes and functions, and a trace that uses this process's rank (its
graph would be this rank's: ``rank_unread``).
"""

import contextlib
import functools
import sys
import threading
from typing import Any, Callable

import torch

from . import _precompile_compat as compat, _precompile_runtime as runtime
from ._precompile_schema import PrecompileError, ShardSpec


def parallel_hooks(named_modules: list) -> list[tuple[str, str, str]]:
    """(module path, hook dict, description) of each tensor parallel hook; refuse any other
    torch.distributed hook, which the trace would run once and never check again."""
    found = []
    for path, module in named_modules:
        for attribute in runtime.MODULE_HOOK_DICTS:
            for hook in (getattr(module, attribute, None) or {}).values():
                if runtime.is_fully_shard_hook(hook):
                    continue
                description = runtime.parallel_hook_description(hook)
                if description is not None:
                    found.append((path, attribute, description))
                    continue
                defined_in = getattr(getattr(hook, "func", hook), "__module__", None) or ""
                if defined_in.startswith("torch.distributed"):
                    raise PrecompileError(
                        f"{path} has a hook from {defined_in} ({getattr(hook, '__qualname__', hook)!r}) that "
                        "precompile does not recognise: it supports tensor parallel's ParallelStyles "
                        "(ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput/Output) and "
                        "fully_shard. Run this model eagerly or with torch.compile"
                    )
    return found


def shard_spec(where: str, param: Any) -> ShardSpec:
    """A tensor parallel parameter's ShardSpec; refuse what one artifact for every rank cannot hold."""
    dtensor = sys.modules["torch.distributed.tensor"]
    mesh, placements = param.device_mesh, tuple(param.placements)
    if mesh.ndim != 1:
        raise PrecompileError(
            f"{where} is a DTensor on a {mesh.ndim}-D device mesh {tuple(mesh.shape)} that no fully_shard "
            "manages: precompile supports tensor parallel on a 1-D mesh, and fully_shard over it on a 2-D mesh"
        )
    group = mesh.get_group()
    for placement in placements:
        if not isinstance(placement, (dtensor.Shard, dtensor.Replicate)):
            raise PrecompileError(
                f"{where} is a DTensor placed {placements}: precompile supports parameters placed Shard(d) or "
                "Replicate() only"
            )
        if isinstance(placement, dtensor.Shard) and param.shape[placement.dim] % group.size():
            raise PrecompileError(
                f"{where} has {param.shape[placement.dim]} entries in dim {placement.dim} over {group.size()} "
                "ranks: its shards differ in size from rank to rank, and one artifact serves every rank; "
                "precompile supports dims that divide evenly (pad the layer, or change its size)"
            )
    return ShardSpec(
        shape=tuple(param.shape),
        world_size=group.size(),
        group_name=group.group_name,
        placements=tuple(map(repr, placements)),
        gathered=False,
        mesh_ranks=runtime.root_mesh_ranks(mesh),
    )


def local_layout(where: str, param: Any) -> tuple[tuple[int, ...], Any, tuple]:
    """(local shape, mesh, placements) of tensor parallel's DTensor for ``param``: itself on a
    1-D mesh; on fully_shard's 2-D mesh, what the graph gathers over fully_shard's dim, on
    the second dim's mesh (named, so that it can be sliced out)."""
    mesh, placements = param.device_mesh, tuple(param.placements)
    if mesh.ndim == 1:
        return tuple(getattr(param, runtime.DTENSOR_LOCAL).shape), mesh, placements
    parallel_mesh, placement = mesh[mesh.mesh_dim_names[1]], placements[1]
    shape = list(param.shape)
    if placement.is_shard():
        if shape[placement.dim] % parallel_mesh.size():
            raise PrecompileError(
                f"{where} has {shape[placement.dim]} entries in dim {placement.dim} over {parallel_mesh.size()} "
                "tensor parallel ranks: its shards differ in size from rank to rank, and one artifact serves "
                "every rank; precompile supports dims that divide evenly (pad the layer, or change its size)"
            )
        shape[placement.dim] //= parallel_mesh.size()
    return tuple(shape), parallel_mesh, (placement,)


def local_shard(param: Any) -> torch.Tensor:
    """What capture lifts for a tensor parallel parameter: its local shard, with the
    parameter's requires_grad."""
    return getattr(param, runtime.DTENSOR_LOCAL).detach().requires_grad_(param.requires_grad)


class GradientPlacements:
    """While fn is traced: the placements each DTensor parameter's gradient arrives with,
    which eager's ``.grad`` has.  A Replicate parameter computed with sharded activations
    (SequenceParallel's norms) gets a ``Partial(sum)`` gradient: each rank's local part is
    passed to the traced shard as it is (relabelled, so that DTensor does not all-reduce it
    on the way), and recorded (``ShardSpec.grad_placements``); other placements are refused."""

    def __init__(self):
        self.arrived: dict = {}  # where -> placements, where they differ from the parameter's
        self.refused: list = []

    def as_dtensor(self, where: str, local: torch.Tensor, param: Any, layout: tuple) -> Any:
        """``param`` as fn sees it in the trace: tensor parallel's DTensor over the traced
        ``local`` shard (on fully_shard's 2-D mesh, the one gathered over its first dim), as
        ``local_layout`` gave it before the trace (slicing a mesh computes with tensors)."""
        dtensor, (_, mesh, expected) = type(param), layout
        traced = dtensor.from_local(local, mesh, expected, run_check=False, shape=param.shape, stride=param.stride())
        if traced.requires_grad:
            # A Partial gradient reaches a 1-D parameter's own shard; fully_shard's gather would reduce it.
            partial_ok = param.device_mesh.ndim == 1

            def arriving(grad: Any) -> Any:
                placements = tuple(grad.placements)
                if placements == expected:
                    return grad
                if not partial_ok or not all(p.is_replicate() and q.is_partial() for p, q in zip(expected, placements)):
                    self.refused.append((where, placements, expected))
                    return grad
                self.arrived[where] = placements
                return dtensor.from_local(
                    getattr(grad, runtime.DTENSOR_LOCAL), mesh, expected, run_check=False,
                    shape=param.shape, stride=param.stride(),
                )

            traced.register_hook(arriving)
        return traced

    def refuse_mismatch(self) -> None:
        if self.refused:
            where, got, expected = self.refused[0]
            raise PrecompileError(
                f"{where}'s gradient is placed {got}, the parameter {expected}: precompile supports gradients "
                "placed like their parameters, or Partial(sum) for a Replicate one. Parallelize the model so "
                "that the gradient follows the parameter's placement"
            )

    def spec(self, where: str, spec: ShardSpec) -> ShardSpec:
        """``spec`` with the placements its gradient arrived with, where they differ."""
        placements = self.arrived.get(where)
        return spec if placements is None else spec._replace(grad_placements=tuple(map(repr, placements)))


# What the stand-in of each functional collective DTensor's redistribution runs returns: a
# tensor of the result's shape.  Their schemas are the collectives' own
# (compat.TENSOR_PARALLEL_COLLECTIVES), so use_collectives only retargets them.
_STAND_IN_RESULTS = {
    "all_reduce": lambda input, *_: input.clone(),
    "all_gather_into_tensor": lambda input, group_size, _: input.repeat(group_size, *[1] * (input.dim() - 1)),
    "reduce_scatter_tensor": lambda input, _, group_size, __: input[: input.shape[0] // group_size].clone(),
    "all_to_all_single": lambda input, output_split_sizes, *_: input.new_zeros((sum(output_split_sizes), *input.shape[1:])),
    "wait_tensor": lambda tensor: tensor.clone(),
}
_LIBRARY: list = []  # the stand-ins' torch.library.Library, kept alive


@functools.cache
def _stand_ins() -> dict:
    """{functional collective: stand-in} for the trace.  make_fx runs every op it records,
    and capture must not run a collective: the other ranks do not join it."""
    namespace = torch.ops.precompile_tp
    if not hasattr(namespace, "wait_tensor"):  # defined once per process (another copy of this module)
        library = torch.library.Library("precompile_tp", "DEF")
        for name, schema in compat.TENSOR_PARALLEL_COLLECTIVES.items():
            library.define(name + schema)
            compute = _STAND_IN_RESULTS[name]
            for key in ("CompositeExplicitAutograd", "Meta"):
                library.impl(name, compute, key)
        _LIBRARY.append(library)
    return {op: getattr(namespace, name).default for name, op in compat.tensor_parallel_collectives().items()}


def stand_in(func: Any) -> Any:
    """The stand-in the trace records for the functional collective ``func``, or None."""
    return _stand_ins().get(func)


def use_collectives(graph: torch.fx.GraphModule) -> None:
    """Retarget the trace's stand-ins to the functional collectives they stand for."""
    collectives = {stand_in: collective for collective, stand_in in _stand_ins().items()}
    changed = False
    for node in graph.graph.nodes:
        if node.op == "call_function" and node.target in collectives:
            node.target, changed = collectives[node.target], True
    if changed:
        graph.recompile()


class _Coordinate(tuple):
    """This process's coordinate in a mesh, as ``DeviceMesh.get_coordinate`` gives it while fn
    is traced: DTensor's code may ask whether it is None (is this rank in the mesh, the same
    answer on every rank), but reading a rank from it is refused (``_refuse_rank_read``)."""

    def __getitem__(self, index: Any) -> Any:
        _refuse_rank_read("get_coordinate()[...]", self.user_line())

    def __iter__(self) -> Any:
        _refuse_rank_read("get_coordinate()", self.user_line())

    __reversed__ = __contains__ = __eq__ = __ne__ = __hash__ = index = count = __iter__
    user_line: Callable[[], str]  # set by rank_unread


def _refuse_rank_read(read: str, user_line: str) -> None:
    caller = sys._getframe(2)
    raise PrecompileError(
        f"fn's trace reads this process's rank{user_line} (DeviceMesh.{read}, in {caller.f_code.co_name} at "
        f"{caller.f_code.co_filename}:{caller.f_lineno}): DTensor computes from it a sharded embedding's "
        "offsets, a random op's, an uneven shard's size or the chunk a Replicate to Shard redistribution "
        "keeps, so the graph would be this rank's, and one artifact serves every rank. precompile does not "
        "support such layers under tensor parallel yet: keep them out of the parallelize plan, or pass their "
        "input already sharded"
    )


@contextlib.contextmanager
def rank_unread(user_line: Callable[[], str]):
    """While fn is traced: refuse DTensor's code reading this process's rank for an answer
    that differs from rank to rank (the graph would bake this rank's offsets or chunk, and one
    artifact serves every rank).  ``get_coordinate`` gives a ``_Coordinate``; the reads that
    give the rank itself pass only where ``compat.rank_read_is_rank_independent`` says so.
    ``user_line()``: " at file:line (code)" of fn's line that is running, for the message.
    The wrappers are process-global for the trace; other threads' reads pass through."""
    mesh_class = sys.modules["torch.distributed.device_mesh"].DeviceMesh
    saved = {name: getattr(mesh_class, name) for name in compat.MESH_RANK_READS if hasattr(mesh_class, name)}
    tracing_thread = threading.get_ident()

    def checked(name: str, read: Any) -> Any:
        @functools.wraps(read)
        def rank_read(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != tracing_thread:
                return read(*args, **kwargs)
            if name == "get_coordinate":
                coordinate = read(*args, **kwargs)
                if coordinate is None:
                    return None
                coordinate = _Coordinate(coordinate)
                coordinate.user_line = user_line
                return coordinate
            if not compat.rank_read_is_rank_independent(sys._getframe(1)):
                _refuse_rank_read(f"{name}()", user_line())
            return read(*args, **kwargs)

        return rank_read

    try:
        for name, read in saved.items():
            setattr(mesh_class, name, checked(name, read))
        yield
    finally:
        for name, read in saved.items():
            setattr(mesh_class, name, read)
