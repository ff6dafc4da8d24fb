"""torch.compiler.precompile: ahead-of-time capture of a whole computation.

Note [precompile programming model]
===================================

``precompile(fn, *example_inputs)`` captures ``fn`` -- the whole computation,
taking its model(s) as explicit arguments -- into ``(python_code, cache)``;
``precompile.load(python_code, cache)`` turns the pair back into a runnable
with fn's calling convention.  The contract, invariant by invariant; each
says who guarantees it and, where it is enforced, which tests (in
``test/``) prove it:

1. Modules are arguments, not state.  Every ``nn.Module`` argument has its
   parameters and buffers lifted to graph inputs (parameters of all modules,
   then buffers; tied tensors collapse to one input by identity), so the
   artifact holds no weights and the model is passed again at every call.
   Enforced at every call: module positions, parameter/buffer names, shapes,
   dtypes, devices and tying (test_precompile.py TestRuntimeChecks,
   TestCapture; test_precompile_zoo.py TestNoWeightsLeave).
2. No live state.  A tensor fn reads that is neither derived from its
   arguments nor created inside fn (a global, a captured local, an
   unregistered module attribute) is refused at capture; tensor literals
   created inside fn are code and are baked bit-exactly.  Enforced
   (TestCaptureContract).
3. Specialization.  Capture is a non-strict make_fx trace: Python control
   flow follows the example inputs, and every size, dtype and device is baked
   and checked at every call; Inductor also specializes on strides (except
   size-1 dims and empty tensors).  Non-tensor input leaves are baked and a
   different value is refused.  The one exception: a user-input dim marked
   with ``mark_unbacked`` (inductor only) is an unbacked symint -- its bounds
   and the equalities the graph needs between marked dims are checked at
   every call, and a graph that guards on it is refused at capture.
   Enforced (TestRuntimeChecks, TestFreeDims, test_precompile_fuzz.py).
4. The whole step.  If fn calls ``.backward()``, forward and backward are one
   graph; the runnable accumulates parameter gradients onto the runtime
   model's ``.grad`` exactly like eager (assign when None, else add).  Which
   parameters receive a gradient is fixed at capture.  A buffer or user input
   that would receive a gradient is refused.  The runnable's outputs carry no
   autograd history: backward must happen inside fn.  Enforced (TestTraining,
   test_precompile_zoo.py).
5. Side effects.  Effectful ops and control-flow higher-order ops are refused
   at capture, and so is rebinding a module attribute instead of updating it
   in place; in-place updates of buffers and inputs (BatchNorm running stats)
   are part of the graph and happen at every call.  Enforced
   (TestCaptureContract, TestCapture).
6. The code is the contract.  ``python_code`` is self-contained (it runs with
   only torch installed, compiling kernels on first use) and is the single
   source of truth for the calling convention; ``cache`` only accelerates and
   is bound to the code by its sha256, its payload by another.  Enforced
   (TestArtifact, TestLoad, test_precompile_fuzz.py TestFuzzLoad).
7. Trust.  ``load`` executes ``python_code`` and loads compiled kernels from
   ``cache``: only load pairs you trust.  It reads the calling convention with
   ``ast`` and the cache with ``torch.load(weights_only=True)`` before
   executing anything, and warns at every load (TestLoad).  Trusting the
   pair is the caller's responsibility.
8. Capture has no side effects on the caller.  ``precompile`` traces on
   clones, so the caller's parameters, buffers, ``.grad`` and inputs are
   bit-identical afterwards, also when fn raises (TestCaptureContract); an
   optimizer argument's param_groups and state too (invariant 11).
   Caller's responsibility: fn must not write tensors other than its
   arguments (e.g. an optimizer that is not an argument of fn).
9. Kernels are machine code.  Cached kernels load only when the cache's build
   environment (torch, Python, platform, CPU capability) equals this
   process's; otherwise ``load`` warns once and compiles from python_code.
   Warm loads run no compiler and import neither ``torch._inductor`` nor
   ``torch._dynamo`` (TestInductorCache).
10. Threads.  An inference runnable may be called from several threads at
   once (test_precompile_concurrency.py); a training step writes ``.grad``
   and must not run concurrently on the same model: caller's responsibility.
11. Optimizers are arguments, not state.  A ``torch.optim`` SGD, Adam or
   AdamW argument is lifted like a module: its param groups map onto the
   lifted parameters by identity (an optimizer over any other tensor is
   refused), and its state tensors (momentum_buffer; step, exp_avg,
   exp_avg_sq, max_exp_avg_sq) are graph inputs updated in place, so the
   artifact holds no optimizer state and ``opt.step()`` inside fn is part of
   the one graph.  Capture points the optimizer's param_groups and state at
   the traced leaves and clones while fn runs, then restores them.
   Hyperparameters: ``lr`` is a 0-dim float64 graph input read from the
   runtime optimizer at every call (LR schedulers work without re-capture);
   every other group key in ``opt.defaults`` (momentum, betas, eps,
   weight_decay, foreach, maximize, ...) is baked and a different runtime
   value is refused, naming the group and key.  State missing at a call (a
   fresh optimizer) is created as eager's first step would (zeros, ``step``
   0), and the graph computes eager's first-step values from it; a parameter
   that gets no gradient gets no state.  Adam/AdamW trace their capturable
   formulation and foreach SGD multiplies then adds, so results equal eager's
   within float noise (single-tensor SGD on backend='eager': bit-exact).
   With an optimizer argument the incoming ``.grad`` is a graph input too
   (fn's backward accumulates onto it in the graph, or fn's zero_grad drops
   it) and the runnable assigns the resulting ``.grad``.  Refused at capture:
   other optimizer classes, fused / capturable / differentiable, SGD
   dampening, tensor hyperparameters, step hooks, per-group state layouts that
   differ, and free dims.  Checked at every call: class, number of groups,
   the parameters (identity against the runtime modules'), baked values,
   state keys, shapes, dtypes and layout (test_precompile_optimizer.py).
"""

if __name__ == "__main__":
    # `python -m torch._precompile inspect ...`: dispatch before this file runs
    # as a second copy of the module (runpy's __main__), which would re-import it.
    import sys

    from torch._precompile_inspect import main

    sys.exit(main(sys.argv[1:]))


import ast
import collections
import contextlib
import dataclasses
import functools
import hashlib
import inspect
import io
import logging
import os
import platform
import pprint
import re
import sys
import tempfile
import threading
import time
import traceback
import warnings
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import _precompile_runtime as runtime
from torch._precompile_runtime import (
    CallingConvention,
    ConstantSpec,
    LeafSpec,
    ModuleSpec,
    OptimizerSpec,
    PrecompileError,
    StateSpec,
    TensorSpec,
)


__all__ = ["precompile", "PrecompileError"]

log = logging.getLogger(__name__)

CACHE_FORMAT = "torch.compiler.precompile"
# Version of the artifact layout and of its CallingConvention record.
FORMAT_VERSION = 1
BACKENDS = ("inductor", "eager")
TRACERS = ("make_fx", "dynamo")


# ---------------------------------------------------------------------------
# Capture: lift module state, trace fn with make_fx on clones.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _LiftedTensor:
    tensor: torch.Tensor  # the caller's tensor (never written)
    kind: str  # "parameter" | "buffer"
    names: list  # [(module index, fqn), ...]


@dataclasses.dataclass
class _Arguments:
    """fn's example arguments: module positions, lifted state, user-input leaves."""

    example_inputs: tuple
    module_positions: list
    modules: list
    user_positions: list
    lifted: list  # [_LiftedTensor]
    input_leaves: list
    input_spec: pytree.TreeSpec
    input_paths: list  # "args[1]['x']" per input leaf
    tensor_indices: list  # input leaves that are tensors
    optimizers: list = dataclasses.field(default_factory=list)  # [_LiftedOptimizer]


@dataclasses.dataclass
class _FreeDim:
    """A user-input dim marked with mark_unbacked (Note invariant 3)."""

    leaf: int  # index into input_leaves
    dim: int
    low: int
    high: int | None
    shape_id: str | None


@dataclasses.dataclass
class _Capture:
    graph: torch.fx.GraphModule
    convention: CallingConvention
    example_inputs: list  # flat graph inputs: real clones, or fakes when dims are free


def _lift_state(modules: list) -> list:
    """Parameters of all modules, then buffers; tied tensors collapse by identity."""
    lifted: dict[int, _LiftedTensor] = {}
    for kind, named in (
        ("parameter", lambda m: m.named_parameters(remove_duplicate=False)),
        ("buffer", lambda m: m.named_buffers(remove_duplicate=False)),
    ):
        for index, module in enumerate(modules):
            for fqn, tensor in named(module):
                entry = lifted.setdefault(id(tensor), _LiftedTensor(tensor, kind, []))
                entry.names.append((index, fqn))
    return list(lifted.values())


def _split_arguments(example_inputs: tuple) -> _Arguments:
    module_positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.nn.Module)]
    modules = [example_inputs[i] for i in module_positions]
    optimizer_positions = [i for i, a in enumerate(example_inputs) if isinstance(a, torch.optim.Optimizer)]
    user_positions = [
        i for i in range(len(example_inputs)) if i not in module_positions and i not in optimizer_positions
    ]
    user_args = tuple(example_inputs[i] for i in user_positions)
    input_leaves, input_spec = pytree.tree_flatten(user_args)
    input_paths = [
        f"args[{user_positions[path[0].idx]}]{pytree.keystr(path[1:])}"
        for path, _ in pytree.tree_flatten_with_path(user_args)[0]
    ]
    for what, leaf in zip(input_paths, input_leaves):
        if not isinstance(leaf, torch.Tensor):
            _check_value_leaf(what, leaf)
    lifted = _lift_state(modules)
    return _Arguments(
        example_inputs=example_inputs,
        module_positions=module_positions,
        modules=modules,
        user_positions=user_positions,
        lifted=lifted,
        input_leaves=input_leaves,
        input_spec=input_spec,
        input_paths=input_paths,
        tensor_indices=[i for i, leaf in enumerate(input_leaves) if isinstance(leaf, torch.Tensor)],
        optimizers=[_lift_optimizer(i, example_inputs[i], lifted) for i in optimizer_positions],
    )


def _tensor_spec(t: torch.Tensor, backend: str, free_dims: tuple = ()) -> TensorSpec:
    free = {dim for dim, *_ in free_dims}
    return TensorSpec(
        shape=tuple(None if d in free else size for d, size in enumerate(t.shape)),
        # Free dims: strides vary with the size, so the layout is pinned as contiguous.
        stride=tuple(t.stride()) if backend == "inductor" and not free else None,
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
        free_dims=tuple(free_dims),
        contiguous=bool(free),
    )


def _clone_leaf(t: torch.Tensor) -> torch.Tensor:
    # Same strides as the caller's tensor, no autograd history, no .grad.
    clone = t.detach().clone(memory_format=torch.preserve_format)
    return clone.requires_grad_(t.requires_grad)


def _check_value_leaf(what: str, value: Any) -> None:
    if not isinstance(value, runtime.LEAF_VALUE_TYPES):
        raise PrecompileError(
            f"{what}: unsupported leaf of type {type(value).__name__}; inputs and outputs "
            "must be pytrees of tensors, int, float, bool, str or None"
        )


def _read_marks(args: _Arguments, backend: str) -> list:
    """Dims marked with torch._dynamo.decorators.mark_unbacked on the user inputs."""
    for entry in args.lifted:
        if getattr(entry.tensor, "_has_dynamo_dim_marking", False):
            raise PrecompileError(
                f"parameter/buffer '{entry.names[0][1]}' has dynamic-dim marks; only user "
                "inputs can have free dims: remove the marks from the module's tensors"
            )
    free_dims = []
    for index in args.tensor_indices:
        tensor, what = args.input_leaves[index], args.input_paths[index]
        if getattr(tensor, "_dynamo_dynamic_indices", None):
            raise PrecompileError(
                f"{what}: dims {sorted(tensor._dynamo_dynamic_indices)} are marked with "
                "mark_dynamic (backed), which precompile does not support; use "
                "torch._dynamo.decorators.mark_unbacked instead"
            )
        marked = set(getattr(tensor, "_dynamo_unbacked_indices", ())) | set(
            getattr(tensor, "_dynamo_strict_unbacked_indices", ())
        )
        if not marked:
            continue
        if backend != "inductor":
            raise NotImplementedError(
                f"precompile: {what} has dims marked with mark_unbacked; free dims are only "
                "supported by backend='inductor' (backend='eager' specializes every size)"
            )
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            raise PrecompileError(
                f"{what}: mark_unbacked on a tensor subclass ({type(tensor).__name__}) is not "
                "supported; pass a plain torch.Tensor"
            )
        if not tensor.is_contiguous():
            raise PrecompileError(
                f"{what}: an input with marked dims must be contiguous (its strides depend on "
                f"the free sizes); got strides {tuple(tensor.stride())}: pass x.contiguous()"
            )
        bounds = getattr(tensor, "_dynamo_unbacked_bounds", {})
        shape_ids = getattr(tensor, "_dynamo_shape_ids", {})
        for dim in sorted(marked):
            low, high = bounds.get(dim, (None, None))
            free_dims.append(_FreeDim(index, dim, 0 if low is None else low, high, shape_ids.get(dim)))
    return free_dims


def _flat_function(fn: Callable, args: _Arguments, recorded: dict) -> Callable:
    """fn over flat tensors: (*state, *user tensors, *free sizes) -> (*outputs, *grads)."""
    from torch.nn.utils.stateless import _reparametrize_module

    num_state, num_tensors = len(args.lifted), len(args.tensor_indices)
    num_optimizer = len(_optimizer_example_inputs(args))

    def flat_fn(*flat):
        state = flat[:num_state]
        tensors = flat[num_state : num_state + num_tensors]  # free sizes follow, unused
        optimizer_inputs = flat[len(flat) - num_optimizer :]
        leaves = list(args.input_leaves)
        for index, tensor in zip(args.tensor_indices, tensors):
            leaves[index] = tensor
        call_args = list(args.example_inputs)
        for position, arg in zip(args.user_positions, pytree.tree_unflatten(leaves, args.input_spec)):
            call_args[position] = arg
        mappings = [{} for _ in args.modules]
        for entry, leaf in zip(args.lifted, state):
            for index, fqn in entry.names:
                mappings[index][fqn] = leaf
        with contextlib.ExitStack() as stack:
            for module, mapping in zip(args.modules, mappings):
                stack.enter_context(_reparametrize_module(module, mapping))
            if args.optimizers:
                stack.enter_context(_redirect_optimizers(args, state, optimizer_inputs))
            with torch.enable_grad():
                result = fn(*call_args)
            _check_state_not_rebound(args.modules, mappings)
        out_leaves, out_spec = pytree.tree_flatten(result)
        recorded["out_spec"], recorded["out_leaves"] = out_spec, out_leaves
        _check_gradients_reach_only_parameters(args, state, tensors)
        recorded["grad_state"] = [
            i
            for i, (entry, leaf) in enumerate(zip(args.lifted, state))
            if entry.kind == "parameter" and leaf.grad is not None
        ]
        outputs = [leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor)]
        return (*outputs, *[state[i].grad for i in recorded["grad_state"]])

    return flat_fn


def _trace_real(flat_fn: Callable, args: _Arguments, decompositions) -> tuple:
    """Real-mode make_fx on clones: every size is static (Note invariant 3, 8)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [_clone_leaf(e.tensor) for e in args.lifted] + [
        _clone_leaf(args.input_leaves[i]) for i in args.tensor_indices
    ] + _optimizer_example_inputs(args)
    graph = make_fx(flat_fn, decomposition_table=decompositions, record_stack_traces=True)(*inputs)
    graph, constants = _enforce_contract(graph)
    example = [t.detach() for t in inputs] + constants
    return graph, example, (), constants


def _trace_symbolic(flat_fn: Callable, args: _Arguments, free_dims: list, decompositions) -> tuple:
    """Symbolic make_fx with marked dims as unbacked symints (design.md section 2).

    A data-dependent guard ``Eq(a, b)`` between two marked dims whose example
    sizes agree means the graph requires them equal: they are merged into one
    shape group (checked by the driver at every call) and the trace is redone.
    Any other guard on a marked dim is refused.
    """
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    groups = {i: free.shape_id or f"free{i}" for i, free in enumerate(free_dims)}
    for _ in range(len(free_dims) + 1):
        attempt = _SymbolicAttempt(args, free_dims, groups)
        try:
            return attempt.trace(flat_fn, decompositions)
        except GuardOnDataDependentSymNode as error:
            merged = attempt.mergeable(error.cond)
            if merged is None:
                raise attempt.guard_error(error) from None
            keep, drop = merged
            groups = {i: groups[keep] if g == groups[drop] else g for i, g in groups.items()}
    raise AssertionError("unreachable: each retry merges two shape groups")


class _SymbolicAttempt:
    """One symbolic trace: fakes in a fresh ShapeEnv, one symint per marked dim."""

    def __init__(self, args: _Arguments, free_dims: list, groups: dict):
        from torch._dynamo.source import LocalSource
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

        self.args, self.free_dims = args, free_dims
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env)

        def fakify(tensor, name, free=()):
            dims = {f.dim: (i, f) for i, f in free}
            context = StatelessSymbolicContext(
                dynamic_sizes=[
                    DimDynamic.UNBACKED if d in dims else DimDynamic.STATIC for d in range(tensor.dim())
                ],
                shape_ids={d: groups[i] for d, (i, _) in dims.items()},
                unbacked_bounds={d: (f.low, f.high) for d, (_, f) in dims.items()},
            )
            fake = self.fake_mode.from_tensor(tensor.detach(), symbolic_context=context, source=LocalSource(name))
            return fake.requires_grad_(tensor.requires_grad)

        self.inputs = [fakify(e.tensor, f"state{i}") for i, e in enumerate(args.lifted)]
        by_leaf: dict[int, list] = {}
        for i, free in enumerate(free_dims):
            by_leaf.setdefault(free.leaf, []).append((i, free))
        fake_leaves = {}
        for index in args.tensor_indices:
            tensor = args.input_leaves[index]
            fake_leaves[index] = fakify(tensor, f"input{index}", by_leaf.get(index, ()))
            self.inputs.append(fake_leaves[index])
        # Free sizes are graph inputs too: AOTAutograd needs a binding for each symbol.
        self.sizes = [fake_leaves[f.leaf].shape[f.dim] for f in free_dims]
        self.symbols = {size.node.expr: i for i, size in enumerate(self.sizes)}
        self.shape_env.pending_fresh_unbacked_symbols.clear()

    def trace(self, flat_fn: Callable, decompositions) -> tuple:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

        graph = make_fx(
            flat_fn, decomposition_table=decompositions, tracing_mode="symbolic", record_stack_traces=True
        )(*self.inputs, *self.sizes)
        self.refuse_specialization()
        insert_deferred_runtime_asserts(graph, self.shape_env, "torch.compiler.precompile")
        graph.recompile()
        graph, constants = _enforce_contract(graph)
        example = [t.detach() for t in self.inputs] + list(self.sizes) + [
            self.fake_mode.from_tensor(c) for c in constants
        ]
        return graph, example, self.size_sources(), constants

    def describe(self, index: int) -> str:
        free = self.free_dims[index]
        return f"{self.args.input_paths[free.leaf]} dim {free.dim}"

    def refuse_specialization(self) -> None:
        """Every requirement fn put on a free dim must be a mark bound or a shape group."""
        for symbol, index in self.symbols.items():
            replaced = self.shape_env.replacements.get(symbol)
            if replaced is not None and self.shape_env.simplify(replaced) not in self.symbols:
                raise PrecompileError(
                    f"fn specializes {self.describe(index)} (marked with mark_unbacked) to "
                    f"{replaced}, e.g. through .view() with literal sizes; use -1 or sizes derived "
                    "from the input's .shape, or remove the mark"
                )
        for asserts in self.shape_env.deferred_runtime_asserts.values():
            for requirement in asserts:
                if not self.implied_by_marks(requirement.expr):
                    names = [self.describe(i) for s, i in self.symbols.items() if s in requirement.expr.free_symbols]
                    raise PrecompileError(
                        f"fn requires {requirement.expr} of {' and '.join(names) or 'a marked dim'} "
                        "(marked with mark_unbacked); state it in the mark instead (min=/max=) or "
                        "remove the mark"
                    )

    def implied_by_marks(self, expr) -> bool:
        """Equalities between free dims, and bounds the driver already checks."""
        import sympy

        sides = [self.shape_env.simplify(side) for side in getattr(expr, "args", ())]
        if isinstance(expr, sympy.Eq) and all(side in self.symbols for side in sides):
            return True
        if not isinstance(expr, (sympy.LessThan, sympy.GreaterThan, sympy.StrictLessThan, sympy.StrictGreaterThan)):
            return False
        lhs, rhs = sides
        if lhs in self.symbols and rhs.is_Integer:  # symbol OP constant
            symbol, constant, lower = lhs, int(rhs), isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan))
        elif rhs in self.symbols and lhs.is_Integer:  # constant OP symbol
            symbol, constant, lower = rhs, int(lhs), isinstance(expr, (sympy.LessThan, sympy.StrictLessThan))
        else:
            return False
        free = self.free_dims[self.symbols[symbol]]
        strict = isinstance(expr, (sympy.StrictLessThan, sympy.StrictGreaterThan))
        if lower:  # requires size >= constant (+1 if strict)
            return constant + strict <= free.low
        return free.high is not None and free.high <= constant - strict

    def size_sources(self) -> tuple:
        """(leaf, dim, group, low, high) per free size, groups by canonical symbol."""
        canonical = {}
        result = []
        for free, size in zip(self.free_dims, self.sizes):
            symbol = self.shape_env.simplify(size.node.expr)
            group = canonical.setdefault(symbol, len(canonical))
            result.append((free.leaf, free.dim, group, free.low, free.high))
        return tuple(result)

    def mergeable(self, cond) -> tuple | None:
        import sympy

        if not isinstance(cond, (sympy.Eq, sympy.Ne)):
            return None
        lhs, rhs = (self.shape_env.simplify(side) for side in cond.args)
        if lhs not in self.symbols or rhs not in self.symbols:
            return None
        a, b = self.symbols[lhs], self.symbols[rhs]
        example_sizes = [
            self.args.input_leaves[self.free_dims[i].leaf].shape[self.free_dims[i].dim] for i in (a, b)
        ]
        return (a, b) if example_sizes[0] == example_sizes[1] and a != b else None

    def guard_error(self, error) -> PrecompileError:
        names = {
            str(symbol): f"{self.args.input_paths[self.free_dims[i].leaf]} dim {self.free_dims[i].dim}"
            for symbol, i in self.symbols.items()
        }
        involved = [names[str(s)] for s in getattr(error.cond, "free_symbols", ()) if str(s) in names]
        frames = [
            f for f in traceback.extract_tb(error.__traceback__) if os.path.dirname(torch.__file__) not in f.filename
        ]
        where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
        return PrecompileError(
            f"fn needs the size of {' and '.join(involved) or 'a marked dim'} (marked with "
            f"mark_unbacked) to decide {error.cond}{where}: a free dim cannot be guarded on. "
            "Remove the mark to specialize it, or avoid branching on / reshaping with that size"
        )


@contextlib.contextmanager
def _without_mkldnn():
    """Trace nn.LSTM & co. through their cell-by-cell decomposition.

    With MKLDNN enabled, CPU ``aten::lstm`` dispatches to ``aten::mkldnn_rnn_layer``,
    which make_fx records as one op.  Its ``workspace`` output (saved for
    ``mkldnn_rnn_layer_backward``) is undefined when grad mode is off, as it is
    while the driver runs the graph, and its fake kernel reports a (1,)-sized
    workspace that Inductor's size asserts then reject.  The decomposition is
    plain ATen and serves both backends.
    """
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


def _capture(fn: Callable, example_inputs: tuple, backend: str, decompositions) -> _Capture:
    args = _split_arguments(example_inputs)
    free_dims = _read_marks(args, backend)
    if free_dims and args.optimizers:
        raise PrecompileError(
            "an optimizer argument together with mark_unbacked dims is not supported yet: "
            "remove the marks (sizes are then specialized) or keep opt.step() outside fn"
        )
    recorded: dict[str, Any] = {}
    flat_fn = _flat_function(fn, args, recorded)
    with _without_mkldnn():
        if free_dims:
            graph, example, sizes, constants = _trace_symbolic(flat_fn, args, free_dims, decompositions)
        else:
            graph, example, sizes, constants = _trace_real(flat_fn, args, decompositions)
    optimizers, grad_inputs = _finish_optimizer_inputs(graph, example, args, backend)

    outputs, graph_index = [], 0
    for i, leaf in enumerate(recorded["out_leaves"]):
        if isinstance(leaf, torch.Tensor):
            outputs.append(LeafSpec(graph_output=graph_index))
            graph_index += 1
        else:
            _check_value_leaf(f"fn's output leaf {i}", leaf)
            outputs.append(LeafSpec(value=leaf))

    free_by_leaf: dict[int, list] = {}
    for leaf, dim, group, low, high in sizes:
        free_by_leaf.setdefault(leaf, []).append((dim, group, low, high))
    convention = CallingConvention(
        format_version=FORMAT_VERSION,
        backend=backend,
        arity=len(example_inputs),
        modules=tuple(
            ModuleSpec(
                position=position,
                parameters=tuple(n for n, _ in m.named_parameters(remove_duplicate=False)),
                buffers=tuple(n for n, _ in m.named_buffers(remove_duplicate=False)),
            )
            for position, m in zip(args.module_positions, args.modules)
        ),
        state=tuple(
            StateSpec(kind=e.kind, names=tuple(e.names), tensor=_tensor_spec(e.tensor, backend))
            for e in args.lifted
        ),
        input_spec=pytree.treespec_dumps(args.input_spec),
        inputs=tuple(
            LeafSpec(tensor=_tensor_spec(leaf, backend, tuple(free_by_leaf.get(i, ()))))
            if isinstance(leaf, torch.Tensor)
            else LeafSpec(value=leaf)
            for i, leaf in enumerate(args.input_leaves)
        ),
        output_spec=pytree.treespec_dumps(recorded["out_spec"]),
        outputs=tuple(outputs),
        grad_state=tuple(recorded["grad_state"]),
        sizes=tuple((leaf, dim) for leaf, dim, *_ in sizes),
        constants=tuple(_constant_spec(c) for c in constants),
        optimizers=optimizers,
        grad_inputs=grad_inputs,
        assign_grads=bool(optimizers),
    )
    return _Capture(graph, convention, example)


def _check_state_not_rebound(modules: list, mappings: list) -> None:
    # Invariant 5: state updates must be in-place; rebinding an attribute
    # (`self.buf = new`) would be lost when the runnable is called.
    for index, (module, mapping) in enumerate(zip(modules, mappings)):
        for fqn, leaf in mapping.items():
            owner_path, _, name = fqn.rpartition(".")
            owner = module.get_submodule(owner_path)
            if getattr(owner, name, None) is not leaf:
                raise PrecompileError(
                    f"fn rebinds {type(module).__name__} attribute '{fqn}' (module argument {index}) "
                    "instead of updating it in place; the artifact cannot reproduce that: "
                    "write `x.copy_(new)` (or `x.add_(...)`) instead of `self.x = new`"
                )


def _check_gradients_reach_only_parameters(args: _Arguments, state: tuple, tensors: tuple) -> None:
    # Invariant 4: only parameters receive gradients from the runnable.
    for entry, leaf in zip(args.lifted, state):
        if entry.kind == "buffer" and leaf.grad is not None:
            raise PrecompileError(
                f"buffer '{entry.names[0][1]}' would receive a gradient; precompile only "
                "accumulates gradients of parameters: make it an nn.Parameter or set "
                "requires_grad=False on the buffer"
            )
    for index, tensor in zip(args.tensor_indices, tensors):
        if tensor.grad is not None:
            raise PrecompileError(
                f"{args.input_paths[index]} would receive a gradient; precompile only accumulates "
                "gradients of module parameters: pass the input with requires_grad=False "
                "(e.g. x.detach()) or make it a parameter of a module argument"
            )


# ---------------------------------------------------------------------------
# Optimizers as arguments (Note invariant 11): lifted like modules.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _LiftedOptimizer:
    position: int
    optimizer: torch.optim.Optimizer
    cls: str  # key of runtime.OPTIMIZER_STATE_KEYS
    groups: list  # per param group: indices into args.lifted
    hyper: list  # per param group: [(key, baked value)], every default but lr
    keys: tuple  # state keys of one stepped parameter
    state: list  # per (group, param): {key: example tensor} (a clone, or eager's initial state)


_SUPPORTED_OPTIMIZERS = {cls.__name__: cls for cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)}
# Options whose step the trace cannot reproduce; the value is why.
_REFUSED_OPTIONS = {
    "fused": "the fused kernel's rounding differs from the traced step; pass fused=False (backend "
    "'inductor' fuses the update itself)",
    "capturable": "it is for CUDA graphs and eager refuses it on CPU; pass capturable=False (precompile "
    "traces the capturable formulation itself)",
    "differentiable": "a step that builds autograd history cannot be part of the graph; pass differentiable=False",
}


def _lift_optimizer(position: int, optimizer: Any, lifted: list) -> _LiftedOptimizer:
    where = f"args[{position}] (optimizer)"
    cls = type(optimizer).__name__
    if _SUPPORTED_OPTIMIZERS.get(cls) is not type(optimizer):
        raise PrecompileError(
            f"{where}: {type(optimizer).__qualname__} is not supported inside fn (supported: "
            f"{', '.join('torch.optim.' + c for c in _SUPPORTED_OPTIMIZERS)}); keep opt.step() outside "
            "fn and precompile the forward/backward step only"
        )
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks or (
        _global_optimizer_pre_hooks or _global_optimizer_post_hooks
    ):
        raise PrecompileError(f"{where}: step hooks are registered, which the artifact would not run; remove them")
    parameter_index = {id(e.tensor): i for i, e in enumerate(lifted) if e.kind == "parameter"}
    groups, hyper, state, keys = [], [], [], None
    for g, group in enumerate(optimizer.param_groups):
        _check_optimizer_group(where, g, cls, group)
        group_keys = runtime.optimizer_state_keys(cls, group)
        if keys not in (None, group_keys):
            raise PrecompileError(
                f"{where} param_groups[{g}]: its state keys {list(group_keys)} differ from group 0's "
                f"{list(keys)} (momentum / amsgrad per group); use the same options in every group"
            )
        keys = group_keys
        indices = []
        for j, param in enumerate(group["params"]):
            if id(param) not in parameter_index:
                raise PrecompileError(
                    f"{where} param_groups[{g}]['params'][{j}] (shape {tuple(param.shape)}) is not a "
                    "parameter of any module argument of fn; the artifact can only update lifted "
                    "parameters: pass the module that owns it as an argument"
                )
            indices.append(parameter_index[id(param)])
            state.append(_example_optimizer_state(where, g, j, keys, optimizer.state.get(param), param))
        groups.append(indices)
        hyper.append([(key, group[key]) for key in sorted(optimizer.defaults) if key != "lr"])
    return _LiftedOptimizer(position, optimizer, cls, groups, hyper, keys or (), state)


def _check_optimizer_group(where: str, g: int, cls: str, group: dict) -> None:
    for key, why in _REFUSED_OPTIONS.items():
        if group.get(key):
            raise PrecompileError(f"{where} param_groups[{g}][{key!r}]=True is not supported: {why}")
    if cls == "SGD" and group["dampening"] != 0:
        raise PrecompileError(
            f"{where} param_groups[{g}]['dampening']={group['dampening']} is not supported: eager's first "
            "step initializes the momentum buffer without dampening, which one graph cannot reproduce; "
            "use dampening=0 or keep opt.step() outside fn"
        )
    for key, value in group.items():
        if key != "params" and isinstance(value, torch.Tensor):
            raise PrecompileError(
                f"{where} param_groups[{g}][{key!r}] is a Tensor; pass a Python float (lr becomes a graph "
                "input; other hyperparameters are baked)"
            )
        if key != "params" and not isinstance(value, (*runtime.LEAF_VALUE_TYPES, tuple)):
            raise PrecompileError(f"{where} param_groups[{g}][{key!r}]: unsupported value {value!r}")


def _example_optimizer_state(where: str, g: int, j: int, keys: tuple, existing: Any, param: torch.Tensor) -> dict:
    """Clones of the caller's state, or eager's initial state before the first step."""
    if not existing:
        return runtime.initial_optimizer_state(keys, param)
    if set(existing) != set(keys):
        raise PrecompileError(
            f"{where} state of param_groups[{g}]['params'][{j}] has keys {sorted(existing)}, expected "
            f"{sorted(keys)}: it does not belong to this optimizer's options"
        )
    return {key: _clone_leaf(existing[key]) for key in keys}


def _optimizer_example_inputs(args: _Arguments) -> list:
    """Flat graph inputs after the sizes: per optimizer lrs then state; then incoming grads."""
    inputs = []
    for lifted in args.optimizers:
        # float64 like eager's Python float; requires_grad steers SGD onto its
        # tensor-lr path (addcmul) instead of reading lr as a number.
        inputs += [
            torch.tensor(group["lr"], dtype=torch.float64, requires_grad=True)
            for group in lifted.optimizer.param_groups
        ]
        inputs += [tensor for entry in lifted.state for tensor in entry.values()]
    if args.optimizers:
        inputs += [torch.zeros_like(args.lifted[i].tensor) for i in _grad_candidates(args)]
    return inputs


def _grad_candidates(args: _Arguments) -> list:
    return [i for i, e in enumerate(args.lifted) if e.kind == "parameter" and e.tensor.requires_grad]


@contextlib.contextmanager
def _redirect_optimizers(args: _Arguments, state: tuple, inputs: tuple):
    """While fn runs, point each optimizer at the traced leaves and inputs; restore after.

    Adam/AdamW trace their ``capturable`` formulation (step, lr and bias
    corrections as tensor ops, not Python numbers baked into the graph), with
    ``torch.compiler.is_compiling()`` true during ``step()`` like under
    torch.compile, so no tensor is read back as a number.
    """
    inputs = iter(inputs)
    saved, handles = [], []
    compiling = torch.compiler._is_compiling_flag
    try:
        for lifted in args.optimizers:
            optimizer = lifted.optimizer
            saved.append((optimizer, optimizer.state, [dict(group) for group in optimizer.param_groups]))
            traced_state = collections.defaultdict(dict)
            for group, indices in zip(optimizer.param_groups, lifted.groups):
                group["params"], group["lr"] = [state[i] for i in indices], next(inputs)
                if lifted.cls != "SGD":
                    group["capturable"] = True
            for group in optimizer.param_groups:
                for leaf in group["params"]:
                    traced_state[leaf] = {key: next(inputs) for key in lifted.keys}
            optimizer.state = traced_state
            handles.append(optimizer.register_step_pre_hook(lambda *_: _set_compiling(True)))
            handles.append(optimizer.register_step_post_hook(lambda *_: _set_compiling(compiling)))
        for index in _grad_candidates(args):
            # A graph input, so backward without zero_grad accumulates onto it in-graph.
            state[index].grad = next(inputs)
        yield
    finally:
        torch.compiler._is_compiling_flag = compiling
        for handle in handles:
            handle.remove()
        for optimizer, original_state, groups in saved:
            optimizer.state = original_state
            for group, original in zip(optimizer.param_groups, groups):
                group.clear()
                group.update(original)


def _set_compiling(value: bool) -> None:
    torch.compiler._is_compiling_flag = value


_PROFILER_OPS = ("profiler._record_function_enter_new", "profiler._record_function_exit")


def _finish_optimizer_inputs(graph: torch.fx.GraphModule, example: list, args: _Arguments, backend: str) -> tuple:
    """Drop the step's profiler ranges and the optimizer inputs fn never read.

    State of a parameter that got no gradient (eager creates none) and incoming
    grads that fn cleared with zero_grad are unused placeholders: erase them, so
    the runtime neither creates that state nor passes those grads.
    """
    if not args.optimizers:
        return (), ()
    for node in reversed(list(graph.graph.nodes)):
        if node.op == "call_function" and str(node.target).startswith(_PROFILER_OPS):
            graph.graph.erase_node(node)
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    position = len(args.lifted) + len(args.tensor_indices)  # real trace: no free sizes
    unused = set()
    specs = []
    for lifted in args.optimizers:
        position += len(lifted.groups)  # the lrs stay, even when unused
        stepped, tensors = [], []
        slots = [(g, j) for g, indices in enumerate(lifted.groups) for j in range(len(indices))]
        for slot, entry in zip(slots, lifted.state):
            nodes = placeholders[position : position + len(entry)]
            if any(node.users for node in nodes):
                stepped.append(slot)
                tensors += [_tensor_spec(t, backend) for t in entry.values()]
            else:
                unused.update(range(position, position + len(entry)))
            position += len(entry)
        specs.append(
            OptimizerSpec(
                position=lifted.position,
                cls=lifted.cls,
                groups=tuple(tuple(g) for g in lifted.groups),
                hyper=tuple(tuple(h) for h in lifted.hyper),
                keys=tuple(lifted.keys),
                stepped=tuple(stepped),
                tensors=tuple(tensors),
            )
        )
    grad_inputs = []
    for index in _grad_candidates(args):
        if placeholders[position].users:
            grad_inputs.append(index)
        else:
            unused.add(position)
        position += 1
    for i in sorted(unused, reverse=True):
        graph.graph.erase_node(placeholders[i])
        del example[i]
    graph.recompile()
    return tuple(specs), tuple(grad_inputs)


# ---------------------------------------------------------------------------
# Enforce: the graph must only depend on its inputs (Note invariants 2, 5).
# ---------------------------------------------------------------------------


def _source_of(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    # The innermost frame of user code: skip torch's own files and FX's generated code.
    torch_dir = os.path.dirname(torch.__file__)
    frames = [
        line.strip()
        for line in trace.strip().splitlines()
        if line.strip().startswith("File ") and torch_dir not in line and "<eval_with_key" not in line
    ]
    return f" (at {frames[-1]})" if frames else ""


def _enforce_contract(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list]:
    """Refuse live state, effects and control flow; lift tensor literals to inputs."""
    from torch._higher_order_ops.effects import has_effects

    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    for node in calls:
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            raise PrecompileError(
                f"fn uses the higher-order operator {node.target.name()}{_source_of(node)} "
                "(control flow such as torch.cond / while_loop), which precompile does not "
                "support; write the branch as plain Python (it is specialized to the example "
                "inputs) or keep it outside fn"
            )
        if has_effects(node.target):
            raise PrecompileError(
                f"fn calls the effectful operator {node.target}{_source_of(node)}; side effects "
                "would be lost or reordered by the artifact: move it out of fn"
            )
    constants = []
    last_placeholder = list(graph.graph.find_nodes(op="placeholder"))[-1]
    for node in list(graph.graph.find_nodes(op="get_attr")):
        value = getattr(graph, node.target)
        users = list(node.users)
        is_literal = isinstance(value, torch.Tensor) and all(
            u.target is torch.ops.aten.lift_fresh_copy.default for u in users
        )
        if not is_literal:
            where = "".join(_source_of(u) for u in users[:1])
            description = (
                f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise PrecompileError(
                f"fn reads {description} that is neither an argument of fn nor created inside "
                f"it{where}: a global, a captured local or an unregistered module attribute is "
                "live state the artifact cannot see; pass it as an argument, or register it "
                "on a module argument with register_buffer / nn.Parameter"
            )
        with graph.graph.inserting_after(last_placeholder):
            placeholder = graph.graph.placeholder(f"constant{len(constants)}")
        last_placeholder = placeholder
        node.replace_all_uses_with(placeholder)
        graph.graph.erase_node(node)
        delattr(graph, node.target)
        constants.append(value.detach().clone())
    graph.recompile()
    return graph, constants


def _constant_spec(t: torch.Tensor) -> ConstantSpec:
    import base64

    # reshape(-1): a 0-dim literal (torch.tensor(torch.finfo(dtype).min)) cannot be
    # viewed as bytes directly ("self.dim() cannot be 0 to view Float as Byte").
    data = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return ConstantSpec(
        shape=tuple(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
        data=base64.b64encode(data).decode("ascii"),
    )


# ---------------------------------------------------------------------------
# Lower: eager keeps the ATen graph; inductor goes through AOTAutograd.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Lowered:
    graph_code: str  # python_code section that defines the graph
    bind_code: str  # statements binding `_run_graph(list_of_inputs) -> outputs`


def _lower_eager(capture: _Capture) -> _Lowered:
    from torch.fx.graph import _custom_builtins

    code = capture.graph.graph.python_code(root_module="self")
    imports = sorted(
        {_custom_builtins[name].import_str for name in code.globals if name in _custom_builtins}
    )
    unknown = sorted(set(code.globals) - set(_custom_builtins))
    if unknown:
        raise PrecompileError(f"the captured graph refers to globals the artifact cannot render: {unknown}")
    source = code.src.replace("def forward(self, ", "def eager_graph(", 1).replace(
        "def forward(self)", "def eager_graph()", 1
    )
    graph_code = "\n".join(imports) + "\n\n" + source.strip() + "\n"
    return _Lowered(graph_code, '_run_graph = _driver["eager_runner"](eager_graph)\n')


# Inductor config pinned for lowering (see ../shared/design.md section 2): kernels
# size their scratch by the runtime thread count, Python wrapper only, and
# random ops use ATen's RNG so results match eager under torch.manual_seed.
_INDUCTOR_CONFIG = {
    "cpp.dynamic_threads": True,
    "cpp_wrapper": False,
    "benchmark_harness": False,
    "size_asserts": True,
    "fallback_random": True,
    "freezing": False,
}

# Names the generated module imports from torch._inductor that the driver
# provides itself, so the warm path never imports torch._inductor.
_INDUCTOR_STAND_INS = {"AsyncCompile", "extern_kernels", "align", "maybe_profile", "run_intermediate_hooks"}


def _lower_inductor(capture: _Capture) -> _Lowered:
    # torch 2.13 has no compile_to_python: keep the module Inductor generates
    # for the single inner graph through an inner_compile hook.
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    compiled = []

    def keep_inner(gm, example_inputs, **kwargs):
        result = compile_fx_inner(gm, example_inputs, **kwargs)
        placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        compiled.append((result, placeholders, len(gm.graph.output_node().args[0])))
        return result

    num_inputs = len(capture.example_inputs)
    num_outputs = sum(1 for leaf in capture.convention.outputs if leaf.graph_output is not None) + len(
        capture.convention.grad_state
    )
    with inductor_config.patch(_INDUCTOR_CONFIG), torch.no_grad():
        compile_fx(capture.graph, capture.example_inputs, inner_compile=keep_inner)
    if len(compiled) != 1 or compiled[0][1:] != (num_inputs, num_outputs):
        signature = [(inputs, outputs) for _, inputs, outputs in compiled]
        raise PrecompileError(
            "backend='inductor' cannot reproduce this graph faithfully: AOTAutograd changed its "
            f"calling signature (expected one graph with {num_inputs} inputs and {num_outputs} "
            f"outputs, got {signature}); this happens with metadata mutations such as x.t_() or "
            "x.resize_(): avoid them in fn, or use backend='eager'"
        )
    source = _strip_stand_in_imports(compiled[0][0].source_code)
    extern_table = _extern_kernel_table(source)
    graph_code = (
        f"EXTERN_KERNELS = {pprint.pformat(extern_table)}\n\n"
        f"INDUCTOR_GRAPH = {_render_string(source)}\n"
    )
    bind = (
        '_call, _kernel_loader = _driver["load_inductor_module"](INDUCTOR_GRAPH, EXTERN_KERNELS, _kernel_files)\n'
        "_run_graph = _call  # Inductor's call(list_of_inputs) -> outputs\n"
    )
    return _Lowered(graph_code, bind)


def _strip_stand_in_imports(source: str) -> str:
    lines = source.splitlines(keepends=True)
    drop = set()
    for node in _parse(source).body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("torch._inductor")
            and all((alias.asname or alias.name) in _INDUCTOR_STAND_INS for alias in node.names)
        ):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _extern_kernel_table(source: str) -> dict[str, str]:
    """Map each extern kernel the graph calls to a torch name that resolves without Inductor."""
    from torch._inductor.select_algorithm import extern_kernels

    table = {}
    for name in sorted(set(re.findall(r"\bextern_kernels\.(\w+)", source))):
        kernel = getattr(extern_kernels, name, None)
        dotted = _torch_name(kernel)
        if dotted is not None:
            table[name] = dotted
    return table


def _torch_name(obj: Any) -> str | None:
    if isinstance(obj, torch._ops.OpOverload):
        namespace, op = obj._schema.name.split("::")
        candidate = f"torch.ops.{namespace}.{op}.{obj._overloadname or 'default'}"
    else:
        candidate = f"torch.{getattr(obj, '__name__', '')}"
    try:
        return candidate if runtime._resolve_dotted(candidate) is obj else None
    except AttributeError:
        return None


def _render_string(text: str) -> str:
    """A long string as one literal per line, so the artifact stays readable."""
    lines = text.splitlines(keepends=True)
    return "(\n" + "".join(f"    {line!r}\n" for line in lines) + ")"


# ---------------------------------------------------------------------------
# Render: python_code = header + calling convention + graph + driver + binding.
# ---------------------------------------------------------------------------


_GRAPH_MARKER = "\n# " + "-" * 20 + " captured graph " + "-" * 20


def _driver_source() -> str:
    with open(runtime.__file__, encoding="utf-8") as f:
        return f.read()


def _driver_namespace(source: str, sha256: str) -> dict:
    """The artifact's driver: the installed module when it is this exact source.

    Importing ``torch._precompile_runtime`` reuses Python's cached bytecode;
    compiling the embedded copy costs ~8 ms per load.  Without the patch
    installed (or with another version of it) the embedded source runs.
    """
    import hashlib

    try:
        import torch._precompile_runtime as installed
    except ImportError:
        installed = None
    if installed is not None:
        installed_sha256 = getattr(installed, "_source_sha256", None)
        if installed_sha256 is None:
            with open(installed.__file__, encoding="utf-8") as f:
                installed_sha256 = installed._source_sha256 = hashlib.sha256(f.read().encode()).hexdigest()
        if installed_sha256 == sha256:
            return vars(installed)
    namespace = {"__name__": "torch_precompile_driver"}
    exec(compile(source, "<precompile driver>", "exec"), namespace)
    return namespace


def _describe_call(convention: CallingConvention) -> str:
    """One comment line per argument, for the artifact's header."""
    lines = []
    modules = {m.position: m for m in convention.modules}
    optimizers = {o.position: o for o in convention.optimizers}
    spec = pytree.treespec_loads(convention.input_spec)
    leaves = iter(convention.inputs)
    for position in range(convention.arity):
        if position in optimizers:
            o = optimizers[position]
            lines.append(
                f"args[{position}]: torch.optim.{o.cls} over {sum(map(len, o.groups))} parameters in "
                f"{len(o.groups)} groups (lr read at every call; state updated in place)"
            )
            continue
        if position in modules:
            module = modules[position]
            lines.append(
                f"args[{position}]: nn.Module with {len(module.parameters)} parameters, "
                f"{len(module.buffers)} buffers"
            )
            continue
        child = spec.children()[convention.user_positions.index(position)]
        described = [_describe_leaf(next(leaves)) for _ in range(child.num_leaves)]
        lines.append(f"args[{position}]: " + (described[0] if child.is_leaf() else f"pytree of {described}"))
    return "\n".join(f"#   {line}" for line in lines)


def _describe_leaf(leaf: LeafSpec) -> str:
    if leaf.tensor is None:
        return f"{leaf.value!r} (baked)"
    t = leaf.tensor
    return f"Tensor{t.describe_shape()} {t.dtype} {t.device}"


def _render(convention: CallingConvention, lowered: _Lowered) -> str:
    driver = _driver_source()
    header = f"""\
# torch.compiler.precompile artifact -- format {FORMAT_VERSION}, backend {convention.backend!r}.
# Generated by torch {torch.__version__}. Do not edit: the cache is bound to this
# exact text by its sha256, and the constants below are the calling convention.
#
# Load it with:   fn = torch.compiler.precompile.load(python_code, cache)
# Or run it alone (no cache; any kernels are compiled on first use):
#     namespace = {{}}
#     exec(open("this_file.py").read(), namespace)
#     out = namespace["forward"](model, *inputs)
#
# Calling convention (positional arguments only):
{_describe_call(convention)}
# Pass the model(s) again at every call; no weights are stored here.
"""
    sections = [
        header,
        f"FORMAT_VERSION = {FORMAT_VERSION}\n",
        f"BACKEND = {convention.backend!r}\n",
        f"CALLING_CONVENTION = {pprint.pformat(convention.to_literal(), width=100, sort_dicts=False)}\n",
        _GRAPH_MARKER.lstrip("\n") + "\n",
        lowered.graph_code,
        "# " + "-" * 20 + " driver: torch/_precompile_runtime.py, verbatim " + "-" * 20 + "\n",
        f"DRIVER_SHA256 = {hashlib.sha256(driver.encode()).hexdigest()!r}\n",
        f"DRIVER_SOURCE = {_render_string(driver)}\n",
        "import torch  # used by the driver bootstrap below\n\n",
        inspect.getsource(_driver_namespace),
        "# " + "-" * 20 + " binding " + "-" * 20 + "\n",
        "_driver = _driver_namespace(DRIVER_SOURCE, DRIVER_SHA256)\n"
        "# load() passes the cached kernels' files; run alone, kernels are compiled.\n"
        '_kernel_files = globals().get("__precompile_kernel_files__", {})\n'
        + lowered.bind_code
        + '_convention = _driver["CallingConvention"].from_literal(CALLING_CONVENTION)\n'
        'forward = _driver["PrecompiledFunction"](\n'
        '    _convention, _run_graph, _driver["materialize_constants"](_convention.constants)\n'
        ")\n",
    ]
    return "\n".join(sections)


# ---------------------------------------------------------------------------
# Package: the cache envelope (weights_only-readable; see Note invariant 6).
# ---------------------------------------------------------------------------


def _build_environment() -> dict[str, str]:
    """What compiled kernels depend on; they are loaded only on an exact match."""
    return {
        "torch": str(torch.__version__),
        "python": sys.implementation.cache_tag,
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _payload_hash(kernels: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for key in sorted(kernels):
        digest.update(key.encode())
        digest.update(len(kernels[key]).to_bytes(8, "little"))
        digest.update(kernels[key])
    return digest.hexdigest()


def _code_hash(python_code: str) -> str:
    return hashlib.sha256(python_code.encode()).hexdigest()


def _package(python_code: str, backend: str, kernels: dict[str, bytes]) -> bytes:
    envelope = {
        "format": CACHE_FORMAT,
        "version": FORMAT_VERSION,
        "backend": backend,
        "code_hash": _code_hash(python_code),
        "build_env": _build_environment(),
        "payload_sha256": _payload_hash(kernels),
        "artifact": {"kernels": kernels},
    }
    buffer = io.BytesIO()
    torch.save(envelope, buffer)
    return buffer.getvalue()


def _harvest_kernels(python_code: str) -> dict[str, bytes]:
    """Run the artifact once (JIT, Inductor's cache is warm) and keep its kernels."""
    namespace: dict[str, Any] = {}
    exec(compile(python_code, "<precompile artifact>", "exec"), namespace)
    kernels = {}
    for key, path in namespace["_kernel_loader"].compiled.items():
        with open(path, "rb") as f:
            kernels[key] = f.read()
    return kernels


# ---------------------------------------------------------------------------
# load: read constants (ast) -> verify -> prime kernels -> warn -> exec.
# ---------------------------------------------------------------------------


# CPython 3.11 (seen on 3.11.7) keeps ast.parse's recursion-depth counter in shared
# state: parses racing in two threads raise "SystemError: AST constructor
# recursion depth mismatch" (gh-106905).  load() is called from threads.
_AST_LOCK = threading.Lock()


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


def _read_constants(python_code: str) -> dict[str, Any]:
    if not isinstance(python_code, str):
        raise PrecompileError(f"python_code: expected str, got {type(python_code).__name__}")
    # The constants precede the graph: parsing only that header keeps load()
    # fast for large graphs; the rest is compiled when executed.
    header_end = python_code.find(_GRAPH_MARKER)
    try:
        module = _parse(python_code if header_end < 0 else python_code[:header_end])
    except SyntaxError as error:
        raise PrecompileError(f"python_code is not valid Python ({error}); it is not a precompile artifact") from error
    constants = {}
    for node in module.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("FORMAT_VERSION", "BACKEND", "CALLING_CONVENTION")
        ):
            if node.targets[0].id in constants:
                raise PrecompileError(f"python_code assigns {node.targets[0].id} twice; it was edited")
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
                raise PrecompileError(
                    f"python_code: {node.targets[0].id} is not a plain literal ({error})"
                ) from error
    missing = {"FORMAT_VERSION", "BACKEND", "CALLING_CONVENTION"} - set(constants)
    if missing:
        raise PrecompileError(
            f"python_code is missing the calling-convention metadata {sorted(missing)}; "
            "it is not a precompile artifact"
        )
    return constants


def _read_convention(python_code: str) -> CallingConvention:
    constants = _read_constants(python_code)
    version = constants["FORMAT_VERSION"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise PrecompileError(
            f"python_code has artifact format version {version!r}, newer than this "
            f"torch.compiler.precompile understands ({FORMAT_VERSION}); load it with the torch "
            "version that produced it, or precompile again"
        )
    if constants["BACKEND"] not in BACKENDS:
        raise PrecompileError(f"python_code: unknown backend {constants['BACKEND']!r}; expected one of {BACKENDS}")
    try:
        convention = CallingConvention.from_literal(constants["CALLING_CONVENTION"])
    except (TypeError, ValueError, AttributeError) as error:
        raise PrecompileError(f"python_code: CALLING_CONVENTION is malformed ({error})") from error
    if (convention.format_version, convention.backend) != (version, constants["BACKEND"]):
        raise PrecompileError(
            "python_code: CALLING_CONVENTION disagrees with FORMAT_VERSION/BACKEND "
            f"({convention.format_version}, {convention.backend!r}) vs ({version}, {constants['BACKEND']!r})"
        )
    return convention


def _read_envelope(cache: bytes) -> dict:
    if not isinstance(cache, (bytes, bytearray, memoryview)):
        raise PrecompileError(f"cache: expected bytes, got {type(cache).__name__}")
    try:
        envelope = torch.load(io.BytesIO(bytes(cache)), weights_only=True)
    except Exception as error:  # any decoder failure means damaged bytes
        raise PrecompileError(
            f"cache is damaged or not a precompile cache ({type(error).__name__}: {str(error)[:200]}); "
            "use the cache produced together with this python_code"
        ) from None
    expected = {"format", "version", "backend", "code_hash", "build_env", "payload_sha256", "artifact"}
    if not isinstance(envelope, dict) or set(envelope) != expected or envelope["format"] != CACHE_FORMAT:
        raise PrecompileError("cache is damaged or not a precompile cache (unexpected envelope)")
    return envelope


def _verify(python_code: str, convention: CallingConvention, envelope: dict) -> dict[str, bytes]:
    if envelope["version"] != FORMAT_VERSION:
        raise PrecompileError(
            f"cache has format version {envelope['version']!r}, this torch.compiler.precompile "
            f"understands {FORMAT_VERSION}; precompile again"
        )
    if envelope["backend"] != convention.backend:
        raise PrecompileError(
            f"cache was built for backend {envelope['backend']!r} but python_code is for "
            f"{convention.backend!r}: the pair does not belong together"
        )
    if envelope["code_hash"] != _code_hash(python_code):
        raise PrecompileError(
            "cache belongs to a different python_code (code_hash mismatch): pass the cache "
            "returned together with this python_code"
        )
    artifact = envelope["artifact"]
    kernels = artifact.get("kernels") if isinstance(artifact, dict) else None
    if (
        not isinstance(kernels, dict)
        or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in kernels.items())
        or _payload_hash(kernels) != envelope["payload_sha256"]
    ):
        raise PrecompileError("cache is damaged: its payload does not match its recorded sha256")
    return kernels


@functools.lru_cache(maxsize=None)
def _warn_environment_mismatch_once(built: str, here: str) -> None:
    warnings.warn(
        f"torch.compiler.precompile: the cache's kernels were built for {built}, this process "
        f"runs {here}; compiling the kernels from python_code instead (slower first call)",
        stacklevel=4,
    )


def _kernel_directory() -> str:
    # Mirrors torch._inductor.runtime.cache_dir_utils.cache_dir() without importing Inductor.
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is None:
        try:
            import getpass

            user = getpass.getuser()
        except (KeyError, ModuleNotFoundError, OSError):
            user = f"uid_{os.getuid()}"
        root = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return os.path.join(root, "precompile_kernels")


def _prime_kernels(envelope: dict, kernels: dict[str, bytes]) -> dict[str, str]:
    """Write the cached kernels to a content-addressed directory; key -> path."""
    if not kernels:
        return {}
    here = _build_environment()
    if envelope["build_env"] != here:
        _warn_environment_mismatch_once(repr(envelope["build_env"]), repr(here))
        return {}
    directory = _kernel_directory()
    os.makedirs(directory, exist_ok=True)
    files = {}
    for key, blob in kernels.items():
        path = os.path.join(directory, hashlib.sha256(blob).hexdigest() + ".so")
        if not (os.path.exists(path) and os.path.getsize(path) == len(blob)):
            # Atomic: concurrent loaders never see a half-written file.
            fd, temporary = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(temporary, path)
        files[key] = path
    return files


class _Precompile:
    """``torch.compiler.precompile``: a callable with a ``load`` method."""

    def __call__(
        self,
        fn: Callable,
        *example_inputs: Any,
        backend: str = "inductor",
        tracer: str = "make_fx",
        decompositions: dict | None = None,
    ) -> tuple[str, bytes]:
        """Ahead-of-time precompile ``fn`` against ``example_inputs``; see the docs page."""
        if backend not in BACKENDS:
            raise ValueError(f"precompile: unknown backend {backend!r}; expected one of {BACKENDS}")
        if tracer not in TRACERS:
            raise ValueError(f"precompile: unknown tracer {tracer!r}; expected one of {TRACERS}")
        if tracer == "dynamo":
            raise NotImplementedError("precompile: tracer='dynamo' is planned; use tracer='make_fx'")
        if not callable(fn):
            raise PrecompileError(f"precompile: fn must be callable, got {type(fn).__name__}")

        timer = _StageTimer("precompile")
        with timer("capture+enforce"):
            capture = _capture(fn, example_inputs, backend, decompositions)
        with timer("lower"):
            lowered = _lower_eager(capture) if backend == "eager" else _lower_inductor(capture)
        with timer("render"):
            python_code = _render(capture.convention, lowered)
        with timer("package"):
            kernels = _harvest_kernels(python_code) if backend == "inductor" else {}
            cache = _package(python_code, backend, kernels)
        timer.done(
            f"backend={backend} graph_inputs={len(capture.example_inputs)} kernels={len(kernels)} "
            f"python_code={len(python_code)}B cache={len(cache)}B"
        )
        return python_code, cache

    def load(self, python_code: str, cache: bytes) -> Callable:
        """Rebuild the runnable from ``(python_code, cache)``; executes python_code."""
        timer = _StageTimer("load")
        with timer("verify"):
            convention = _read_convention(python_code)
            envelope = _read_envelope(cache)
            kernels = _verify(python_code, convention, envelope)
        with timer("prime"):
            kernel_files = _prime_kernels(envelope, kernels)
        log.warning(
            "torch.compiler.precompile.load executes python_code (backend %r) and loads %d "
            "compiled kernels: only load artifacts you trust",
            convention.backend,
            len(kernel_files),
        )
        with timer("exec"):
            namespace = {"__name__": "torch_precompile_artifact", "__precompile_kernel_files__": kernel_files}
            try:
                exec(compile(python_code, "<precompile artifact>", "exec"), namespace)
            except PrecompileError:
                raise
            except Exception as error:
                raise PrecompileError(
                    f"python_code failed to execute ({type(error).__name__}: {error}); it is "
                    "damaged or was edited"
                ) from error
            forward = namespace.get("forward")
            if not callable(forward):
                raise PrecompileError("python_code does not define a callable `forward`")
        timer.done(f"backend={convention.backend} kernels={len(kernel_files)}")
        return forward


class _StageTimer:
    """Logs each stage's wall time at INFO on torch._precompile (TORCH_LOGS=precompile)."""

    def __init__(self, what: str):
        self.what = what
        self.stages: list = []
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stages.append((stage, time.perf_counter() - start))

    def done(self, summary: str) -> None:
        if log.isEnabledFor(logging.INFO):
            stages = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in self.stages)
            total = (time.perf_counter() - self.start) * 1e3
            log.info("%s: %s; total %.1f ms; %s", self.what, stages, total, summary)


precompile = _Precompile()


# ---------------------------------------------------------------------------
# Attach to torch.compiler (entry point of group torch.backends; also on import)
# ---------------------------------------------------------------------------


def _attach() -> None:
    """Expose precompile / PrecompileError on torch.compiler; must never raise."""
    try:
        import torch.compiler as compiler

        compiler.precompile = precompile
        compiler.PrecompileError = PrecompileError
        for name in ("precompile", "PrecompileError"):
            if name not in compiler.__all__:
                compiler.__all__.append(name)
        torch._logging._internal.register_log("precompile", __name__)
    except Exception:  # never break `import torch` for everyone
        log.debug("torch._precompile: attach failed", exc_info=True)


_attach()
