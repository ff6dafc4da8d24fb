"""DistributedDataParallel arguments at capture (Note [precompile programming model], invariant 16).

A DDP-wrapped model is a module argument like any other: its parameters and
buffers (``module.<name>``) are lifted, and at every call the driver checks the
DDP object against the ``DataParallelSpec`` recorded here
(``runtime.check_data_parallel``).  What DDP does around the model is traced
instead of run:

- its forward is the wrapped module's, after broadcasting the module's
  buffers from rank 0 where DDP would (``broadcast_buffers``, only while the
  previous forward synchronized gradients); it records whether this forward
  synchronizes gradients (grad mode and ``require_backward_grad_sync``, which
  ``ddp.no_sync()`` clears), as DDP decides at forward;
- its reducer: a post-accumulate-grad hook on each traced parameter collects
  the gradients in the order backward produces them (the order DDP rebuilds
  its buckets to after the first iteration), into buckets of DDP's sizes.
  Each full bucket is scaled by 1/world size (DDP divides before summing)
  into one flat tensor (one dtype per bucket, as DDP's) and all-reduced with
  one functional collective, launched there and waited
  on when backward ends, so the all-reduce of early buckets overlaps the rest
  of backward; then each parameter's ``.grad`` is the average, as DDP's
  reducer leaves it, before anything after ``backward()`` (an optimizer step)
  reads it.

DDP's own forward, reducer and hooks never run, neither at capture nor at a
call: the artifact does the all-reduce.  Capture runs no collective either:
rank 0 precompiles alone.  The trace calls stand-in ops that compute nothing
(``_stand_in_ops``) and ``use_collectives`` turns them into the functional
collectives afterwards, so the graph communicates when it runs.
"""

import contextlib
import dataclasses
import functools
from typing import Any

import torch

from . import _precompile_compat as compat, _precompile_fsdp as fsdp, _precompile_runtime as runtime
from ._precompile_schema import DataParallelSpec, PrecompileError


@dataclasses.dataclass
class DataParallelArgument:
    module_index: int  # into the module arguments
    where: str  # "args[i]"
    ddp: Any
    spec: DataParallelSpec
    parameters: list  # (fqn, lifted index) of each parameter DDP reduces, in parameter order
    buffers: list  # lifted index of each buffer the graph broadcasts before forward


def refuse_sharded_wrappers(where: str, module: torch.nn.Module) -> None:
    """FSDP1 (FullyShardedDataParallel) anywhere, and DDP below the top.  (A module
    fully_shard sharded, FSDP2, is an FSDP class too: ``_precompile_fsdp`` checks it.)"""
    for path, sub in module.named_modules():
        name = f"{where}.{path}" if path else where
        if fsdp.is_fully_shard_module(sub):
            continue
        if any(k.__module__.startswith("torch.distributed.fsdp") for k in type(sub).__mro__):
            raise PrecompileError(
                f"{name} is a {type(sub).__name__} (FSDP1), which precompile does not support: shard the model "
                "with torch.distributed.fsdp.fully_shard (FSDP2) instead, or wrap it in "
                "torch.nn.parallel.DistributedDataParallel"
            )
        if path and runtime.is_data_parallel(sub):
            raise PrecompileError(
                f"{name} is a DistributedDataParallel inside another module: pass the DDP-wrapped model "
                "itself as fn's argument"
            )


def data_parallel_argument(module_index: int, where: str, ddp: Any, lifted: list) -> DataParallelArgument:
    """Record a DDP argument's settings; refuse what the artifact cannot reproduce."""
    import torch.distributed as dist

    if ddp.process_group is not dist.group.WORLD:
        raise PrecompileError(
            f"{where}.process_group is not the default process group: the artifact all-reduces over "
            "the default group only; construct DDP without process_group / device_mesh"
        )
    if ddp.mixed_precision is not None:
        raise PrecompileError(
            f"{where} uses DDP's mixed_precision, which is not supported: use torch.autocast inside fn instead"
        )
    hook = runtime.data_parallel_comm_hook(ddp)
    if hook not in (None, "allreduce_hook"):
        raise PrecompileError(
            f"{where} has the comm hook {hook}, which the artifact cannot run: only DDP's default averaging "
            "and torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook are supported; "
            "remove the hook (construct DDP again)"
        )
    values = vars(ddp)
    has_buffers = any(e.kind == "buffer" and e.names[0][0] == module_index for e in lifted)
    broadcast_buffers = has_buffers and runtime.data_parallel_buffer_sync(ddp)[1]
    if broadcast_buffers and not (values["require_backward_grad_sync"] and values["require_forward_param_sync"]):
        raise PrecompileError(
            f"{where}: DDP broadcasts this model's buffers before a forward only when the previous forward "
            "synchronized gradients, which a step captured inside no_sync() (or after one) cannot reproduce; "
            "construct DDP with broadcast_buffers=False (from torch 2.13 forward_sync_buffers=False) for "
            "gradient accumulation with buffers"
        )
    ignored = {f"module.{name}" for name in ddp.parameters_to_ignore}
    owned = [(index, entry) for index, entry in enumerate(lifted) if entry.names[0][0] == module_index]
    parameters = [
        (entry.names[0][1], index)
        for index, entry in owned
        if entry.kind == "parameter" and entry.tensor.requires_grad and entry.names[0][1] not in ignored
    ]
    reduced = runtime.data_parallel_reduced(ddp)
    averaged, requiring = {f"module.{name}" for name in reduced}, {fqn for fqn, _ in parameters}
    changed = [
        f"{', '.join(names[:5])} {why}"
        for names, why in (
            ([f"module.{name}" for name in reduced if f"module.{name}" not in requiring],
             "frozen since (eager DDP's reducer waits for their gradients)"),
            ([fqn for fqn, _ in parameters if fqn not in averaged], "unfrozen since (eager DDP leaves their gradients local)"),
        )
        if names
    ]
    if changed:
        raise PrecompileError(
            f"{where}: DDP averages the gradients of the parameters that required grad when it was constructed; "
            f"{'; '.join(changed)}: set requires_grad before wrapping the model in DDP, and keep ddp.module "
            "(construct DDP again)"
        )
    spec = DataParallelSpec(
        world_size=ddp.process_group.size(),
        group_name=ddp.process_group.group_name,
        grad_sync=bool(values["require_backward_grad_sync"]),
        find_unused_parameters=bool(values["find_unused_parameters"]),
        static_graph=bool(values["static_graph"]),
        gradient_as_bucket_view=bool(ddp.gradient_as_bucket_view),
        bucket_cap_bytes=int(ddp.bucket_bytes_cap),
        comm_hook=hook,
        broadcast_buffers=broadcast_buffers,
        reduced=reduced,
        ignored=tuple(sorted(ddp.parameters_to_ignore)),
    )
    runtime.check_data_parallel(where, ddp, spec, has_buffers)  # what a call would refuse
    buffers = [
        index for index, entry in owned if broadcast_buffers and entry.kind == "buffer" and entry.names[0][1] not in ignored
    ]
    return DataParallelArgument(module_index, where, ddp, spec, parameters, buffers)


class _TracedDataParallel:
    """One DDP argument while fn is traced: its forward and its gradient reduction."""

    def __init__(self, argument: DataParallelArgument, leaves: list, buffers: list):
        self.argument = argument
        self.leaves = leaves  # the traced parameters DDP reduces
        self.buffers = buffers  # the traced buffers broadcast before forward
        spec = argument.spec
        # allreduce_hook divides the bucket; DDP's reducer multiplies by 1/world size.
        self.scale = (lambda g: g / spec.world_size) if spec.comm_hook else (lambda g: g * (1.0 / spec.world_size))
        self.first_cap = min(compat.first_bucket_bytes(), spec.bucket_cap_bytes)
        self.sync = False  # the last forward asked for a gradient all-reduce, not yet done
        self.forward_param_sync = True  # DDP's require_forward_param_sync (True at capture, checked at calls)
        self.ready, self.bucket, self.bucket_bytes, self.launched = [], [], 0, []
        self.error = None

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        ddp = self.argument.ddp
        if self.forward_param_sync:
            _, broadcast, wait = _stand_in_ops()
            for buffer in self.buffers:  # in place: the artifact writes the module's buffers
                buffer.copy_(wait(broadcast(buffer, 0, self.argument.spec.group_name)))
        asks = torch.is_grad_enabled() and vars(ddp)["require_backward_grad_sync"]
        # A forward that does not ask (no_grad: a teacher's targets; no_sync()) leaves an earlier
        # forward's reduction pending, as DDP's reducer does (only a forward that asks prepares it).
        self.sync = self.sync or asks
        self.forward_param_sync = asks  # as DDP's _post_forward sets it
        return ddp.module(*inputs, **kwargs)

    def on_gradient(self, param: torch.Tensor) -> None:
        if not self.sync:  # no_sync(): gradients accumulate locally
            return
        if not self.ready:
            compat.queue_backward_callback(self.finish)
        self.ready.append(param)
        if self.bucket and param.dtype != self.bucket[0].dtype:  # a bucket is one flat tensor, as DDP's
            self.launch()
        self.bucket.append(param)
        self.bucket_bytes += param.numel() * param.element_size()
        if self.bucket_bytes >= (self.argument.spec.bucket_cap_bytes if self.launched else self.first_cap):
            self.launch()

    def launch(self) -> None:
        """All-reduce the bucket's gradients as one flat tensor (Inductor writes them into it
        where they are computed; gloo's coalesced all-reduce would copy them in and out)."""
        if self.bucket:
            all_reduce, _, _ = _stand_in_ops()
            flat = torch.cat([self.scale(p.grad).reshape(-1) for p in self.bucket])
            self.launched.append((self.bucket, all_reduce(flat, self.argument.spec.group_name)))
            self.bucket, self.bucket_bytes = [], 0

    def finish(self) -> None:
        """End of backward: launch the last bucket, wait for all, write the averages to .grad."""
        self.launch()
        _, _, wait = _stand_in_ops()
        spec = self.argument.spec
        for params, reduced in self.launched:
            flat, offset = wait(reduced), 0
            for param in params:
                param.grad = _gradient(param, flat[offset : offset + param.numel()], spec.gradient_as_bucket_view)
                offset += param.numel()
        ready = {id(p) for p in self.ready}
        unused = [fqn for (fqn, _), leaf in zip(self.argument.parameters, self.leaves) if id(leaf) not in ready]
        if unused and not (spec.find_unused_parameters or spec.static_graph) and self.error is None:
            self.error = PrecompileError(
                f"{self.argument.where}: backward produced no gradient for {', '.join(unused[:5])}; eager DDP "
                "fails on the next iteration (its reducer waits for them): construct DDP with "
                "find_unused_parameters=True, or leave those parameters out of the model"
            )
        self.sync, self.ready, self.launched = False, [], []


def _gradient(param: torch.Tensor, segment: torch.Tensor, as_view: bool) -> torch.Tensor:
    """A parameter's averaged gradient from its segment of the flat bucket, with the
    parameter's strides (AccumulateGrad's layout, which DDP keeps).

    A tensor of its own, as DDP's reducer copies each gradient out of its
    bucket; with ``gradient_as_bucket_view`` a view of the segment, as DDP's
    ``.grad`` is a view of its bucket (where the strides allow).  Inductor
    turns the copy into a view (Note invariant 16).
    """
    grad = segment.view(param.shape)
    if not as_view or grad.stride() != param.stride():
        grad = torch.empty_like(param, memory_format=torch.preserve_format).copy_(grad)
    return grad


@functools.cache
def _stand_in_ops() -> tuple[Any, Any, Any]:
    """``(all_reduce(tensor, group_name), broadcast(tensor, src, group_name), wait(tensor))``
    for the trace: they return copies.

    The graph needs the functional collectives, but capture must not run one
    (it would wait for ranks that are not there), and make_fx runs every op
    it records.  These ops trace as nodes of their own that ``use_collectives``
    retargets: ``_c10d_functional.all_reduce(tensor, "sum", group_name)``,
    ``broadcast`` and ``wait_tensor``.
    """
    namespace = torch.ops.precompile_ddp
    if not hasattr(namespace, "all_reduce"):  # registered once per process (another copy of this module)

        @torch.library.custom_op("precompile_ddp::all_reduce", mutates_args=())
        def all_reduce(tensor: torch.Tensor, group_name: str) -> torch.Tensor:
            return tensor.clone()

        @torch.library.custom_op("precompile_ddp::broadcast", mutates_args=())
        def broadcast(tensor: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
            return tensor.clone()

        @torch.library.custom_op("precompile_ddp::wait", mutates_args=())
        def wait(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.clone()

        all_reduce.register_fake(lambda tensor, group_name: torch.empty_like(tensor))
        broadcast.register_fake(lambda tensor, src, group_name: torch.empty_like(tensor))
        wait.register_fake(lambda tensor: torch.empty_like(tensor))
    return namespace.all_reduce.default, namespace.broadcast.default, namespace.wait.default


def use_collectives(graph: torch.fx.GraphModule) -> None:
    """Retarget the trace's stand-in ops to the functional collectives they stand for."""
    stand_in_all_reduce, stand_in_broadcast, stand_in_wait = _stand_in_ops()
    all_reduce, broadcast, wait = compat.data_parallel_collectives()
    retarget = {stand_in_broadcast: broadcast, stand_in_wait: wait}  # same arguments
    changed = False
    for node in graph.graph.nodes:
        if node.target is stand_in_all_reduce:
            tensor, group_name = node.args
            node.target, node.args = all_reduce, (tensor, "sum", group_name)
            changed = True
        elif node.target in retarget:
            node.target = retarget[node.target]
            changed = True
    if changed:
        graph.recompile()


@contextlib.contextmanager
def traced_data_parallel(arguments: list, state: tuple):
    """While fn runs: each DDP's forward is its module's, and backward averages its gradients."""
    traced, handles = [], []
    try:
        for argument in arguments:
            leaves = [state[index] for _, index in argument.parameters]
            reducer = _TracedDataParallel(argument, leaves, [state[index] for index in argument.buffers])
            traced.append(reducer)
            # An instance attribute, bypassing nn.Module.__setattr__ (no submodule registered).
            object.__setattr__(argument.ddp, "forward", reducer.forward)
            handles += [leaf.register_post_accumulate_grad_hook(reducer.on_gradient) for leaf in leaves]
        yield
    finally:
        for handle in handles:
            handle.remove()
        for argument in arguments:
            vars(argument.ddp).pop("forward", None)
    for reducer in traced:
        if reducer.error is not None:
            raise reducer.error
        if reducer.buffers and not reducer.forward_param_sync:
            raise PrecompileError(
                f"{reducer.argument.where}: fn's last DDP forward does not synchronize gradients (no_sync() or "
                "no_grad(), e.g. an evaluation step), after which DDP skips its next buffer broadcast; the "
                "artifact cannot reproduce that: evaluate through the wrapped module (ddp.module(x)), or "
                "construct DDP with broadcast_buffers=False (from torch 2.13 forward_sync_buffers=False)"
            )
