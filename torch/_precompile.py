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
   and checked at every call.  During the trace (only),
   ``torch.compiler.is_compiling()`` and ``is_exporting()`` are true, as in
   torch.export's non-strict capture, so model libraries take their
   trace-friendly paths (a padding mask stays a runtime input instead of a
   data-dependent shortcut) (test_precompile_real_models.py); Inductor also specializes on strides (except
   size-1 dims and empty tensors); the driver checks them before every call,
   so Inductor's own graph-input size/stride asserts, which would repeat that
   check, are dropped from its module (its asserts on extern kernels' outputs stay).  Non-tensor input leaves are baked and a
   different value is refused.  The one exception: a user-input dim marked
   with ``mark_unbacked`` (inductor only) is an unbacked symint -- its bounds
   and the equalities the graph needs between marked dims are checked at
   every call, and a graph that guards on it is refused at capture.
   Marks sharing a ``shape_id`` are one size with the tightest of their
   bounds.  A marked input's strides vary with its sizes, so its layout is
   pinned as a memory format instead (``contiguous_format``,
   ``channels_last``); the graph's outputs are then dense but may be in
   another memory format than eager's (values are equal).  Input and output pytree structures must be recordable
   (registered types with a serialized_type_name, keys and a JSON context),
   else capture refuses them by argument.
   Enforced (TestRuntimeChecks, TestFreeDims, test_precompile_fuzz.py,
   test_precompile_real_models.py TestFreeDims, TestStructures).
4. The whole step.  If fn calls ``.backward()``, forward and backward are one
   graph; the runnable writes parameter gradients onto the runtime model's
   ``.grad`` exactly like eager (assign when None, else add; invariant 13).  Which
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
   is bound to the code by its sha256, its payload by another, each kernel
   and the sections' compiled Python (marshalled for the Python that built
   them) by the sha256 python_code records for it.  A damaged, foreign or
   other-version cache is ignored with a warning; one bound to other code
   raises.  Kernels run only from verified files in a private store.
   Enforced (TestArtifact, TestLoad, test_precompile_fuzz.py TestFuzzLoad,
   test_precompile_kernel_store.py).  Layout: a header of literal constants
   (the calling convention, whose ``format_version`` and ``backend`` are the
   artifact's, stored nowhere else; bytecode and kernel hashes), then code sections in
   reading order -- ``graph`` (the eager ATen graph, each node annotated with
   its dtype[shape] and the line of fn or the model that produced it
   (test_eager_graph_names_the_source_line_of_each_node), or Inductor's module),
   ``driver`` (``torch/_precompile_runtime.py`` verbatim) and ``forward`` (binds
   them) -- each opened by a marker line.  Run alone they share one namespace,
   so the driver may not rebind the other sections' names (checked at render).
   ``load`` takes them from the cache when it holds this Python's code objects
   and python_code pins their bytes (BYTECODE_SHA256, which pins the header's
   constants too, so a warm load parses no header; otherwise it compiles
   them) under ``<precompile artifact sha[:12]>``, named after the sections,
   registered with ``linecache`` so tracebacks and pdb show the artifact's
   lines, and reuses the installed driver when it is the section's exact text
   (TestArtifact test_traceback_shows_artifact_lines,
   test_warm_load_compiles_no_python,
   test_cached_bytecode_is_used_only_when_python_code_pins_it).
7. Trust.  ``load`` executes ``python_code`` and loads compiled kernels from
   ``cache``: only load pairs you trust.  It reads the calling convention with
   ``ast`` (or, warm, takes the cache's copy that python_code pins) and the
   cache's JSON envelope and raw entries (no unpickling) before executing
   anything, and warns at every load (TestLoad).  Trusting the
   pair is the caller's responsibility.  The convention's records
   (``_precompile_runtime.CallingConvention`` and the specs it holds) are
   their own schema: each field is decoded by its annotation, then the
   cross-references are checked (``validate_convention``); an artifact whose
   ``format_version`` is outside ``MIN_FORMAT_VERSION..FORMAT_VERSION`` is
   refused before that, by ``_check_format_version``, naming both
   (TestConventionSchema).
8. Capture has no side effects on the caller.  ``precompile`` traces on
   clones, so the caller's parameters, buffers, ``.grad`` and inputs are
   bit-identical afterwards, also when fn raises (TestCaptureContract); fn
   rebinding the caller's ``.grad`` through a closure is undone and refused.
   The global RNG (CPU, and CUDA when initialized) that tracing and lowering
   draw from is restored, so ``torch.manual_seed(s); precompile(...)`` and a
   call reproduce eager's ``torch.manual_seed(s); fn(...)``
   (test_precompile_capture_soundness.py test_rng_untouched_*,
   test_rebinding_caller_grad_refused_and_restored).
   An optimizer argument's param_groups and state are restored too
   (invariant 15).
9. Kernels are machine code.  Cached kernels load only when the cache's build
   environment (torch, Python, platform, CPU capability) equals this
   process's; otherwise ``load`` warns once and compiles from python_code.
   Warm loads run no compiler and import neither ``torch._inductor`` nor
   ``torch._dynamo`` (TestInductorCache).
10. Threads.  An inference runnable may be called from several threads at
   once (test_precompile_concurrency.py); a training step writes ``.grad``
   and must not run concurrently on the same model: caller's responsibility.
   ``precompile()`` calls run one at a time (a process-wide reentrant lock,
   ``_PRECOMPILE_LOCK``), because capture and lowering change process-global
   state, not per-thread state: capture disables MKLDNN
   (``torch.backends.mkldnn.flags``), sets torch.compiler's compiling and
   exporting flags, swaps the module arguments' tensors for traced leaves
   (``_reparametrize_module``), points optimizer arguments at traced state and
   forks the global RNG; lowering patches Inductor's global config.  All of it
   is restored on exit, also when fn raises
   (test_two_threads_capture_one_at_a_time,
   test_two_threads_lower_one_at_a_time).  Other threads are not locked out:
   eager code, torch.compile or an artifact call running meanwhile sees that
   state; using the module or optimizer arguments from another thread while
   precompile() runs is the caller's responsibility.  The driver's one piece of
   process-global state is its structure counter, registered once per process
   on nn.Module's global registration hooks and shared by every artifact.  The
   private torch 2.13 internals all this relies on are listed in
   ``torch/_precompile_compat.py`` (the driver's in its own marked section) and
   pinned by test_precompile_compat.py.
11. Nothing baked goes unchecked.  A call either computes what eager fn
   computes on it, or raises a PrecompileError naming the argument, what was
   captured and what was passed, before any state changes (no buffer update,
   no ``.grad``, no input written).  The ledger: everything fn can observe,
   and whether it is LIFTED (a graph input, read at every call), CHECKED at
   every call, or REFUSED at capture.  Tests are in
   test_precompile_soundness.py TestSoundness unless named otherwise; the
   fuzzer (test_precompile_fuzz.py test_fuzzed_soundness_call) flips modes,
   aliasing, requires_grad, module structure and classes, hooks, an existing
   ``.grad`` and global state between calls.

   Argument tensors
   - values: LIFTED.  Shape, dtype, device: CHECKED (invariants 1, 3;
     strides too on inductor).  Types: CHECKED (``TensorGuards`` compares
     the Python type); a subclass with its own ``__torch_function__`` is
     REFUSED at capture and at a call, its Python logic would run only once
     (test_torch_function_subclasses_are_refused).
   - requires_grad: recorded for every lifted and user-input tensor and
     CHECKED when the graph runs autograd (fn calls ``backward()`` or
     ``torch.autograd.grad``): a frozen parameter, a swapped-in
     ``requires_grad=False`` Parameter or an input that now requires grad is
     refused (test_frozen_parameter_is_refused,
     test_input_requiring_grad_is_refused_by_a_training_step).  A forward
     computes the same values either way: honoured, outputs carry no history
     (invariant 4; test_forward_with_an_input_that_requires_grad_runs_under_no_grad).
   - Aliasing: capture traces every tensor on its own clone, so the graph
     assumes distinct memory.  Where the graph writes a tensor input in
     place, example tensors sharing memory with it are REFUSED at capture,
     and at every call a user input sharing memory (``torch._C._is_alias_of``,
     i.e. the same storage, overlapping or not) with a written tensor, or a
     written user input sharing memory with any parameter/buffer or other
     input, is refused; parameters/buffers among themselves are CHECKED
     whenever the module cache is rebuilt.  Graphs that write no input do not
     care (test_aliased_inputs_are_refused_when_written).  A module's own
     parameter or buffer passed again as an input (``fn(m, x, list(m.parameters()))``)
     is REFUSED at capture: its gradient and writes would not reach the module's
     (test_state_passed_again_as_an_input_is_refused).
   - Lazy conjugate / negative bits (``x.conj()``, ``torch._neg_view``):
     CHECKED; refused by backend='inductor', whose kernels read raw memory,
     honoured by backend='eager' (test_lazy_conj_and_neg_bits).
   Modules
   - Parameters and buffers: LIFTED; names, tying and layouts CHECKED
     (invariant 1).
   - Structure: submodule names and classes CHECKED (a ReLU swapped for a
     Tanh is refused).  Edits that bypass nn.Module's registration hooks are
     still seen: ``del model.fc2``, ``del model.layers[1]``, ``del`` +
     ``insert`` reorders and ``del model.lin.bias`` (a reorder with equal
     names and shapes is honoured; a missing one is refused)
     (test_module_edits_bypassing_hooks_are_seen,
     test_module_classes_and_read_attributes_are_checked).
   - Mode: capture records which submodules' ``training`` flag fn reads
     (BatchNorm, Dropout, user code); those flags are CHECKED, however they
     were set.  A flag never read cannot have shaped the graph: a Linear in
     eval mode is honoured.  fn changing a mode (``model.eval()`` inside fn)
     is REFUSED (test_module_mode_is_checked,
     test_capture_refuses_fn_that_changes_a_mode).
   - Plain attributes fn reads (``LayerNorm.eps``, ``Dropout.p``,
     ``BatchNorm.momentum``: instance values an artifact can hold as
     literals): recorded and CHECKED like baked inputs; a changed value is
     refused, an unread one (``Linear.in_features``) cannot matter
     (test_module_classes_and_read_attributes_are_checked).
   - Hooks (module forward/backward hooks and pre-hooks, global module
     hooks, parameter gradient and post-accumulate hooks): REFUSED at capture
     and CHECKED at a call, which rescans only when a hook was registered
     anywhere since the last scan (test_hooks_are_refused).
   Non-tensor values
   - Python leaves of the inputs: baked and CHECKED by type and, for floats,
     sign: ``-0.0`` is not ``0.0``, ``True`` is not ``1``, ``nan`` equals
     ``nan`` (test_baked_floats_compare_bitwise, test_same_value).
   Global state
   - Grad mode: an artifact that runs autograd is REFUSED under
     ``no_grad()`` and ``inference_mode()`` (whether fn would enable grad
     itself is not recorded); a forward is honoured there.  Anomaly
     detection: REFUSED for an artifact that runs autograd, whose compiled
     backward cannot check (test_global_state).
   - Autocast (per device type: enabled and dtype) and
     ``torch.get_default_dtype()``: CHECKED (test_global_state).
   - RNG: the graph draws from the global generator like eager; capture
     leaves it as it was (invariant 8).
   Gradients and writes
   - ``.grad`` read or cleared inside fn: LIFTED (invariant 13).
   - Writes to tensors that are not arguments: REFUSED (invariant 14).
   Caller's responsibility (not recorded, stated here so nothing is baked
   silently): fn's Python side effects (appending to a list, counting calls,
   printing, setting a plain module attribute) happen once, at capture,
   as under any tracer; Python objects that modules hold and fn reads
   (configs, functions) are code, like fn itself; fn reading a flag
   around attribute access (``vars(m)["training"]``) or branching on
   ``type(m) is ...`` (during the trace ``type(m)`` is a probe subclass,
   which also runs the class's ``__init_subclass__``); writing
   ``_modules`` / ``_parameters`` dicts directly without changing their
   length, ``param.data = ...`` and ``m.__class__ = ...``; and, on
   backend='inductor', indices out of range (``nn.Embedding``), which
   Inductor's CPU kernels check with an abort instead of an IndexError, as
   under torch.compile: validate indices outside fn or use backend='eager'.
   The fast path keeps this cheap: the global state is a few C calls, the
   module checks are C-level list comparisons (``benchmarks/soundness_overhead.py``),
   and ``TensorGuards`` (which compares types, requires_grad and dispatch
   keys, so the conj/neg bits) is only armed by a call the slow path accepted.
12. Data-dependent Python.  Python that needs a traced tensor's value
   (``if x.sum() > 0:``, ``.item()``, ``bool(mask.all())``) would bake the
   example's outcome: refused at capture, naming fn's file:line and code and
   suggesting ``torch.where`` or a Python input.  With marked dims (a
   symbolic trace) ``.item()`` becomes an unbacked value computed at every
   call, and a branch on it is refused the same way
   (test_precompile_capture_soundness.py test_data_dependent_python_*).
13. The incoming gradient.  fn is traced with each parameter's ``.grad`` set
   to its own graph input (the caller's ``.grad``, zeros when None), so
   what fn does with it is in the graph, and each parameter's ``.grad`` is
   written the way eager's would be: backward's plain accumulation is left
   to the runnable (assign when None, else add in place, with grad mode off
   like the autograd engine: the common step passes no extra input); when
   fn clears ``.grad`` before backward (``model.zero_grad()``) or reads it
   (``clip_grad_norm_`` with gradient accumulation, logging ``p.grad``) the
   graph's gradient is assigned; when fn clears it last, the runnable sets
   it to None (test_precompile_capture_soundness.py
   test_gradient_accumulation_matches_eager,
   test_grad_bookkeeping_follows_what_fn_does_with_grad,
   test_grad_that_requires_grad_accumulates_like_eager).  Caller's
   responsibility: fn branching on ``p.grad is None`` (it is a tensor while
   tracing).
14. Writes the graph does not see.  fn may only write tensors the trace
   tracks (its arguments' tensors and tensors it creates).  An optimizer's
   ``step()`` / ``zero_grad()`` inside fn (it holds the caller's tensors, not
   the traced copies) and in-place writes through any other reference (the
   caller's parameters or ``.grad`` reached through a closure, a global) are
   refused at capture before they happen, naming the optimizer or tensor and
   fn's source line: call the optimizer outside fn
   (test_optimizer_in_fn_refused_before_it_changes_anything,
   test_write_through_closure_refused_before_writing).
15. Optimizers are arguments, not state.  A ``torch.optim`` SGD, Adam or
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
   The step reads the incoming ``.grad`` (invariant 13), so it is a graph
   input unless fn's zero_grad drops it.  Refused at capture:
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
import atexit
import collections
import contextlib
import dataclasses
import functools
import gc
import hashlib
import importlib.util
import io
import linecache
import logging
import json
import marshal
import operator
import os
import platform
import pprint
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import traceback
import warnings
import zipfile
from typing import Any, Callable, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch import _precompile_compat as compat, _precompile_runtime as runtime
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
from torch.utils._python_dispatch import TorchDispatchMode


__all__ = ["precompile", "PrecompileError"]

log = logging.getLogger(__name__)

CACHE_FORMAT = "torch.compiler.precompile"
# Version of the artifact layout and of its CallingConvention record.  2: the
# convention records module modes read, aliasing, requires_grad, global state
# (Note invariant 11 on); 3: submodule classes and read attributes, how each
# .grad is written (invariant 13), and the graph and the driver are code
# sections, no longer string literals; older artifacts lack them.  4: the
# format version and backend are stored once (CALLING_CONVENTION's
# format_version / backend, no FORMAT_VERSION / BACKEND lines), the free sizes
# are derived from the inputs' free_dims, a LeafSpec's unset value is no None.
# 5: each tensor output's shape, dtype and device (output_tensors).  6: the
# cache is a zip of a JSON envelope and raw entries, not a torch.save pickle,
# and carries the header's constants beside the compiled sections.
# load() accepts MIN_FORMAT_VERSION..FORMAT_VERSION (_check_format_version).
MIN_FORMAT_VERSION = 6
FORMAT_VERSION = 6
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
    for position, arg in zip(user_positions, user_args):
        _check_recordable_structure(f"args[{position}]", arg)
    input_leaves, input_spec = pytree.tree_flatten(user_args)
    input_paths = [
        f"args[{user_positions[path[0].idx]}]{pytree.keystr(path[1:])}"
        for path, _ in pytree.tree_flatten_with_path(user_args)[0]
    ]
    for what, leaf in zip(input_paths, input_leaves):
        if isinstance(leaf, torch.Tensor):
            runtime.check_plain_torch_function(what, leaf)
        else:
            _check_value_leaf(what, leaf)
    lifted = _lift_state(modules)
    for entry in lifted:
        module_index, fqn = entry.names[0]
        runtime.check_plain_torch_function(f"args[{module_positions[module_index]}].{fqn}", entry.tensor)
    _refuse_state_as_input(lifted, module_positions, input_leaves, input_paths)
    _refuse_hooks(modules, module_positions, lifted)
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


def _refuse_state_as_input(lifted: list, module_positions: list, leaves: list, paths: list) -> None:
    """A module's parameter or buffer passed again as a plain input (Note invariant 11).

    Capture traces each input on its own clone, so fn would see two unrelated
    tensors: gradients (``clip_grad_norm_(params)``) and writes through one
    would not reach the other, unlike eager.
    """
    owners = {_storage_address(e.tensor): e for e in lifted}
    owners.pop(0, None)  # empty tensors share no storage
    for path, leaf in zip(paths, leaves):
        entry = isinstance(leaf, torch.Tensor) and owners.get(_storage_address(leaf))
        if entry:
            module_index, fqn = entry.names[0]
            raise PrecompileError(
                f"{path} is (or shares memory with) args[{module_positions[module_index]}].{fqn}, a "
                f"{entry.kind} of a module argument: precompile lifts module state itself and would "
                "trace this input as a separate tensor, so gradients and writes would not reach "
                f"it as in eager. Reach it through the module inside fn (e.g. "
                f"args[{module_positions[module_index]}].parameters()), or pass a .clone()"
            )


def _refuse_hooks(modules: list, module_positions: list, lifted: list) -> None:
    """Hooks on fn's modules or their tensors (Note invariant 11).

    The trace would inline what a hook computes once, and the artifact could
    not tell if it is removed later (or repeat its Python side effects).
    """
    named_modules = runtime.named_submodules(module_positions, modules)
    named_tensors = [(f"args[{module_positions[e.names[0][0]]}].{e.names[0][1]}", e.tensor) for e in lifted]
    hook = runtime.find_hook(named_modules, named_tensors)
    if hook is not None:
        raise PrecompileError(
            f"{hook}: precompile cannot keep a hook in step with the artifact (it would be "
            "baked at capture and never run again). Remove it before precompile (handle.remove()); "
            "for weight reparametrizations use torch.nn.utils.parametrize, which fn's trace includes"
        )


# How to make a pytree node type recordable in the artifact's calling convention.
_PYTREE_FIX = (
    "pass plain tuples, lists and dicts instead, or register the type with "
    "torch.utils._pytree.register_pytree_node(cls, flatten_fn, unflatten_fn, "
    "serialized_type_name='pkg.Name', flatten_with_keys_fn=...) (a namedtuple: "
    "torch.utils._pytree._register_namedtuple(cls, serialized_type_name='pkg.Name')), adding "
    "to_dumpable_context/from_dumpable_context if its context is not JSON; the process that "
    "loads the artifact must make the same registration"
)


def _dump_structure(what: str, spec: pytree.TreeSpec) -> str:
    """The artifact records fn's input/output structure as JSON (treespec_dumps)."""
    try:
        return pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError, ValueError) as error:
        raise PrecompileError(
            f"{what}: its pytree structure cannot be recorded ({str(error).rstrip('.')}); {_PYTREE_FIX}"
        ) from None


def _recordable_spec(what: str, spec: pytree.TreeSpec) -> pytree.TreeSpec:
    _dump_structure(what, spec)  # to_literal() dumps it when the artifact is rendered
    return spec


def _check_recordable_structure(what: str, value: Any) -> None:
    try:  # the driver names leaves by key path in its errors
        pytree.tree_flatten_with_path(value)
    except ValueError as error:
        raise PrecompileError(f"{what}: {str(error).rstrip('.')}; {_PYTREE_FIX}") from None
    _dump_structure(what, pytree.tree_structure(value))


def _tensor_spec(t: torch.Tensor, backend: str, free_dims: tuple = ()) -> TensorSpec:
    free = {dim for dim, *_ in free_dims}
    return TensorSpec(
        shape=tuple(None if d in free else size for d, size in enumerate(t.shape)),
        # Free dims: strides vary with the size, so the layout is pinned as a memory format.
        stride=tuple(t.stride()) if backend == "inductor" and not free else None,
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
        free_dims=tuple(free_dims),
        memory_format=_memory_format(t) if free else None,
        requires_grad=t.requires_grad,
    )


def _memory_format(t: torch.Tensor) -> str | None:
    """The first memory format ``t`` is dense in (row-major first), or None."""
    for name, memory_format in runtime.MEMORY_FORMATS.items():
        if t.is_contiguous(memory_format=memory_format):
            return name
    return None


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
        if compat.dim_marks(entry.tensor).marked:
            raise PrecompileError(
                f"parameter/buffer '{entry.names[0][1]}' has dynamic-dim marks; only user "
                "inputs can have free dims: remove the marks from the module's tensors"
            )
    free_dims = []
    for index in args.tensor_indices:
        tensor, what = args.input_leaves[index], args.input_paths[index]
        marks = compat.dim_marks(tensor)
        if marks.dynamic:
            raise PrecompileError(
                f"{what}: dims {sorted(marks.dynamic)} are marked with "
                "mark_dynamic (backed), which precompile does not support; use "
                "torch._dynamo.decorators.mark_unbacked instead"
            )
        marked = marks.unbacked
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
        if _memory_format(tensor) is None:
            raise PrecompileError(
                f"{what}: an input with marked dims must be dense in a memory format (its strides "
                f"depend on the free sizes); got strides {tuple(tensor.stride())}: pass "
                "x.contiguous() or x.contiguous(memory_format=torch.channels_last)"
            )
        bounds, shape_ids = marks.bounds, marks.shape_ids
        for dim in sorted(marked):
            low, high = bounds.get(dim, (None, None))
            free_dims.append(_FreeDim(index, dim, 0 if low is None else low, high, shape_ids.get(dim)))
    return _combine_shape_id_bounds(free_dims, args)


def _combine_shape_id_bounds(free_dims: list, args: _Arguments) -> list:
    """Dims sharing a shape_id are one size: each gets the tightest bounds of all their marks."""
    groups: dict[str, list] = {}
    for free in free_dims:
        if free.shape_id is not None:
            groups.setdefault(free.shape_id, []).append(free)
    for shape_id, members in groups.items():
        low = max(f.low for f in members)
        highs = [f.high for f in members if f.high is not None]
        high = min(highs) if highs else None
        if high is not None and low > high:
            dims = ", ".join(f"{args.input_paths[f.leaf]} dim {f.dim}" for f in members)
            raise PrecompileError(
                f"the marks of shape_id {shape_id!r} ({dims}) have no size in common: min={low} "
                f"> max={high}; fix the bounds given to mark_unbacked"
            )
        for free in members:
            free.low, free.high = low, high
    return free_dims


class _CaptureGuard(TorchDispatchMode):
    """Sees every op fn runs while it is traced, before make_fx records it.

    It refuses, before anything is written, what the graph would not repeat
    (Note invariants 8 and 14): an optimizer's step() / zero_grad() (the
    optimizer holds the caller's tensors, not the traced copies) and in-place
    writes to tensors the trace does not track (the caller's parameters, .grad
    or inputs reached through a closure, a global).  It also notes whether fn
    runs autograd (an op run by the autograd engine): only then do grad mode
    and requires_grad shape the graph (invariant 11).
    """

    # torch.cond & co. pass through to make_fx; the contract refuses them after the trace.
    supports_higher_order_operators = True

    def __init__(self, caller_tensors: dict, optimizer_arguments: bool):
        super().__init__()
        self.caller_tensors = caller_tensors  # storage address -> "args[0].weight (parameter)"
        # Optimizers that are arguments of fn step the traced copies (invariant 15);
        # any other optimizer's writes to the caller's tensors are still refused below.
        self.optimizer_arguments = optimizer_arguments
        self.ran_autograd = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if func is torch.ops.profiler._record_function_enter_new.default and not self.optimizer_arguments:
            _refuse_optimizer_call(args[0])
        self._refuse_untracked_writes(func, args, kwargs)
        if not self.ran_autograd and compat.current_autograd_node() is not None:
            self.ran_autograd = True
        return func(*args, **kwargs)
        if func is torch.ops.profiler._record_function_enter_new.default and not self.optimizer_arguments:
            _refuse_optimizer_call(args[0])
        self._refuse_untracked_writes(func, args, kwargs)
        # The autograd engine's own accumulation (a second backward) is no read.
        if self.produced_grads and compat.current_autograd_node() is None:
            self.note_grad_reads((args, kwargs))
        return func(*args, **kwargs)

    def _refuse_untracked_writes(self, func, args: tuple, kwargs: dict) -> None:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, has_proxy_slot

        written = _written_arguments(func)
        if not written:
            return
        tracer = get_proxy_mode().tracer
        values = [args[i] if i < len(args) else kwargs.get(name) for i, name in written]
        for tensor in pytree.tree_leaves(values):
            if not isinstance(tensor, torch.Tensor) or compat.is_fake(tensor) or has_proxy_slot(tensor, tracer):
                continue
            what = self.caller_tensors.get(_storage_address(tensor)) or (
                f"a tensor of shape {tuple(tensor.shape)} that is neither an argument of fn nor created inside it"
            )
            raise PrecompileError(
                f"fn writes in place ({func}) to {what}{_user_line(traceback.extract_stack())}, through a "
                "reference precompile does not trace: the artifact would not repeat the write. "
                "Update state through fn's module arguments (or its inputs), or do it outside fn"
            )


@functools.lru_cache(maxsize=None)
def _written_arguments(func) -> tuple:
    """(position, name) of the arguments an operator writes in place (`Tensor(a!)`)."""
    return tuple(
        (i, a.name) for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    )


def _refuse_optimizer_call(record_name: str) -> None:
    # torch.optim announces step() / zero_grad() as e.g. "Optimizer.step#SGD.step".
    kind, _, method = record_name.partition("#")
    if kind in ("Optimizer.step", "Optimizer.zero_grad"):
        raise PrecompileError(
            f"fn calls {method}(){_user_line(traceback.extract_stack())}: the optimizer holds the "
            "caller's parameters, not the copies precompile traces, so the artifact would silently "
            "leave the call out. Call optimizer.zero_grad() and optimizer.step() outside fn, around the "
            "precompiled call (the artifact accumulates .grad like loss.backward())"
        )


def _storage_address(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
        return 0


def _caller_tensors(args: _Arguments) -> dict:
    """Storage address -> how the caller passed it, for every tensor fn must not write."""
    described = []
    for entry in args.lifted:
        module_index, fqn = entry.names[0]
        path = f"args[{args.module_positions[module_index]}].{fqn}"
        described.append((entry.tensor, f"{path} ({entry.kind})"))
        if entry.tensor.grad is not None:
            described.append((entry.tensor.grad, f"{path}.grad"))
    described += [(args.input_leaves[i], args.input_paths[i]) for i in args.tensor_indices]
    addresses = {_storage_address(t): what for t, what in described}
    addresses.pop(0, None)  # empty tensors share no storage
    return addresses


@contextlib.contextmanager
def _caller_grads_kept(args: _Arguments):
    """Invariant 8: fn rebinding the caller's .grad (through a closure) is undone and refused."""
    params = [entry for entry in args.lifted if entry.kind == "parameter"]
    grads = [entry.tensor.grad for entry in params]
    try:
        yield
    finally:
        rebound = [(entry, grad) for entry, grad in zip(params, grads) if entry.tensor.grad is not grad]
        for entry, grad in rebound:
            entry.tensor.grad = grad
    if rebound:
        module_index, fqn = rebound[0][0].names[0]
        raise PrecompileError(
            f"fn rebinds args[{args.module_positions[module_index]}].{fqn}.grad through a reference "
            "precompile does not trace (restored): the artifact would not repeat it; set .grad "
            "outside fn"
        )


def _flat_function(fn: Callable, args: _Arguments, recorded: dict) -> Callable:
    """fn over flat tensors: (*state, *user tensors, *free sizes, *trailing) -> (*outputs, *grads).

    The trailing inputs are the optimizers' (invariant 15), then each
    parameter's incoming ``.grad`` (invariant 13).
    """
    num_state, num_tensors = len(args.lifted), len(args.tensor_indices)
    caller_tensors = _caller_tensors(args)
    candidates = _grad_candidates(args)
    num_optimizer_inputs = sum(
        len(lifted.groups) + sum(len(entry) for entry in lifted.state) for lifted in args.optimizers
    )

    def flat_fn(*flat):
        state = flat[:num_state]
        tensors = flat[num_state : num_state + num_tensors]  # free sizes follow, unused
        trailing = flat[len(flat) - num_optimizer_inputs - len(candidates) :]
        optimizer_inputs, incoming_grads = trailing[:num_optimizer_inputs], trailing[num_optimizer_inputs:]
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
        guard = _CaptureGuard(caller_tensors, bool(args.optimizers))
        with contextlib.ExitStack() as stack:
            for module, mapping in zip(args.modules, mappings):
                stack.enter_context(compat.reparametrized(module, mapping))
            if args.optimizers:
                stack.enter_context(_redirect_optimizers(args, state, optimizer_inputs))
            for index, grad in zip(candidates, incoming_grads):
                state[index].grad = grad
            with torch.enable_grad(), guard:
                result = fn(*call_args)
            _check_state_not_rebound(args.modules, mappings)
        out_leaves, out_spec = pytree.tree_flatten(result)
        recorded["ran_autograd"] = guard.ran_autograd
        recorded["out_spec"], recorded["out_leaves"] = out_spec, out_leaves
        _check_gradients_reach_only_parameters(args, state, tensors)
        recorded["grad_state"] = [i for i in candidates if state[i].grad is not None]
        recorded["grads_cleared"] = [i for i in candidates if state[i].grad is None]
        outputs = [leaf for leaf in out_leaves if isinstance(leaf, torch.Tensor)]
        return (*outputs, *[state[i].grad for i in recorded["grad_state"]])

    return flat_fn


def _trace_real(flat_fn: Callable, args: _Arguments, decompositions) -> tuple:
    """Real-mode make_fx on clones: every size is static (Note invariant 3, 8)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    inputs = [_clone_leaf(e.tensor) for e in args.lifted] + [
        _clone_leaf(args.input_leaves[i]) for i in args.tensor_indices
    ] + _trailing_example_inputs(args)
    try:
        graph = make_fx(flat_fn, decomposition_table=decompositions, record_stack_traces=True)(*inputs)
    except PrecompileError:
        raise
    except RuntimeError as error:
        # make_fx's "value out of a tracing tensor with aten._local_scalar_dense"
        if "_local_scalar_dense" not in str(error):
            raise
        raise _data_dependent_error(error) from None
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
            if not attempt.involves_free_dim(error.cond):  # `if x.sum() > 0:` after .item()
                raise _data_dependent_error(error) from None
            merged = attempt.mergeable(error.cond)
            if merged is None:
                raise attempt.guard_error(error) from None
            keep, drop = merged
            groups = {i: groups[keep] if g == groups[drop] else g for i, g in groups.items()}
    raise AssertionError("unreachable: each retry merges two shape groups")


def _data_dependent_error(error: Exception) -> PrecompileError:
    """fn turned a traced tensor into a Python value: control flow on tensor data."""
    return PrecompileError(
        f"fn uses the value of a tensor as a Python value{_user_line(traceback.extract_tb(error.__traceback__))} "
        "(`if tensor:`, .item(), bool(), .tolist()): the artifact would bake the example's "
        "outcome. Write the branch with torch.where(cond, a, b), or compute the value outside fn "
        "and pass it as a Python input (baked and checked at every call)"
    )


class _SymbolicAttempt:
    """One symbolic trace: fakes in a fresh ShapeEnv, one symint per marked dim."""

    def __init__(self, args: _Arguments, free_dims: list, groups: dict):
        self.args, self.free_dims = args, free_dims
        self.shape_env, self.fake_mode = compat.symbolic_fake_mode()

        def fakify(tensor, name, free=()):
            dims = {f.dim: (groups[i], f.low, f.high) for i, f in free}
            fake = compat.fake_with_unbacked_dims(self.fake_mode, tensor.detach(), name, dims)
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
        self.trailing = [fakify(t, f"grad{i}") for i, t in enumerate(_trailing_example_inputs(args))]
        compat.forget_pending_unbacked_symbols(self.shape_env)

    def trace(self, flat_fn: Callable, decompositions) -> tuple:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

        graph = make_fx(
            flat_fn, decomposition_table=decompositions, tracing_mode="symbolic", record_stack_traces=True
        )(*self.inputs, *self.sizes, *self.trailing)
        self.refuse_specialization()
        insert_deferred_runtime_asserts(graph, self.shape_env, "torch.compiler.precompile")
        graph.recompile()
        graph, constants = _enforce_contract(graph)
        example = (
            [t.detach() for t in self.inputs]
            + list(self.sizes)
            + [t.detach() for t in self.trailing]
            + [self.fake_mode.from_tensor(c) for c in constants]
        )
        return graph, example, self.size_sources(), constants

    def describe(self, index: int) -> str:
        free = self.free_dims[index]
        return f"{self.args.input_paths[free.leaf]} dim {free.dim}"

    def refuse_specialization(self) -> None:
        """Every requirement fn put on a free dim must be a mark bound or a shape group."""
        for symbol, index in self.symbols.items():
            replaced = compat.shape_env_replacements(self.shape_env).get(symbol)
            if replaced is not None and self.shape_env.simplify(replaced) not in self.symbols:
                raise PrecompileError(
                    f"fn specializes {self.describe(index)} (marked with mark_unbacked) to "
                    f"{replaced}, e.g. through .view() with literal sizes; use -1 or sizes derived "
                    "from the input's .shape, or remove the mark"
                )
        for requirement in compat.shape_env_deferred_asserts(self.shape_env):
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

    def involves_free_dim(self, cond) -> bool:
        marked = {str(symbol) for symbol in self.symbols}
        return any(str(symbol) in marked for symbol in getattr(cond, "free_symbols", ()))

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
        where = _user_line(traceback.extract_tb(error.__traceback__))
        return PrecompileError(
            f"fn needs the size of {' and '.join(involved) or 'a marked dim'} (marked with "
            f"mark_unbacked) to decide {error.cond}{where}: a free dim cannot be guarded on. "
            "Give the mark bounds that decide it (min=1 rules out empty sizes, which .view(n, -1) "
            "and .flatten() must exclude), remove the mark to specialize it, or avoid branching "
            "on / reshaping with that size"
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
    # The public flags() sets every MKLDNN flag it is given; None leaves
    # deterministic, allow_tf32 and fp32_precision as they are.
    with torch.backends.mkldnn.flags(enabled=False, deterministic=None, allow_tf32=None, fp32_precision=None):
        yield


@contextlib.contextmanager
def _seen_as_export():
    """Present the trace to model libraries as torch.export's non-strict capture does.

    Libraries skip data-dependent shortcuts (``if mask.all(): mask = None``) when
    ``torch.compiler.is_compiling()`` / ``is_exporting()`` is true; without
    them a padding mask would be read as data and fail the trace, or be baked.
    Same flags, set by the same helper torch.export uses; restored on exit.
    """
    with compat.compiling_and_exporting():
        yield


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
    compat.record_frames_of(fn)  # the rendered eager graph names fn's lines (Note invariant 6)
    with _without_mkldnn(), _seen_as_export(), _caller_grads_kept(args), _ModuleReads(args) as module_reads:
        if free_dims:
            graph, example, sizes, constants = _trace_symbolic(flat_fn, args, free_dims, decompositions)
        else:
            graph, example, sizes, constants = _trace_real(flat_fn, args, decompositions)
    first_trailing = len(args.lifted) + len(args.tensor_indices) + len(sizes)
    optimizers, grads = _finish_trailing_inputs(graph, example, args, recorded, backend, first_trailing)

    outputs, output_tensors = [], []
    for i, leaf in enumerate(recorded["out_leaves"]):
        if isinstance(leaf, torch.Tensor):
            outputs.append(LeafSpec(graph_output=len(output_tensors)))
            output_tensors.append(_output_spec(leaf))
        else:
            _check_value_leaf(f"fn's output leaf {i}", leaf)
            outputs.append(LeafSpec(value=leaf))

    mutated = _mutated_inputs(graph, len(args.lifted) + len(args.tensor_indices))
    _refuse_aliased_examples(args, mutated)
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
                submodules=tuple(
                    (name, sub.training if module_reads.read_mode(sub) else None) for name, sub in m.named_modules()
                ),
                classes=tuple(runtime.class_name(type(sub)) for _, sub in m.named_modules()),
                attributes=tuple(
                    (name, attribute, value)
                    for name, sub in m.named_modules()
                    for attribute, value in module_reads.read_attributes(sub)
                ),
            )
            for position, m in zip(args.module_positions, args.modules)
        ),
        state=tuple(
            StateSpec(kind=e.kind, names=tuple(e.names), tensor=_tensor_spec(e.tensor, backend))
            for e in args.lifted
        ),
        input_spec=args.input_spec,
        inputs=tuple(
            LeafSpec(tensor=_tensor_spec(leaf, backend, tuple(free_by_leaf.get(i, ()))))
            if isinstance(leaf, torch.Tensor)
            else LeafSpec(value=leaf)
            for i, leaf in enumerate(args.input_leaves)
        ),
        output_spec=_recordable_spec("fn's output", recorded["out_spec"]),
        outputs=tuple(outputs),
        grad_state=grads["grad_state"],
        constants=tuple(_constant_spec(c) for c in constants),
        # Autograd in the graph (backward(), autograd.grad) makes grad mode and
        # every requires_grad part of the contract; a pure forward computes the
        # same values either way.
        needs_grad=recorded["ran_autograd"],
        mutated=tuple(sorted(mutated)),
        default_dtype=str(torch.get_default_dtype()).removeprefix("torch."),
        autocast=runtime.autocast_state(),
        optimizers=optimizers,
        grad_inputs=grads["grad_inputs"],
        grads_assigned=grads["grads_assigned"],
        grads_cleared=grads["grads_cleared"],
        output_tensors=tuple(output_tensors),
    )
    return _Capture(graph, convention, example)


def _output_spec(t: torch.Tensor) -> TensorSpec:
    """What an output tensor of the trace is: a size that depends on free dims (a SymInt) is None."""
    return TensorSpec(
        shape=tuple(size if type(size) is int else None for size in t.shape),
        stride=None,
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
    )


def _mutated_inputs(graph: torch.fx.GraphModule, count: int) -> set:
    """Indices among the first ``count`` placeholders that the graph writes in place.

    A write reaches a placeholder through any chain of views or in-place ops
    (whose results alias their first argument).
    """
    placeholders = list(graph.graph.find_nodes(op="placeholder"))[:count]
    base = {node: index for index, node in enumerate(placeholders)}  # node -> placeholder it aliases
    mutated = set()
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:  # an element of split() / unbind()
            if node.args[0] in base:
                base[node] = base[node.args[0]]
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        values = list(zip(schema.arguments, node.args)) + [
            (a, node.kwargs[a.name]) for a in schema.arguments if a.name in node.kwargs
        ]
        for argument, value in values:
            if argument.alias_info is not None and argument.alias_info.is_write:
                for arg in value if isinstance(value, (list, tuple)) else [value]:
                    if arg in base:
                        mutated.add(base[arg])
        if any(r.alias_info is not None for r in schema.returns) and node.args and node.args[0] in base:
            base[node] = base[node.args[0]]
    return mutated


def _refuse_aliased_examples(args: _Arguments, mutated: set) -> None:
    """Example tensors sharing memory where one is written: the clones traced do not.

    Capture traces each example on its own clone, so the graph assumes
    distinct memory; that is only what fn computes when nothing they share is
    written.  The driver refuses such aliasing at every call (Note invariant 11).
    """
    tensors = [e.tensor for e in args.lifted] + [args.input_leaves[i] for i in args.tensor_indices]
    names = [f"parameter/buffer '{e.names[0][1]}'" for e in args.lifted] + [
        args.input_paths[i] for i in args.tensor_indices
    ]
    for i in sorted(mutated):
        for j in range(len(tensors)):
            if j != i and compat.is_alias_of(tensors[i], tensors[j]):
                raise PrecompileError(
                    f"{names[i]} and {names[j]} share memory and fn writes {names[i]} in place; "
                    "precompile traces every example tensor separately and cannot reproduce "
                    "that: pass distinct tensors (e.g. .clone()) at capture and at every call"
                )


class _ModuleReads:
    """Records what of each submodule fn reads while it is traced: ``training``
    flags and plain attributes (``eps``, ``p``, ``momentum``: values in the
    instance ``__dict__`` that a calling convention can hold as literals).

    Only what was read can have shaped the graph, so only that is recorded and
    checked at every call (Note invariant 11).  Each submodule's class is
    swapped, for the trace only, for a subclass that logs reads; a module whose
    class cannot be swapped counts as having read its flag.  During the trace
    ``type(module)`` is that subclass (``isinstance`` still holds, names are
    kept).  fn changing a mode (``model.eval()`` inside fn) is refused: the
    artifact would not reproduce that side effect.
    """

    _probes: dict = {}  # original class -> its probe subclass
    _tracing = threading.local()  # .reads: {id(module): names read} of this thread's capture

    def __init__(self, args: _Arguments):
        self.modules = {}  # id -> (path, module, class, mode), first path of shared submodules
        for path, sub in runtime.named_submodules(args.module_positions, args.modules):
            self.modules.setdefault(id(sub), (path, sub, type(sub), sub.training))
        self.reads: dict = collections.defaultdict(set)

    def read_mode(self, module: torch.nn.Module) -> bool:
        return "training" in self.reads.get(id(module), ())

    def read_attributes(self, module: torch.nn.Module) -> list:
        """(name, value) of the plain attributes fn read, in name order."""
        values = vars(module)
        return [
            (name, values[name])
            for name in sorted(self.reads.get(id(module), ()))
            if name != "training" and name in values and runtime.is_literal(values[name])
        ]

    def __enter__(self) -> "_ModuleReads":
        self._tracing.reads = self.reads
        for _, sub, cls, _ in self.modules.values():
            try:
                sub.__class__ = self._probe(cls)
            except TypeError:  # __slots__, script modules, a class's own `training`: assume read
                self.reads[id(sub)].add("training")
        return self

    def __exit__(self, *exc_info) -> None:
        self._tracing.reads = None
        changed = []
        for path, sub, cls, mode in self.modules.values():
            sub.__class__ = cls
            if sub.training != mode:
                changed.append(path)
                sub.training = mode  # capture leaves the caller's model as it was
        if changed and exc_info[0] is None:
            raise PrecompileError(
                f"fn changes the train/eval mode of {', '.join(changed[:5])} (it calls .eval() or "
                ".train()); the artifact would not reproduce that: set the mode before calling fn"
            )

    @classmethod
    def _note_read(cls, module: torch.nn.Module, name: str) -> None:
        reads = getattr(cls._tracing, "reads", None)
        if reads is not None:  # None: read by another thread, not by fn's trace
            reads[id(module)].add(name)

    @classmethod
    def _probe(cls, module_class: type) -> type:
        if any("training" in vars(k) for k in module_class.__mro__):
            raise TypeError(f"{module_class.__name__} defines its own `training`")
        probe = cls._probes.get(module_class)
        if probe is None:
            get_attribute = module_class.__getattribute__

            def get_training(module):
                cls._note_read(module, "training")
                return module.__dict__["training"]

            def set_training(module, value):
                module.__dict__["training"] = value

            def getattribute(module, name):
                value = get_attribute(module, name)
                if name[0] != "_" and name in get_attribute(module, "__dict__"):
                    cls._note_read(module, name)
                return value

            probe = type(
                module_class.__name__,
                (module_class,),
                {"training": property(get_training, set_training), "__getattribute__": getattribute},
            )
            probe.__module__, probe.__qualname__ = module_class.__module__, module_class.__qualname__
            cls._probes[module_class] = probe
        return probe


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
    if compat.optimizer_has_step_hooks(optimizer):
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


def _trailing_example_inputs(args: _Arguments) -> list:
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
    # Incoming grads: empty, not zeros, so a fn that never touches .grad (a
    # forward) costs no resident memory (untouched pages); values are not read.
    return inputs + [torch.empty_like(args.lifted[i].tensor) for i in _grad_candidates(args)]


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
    compiling = compat.compiling_flag()
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
        yield
    finally:
        compat.set_compiling_flag(compiling)
        for handle in handles:
            handle.remove()
        for optimizer, original_state, groups in saved:
            optimizer.state = original_state
            for group, original in zip(optimizer.param_groups, groups):
                group.clear()
                group.update(original)


def _set_compiling(value: bool) -> None:
    compat.set_compiling_flag(value)


_PROFILER_OPS = ("profiler._record_function_enter_new", "profiler._record_function_exit")


def _finish_trailing_inputs(
    graph: torch.fx.GraphModule, example: list, args: _Arguments, recorded: dict, backend: str, position: int
) -> tuple:
    """Settle the inputs after the sizes (optimizers', incoming grads): keep only what fn read.

    ``position`` is the first of them among the placeholders.  Returns the
    OptimizerSpecs and the grad bookkeeping of the convention.
    """
    placeholders = list(graph.graph.find_nodes(op="placeholder"))
    optimizers, unused, position = _finish_optimizer_inputs(graph, placeholders, args, backend, position)
    grad_nodes = placeholders[position : position + len(_grad_candidates(args))]
    grads = _finish_grad_inputs(graph, grad_nodes, args, recorded)
    unused.update(position + i for i, node in enumerate(grad_nodes) if not node.users)
    for i in sorted(unused, reverse=True):
        graph.graph.erase_node(placeholders[i])
        del example[i]
    graph.recompile()
    return optimizers, grads


def _finish_optimizer_inputs(graph: torch.fx.GraphModule, placeholders: list, args: _Arguments, backend: str, position: int) -> tuple:
    """Drop the step's profiler ranges; find the optimizer state inputs fn never read.

    State of a parameter that got no gradient (eager creates none) is an
    unused placeholder: the runtime does not create it.
    """
    if not args.optimizers:
        return (), set(), position
    for node in reversed(list(graph.graph.nodes)):
        if node.op == "call_function" and str(node.target).startswith(_PROFILER_OPS):
            graph.graph.erase_node(node)
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
    return tuple(specs), unused, position


def _finish_grad_inputs(graph: torch.fx.GraphModule, placeholders: list, args: _Arguments, recorded: dict) -> dict:
    """Decide, per parameter, how the runnable writes ``.grad`` (Note invariant 13).

    fn was traced with each parameter's ``.grad`` set to its own graph input,
    the incoming gradient, so every use fn makes of it is in the graph.  Then:

    - ``.grad`` still that input, untouched: fn left it alone; no output.
    - its one use is backward's accumulation ``incoming.add_(g)``: output
      ``g`` and let the runnable accumulate like eager (assign when None,
      else add), with no incoming input (the common training step).
    - ``.grad`` None at the end: fn cleared it (``zero_grad()`` after backward).
    - otherwise the graph's gradient is final and is assigned: fn cleared the
      incoming one before backward (its input is unused), or read it
      (``clip_grad_norm_`` over accumulated gradients; the input stays).
    """
    output = graph.graph.output_node()
    results = list(output.args[0])
    grad_state = list(recorded["grad_state"])
    first = len(results) - len(grad_state)
    assigned = []
    for index, node in zip(_grad_candidates(args), placeholders):
        if index not in grad_state:
            continue
        slot = first + grad_state.index(index)
        produced = results[slot]
        if produced is node:
            del results[slot]
            grad_state.remove(index)
        elif _is_plain_accumulation(produced, node, results):
            results[slot] = produced.args[1]
            output.args = (tuple(results),)
            graph.graph.erase_node(produced)
        else:
            assigned.append(index)
    output.args = (tuple(results),)
    return {
        "grad_state": tuple(grad_state),
        "grads_assigned": tuple(assigned),
        "grads_cleared": tuple(recorded["grads_cleared"]),
        "grad_inputs": tuple(i for i, node in zip(_grad_candidates(args), placeholders) if node.users),
    }


def _is_plain_accumulation(produced: Any, incoming: torch.fx.Node, results: list) -> bool:
    """``produced`` is autograd's ``incoming.add_(g)`` and nothing else reads either."""
    return (
        isinstance(produced, torch.fx.Node)
        and produced.target in (torch.ops.aten.add_.Tensor, torch.ops.aten.add.Tensor)
        and len(produced.args) == 2
        and not produced.kwargs
        and produced.args[0] is incoming
        and isinstance(produced.args[1], torch.fx.Node)
        and len(incoming.users) == 1
        and list(produced.users) == [incoming.graph.output_node()]
        and results.count(produced) == 1
    )


# ---------------------------------------------------------------------------
# Enforce: the graph must only depend on its inputs (Note invariants 2, 5).
# ---------------------------------------------------------------------------


_TORCH_DIR = os.path.dirname(torch.__file__)
# This module and the driver sit outside torch's directory in an editable install.
_PRECOMPILE_FILES = (os.path.abspath(__file__), os.path.abspath(runtime.__file__))


def _is_user_file(filename: str) -> bool:
    """fn's own code: not torch's, not precompile's, not FX-generated."""
    return not (
        filename.startswith(_TORCH_DIR) or filename in _PRECOMPILE_FILES or filename.startswith("<eval_with_key")
    )


def _user_line(frames: list) -> str:
    """' at file:line (code)' for the innermost frame of fn's own code, or ''."""
    user = [f for f in frames if _is_user_file(f.filename)]
    return f" at {user[-1].filename}:{user[-1].lineno} ({user[-1].line})" if user else ""


def _source_of(node: torch.fx.Node) -> str:
    # The innermost frame of user code: skip torch's own files and FX's generated code.
    frame = compat.innermost_frame(node.meta.get("stack_trace"), _is_user_file)
    return f' (at File "{frame[0]}", line {frame[1]}, in {frame[2]})' if frame else ""


def _enforce_contract(graph: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, list]:
    """Refuse live state, effects and control flow; lift tensor literals to inputs."""
    calls = [n for n in graph.graph.nodes if n.op == "call_function"]
    for node in calls:
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            raise PrecompileError(
                f"fn uses the higher-order operator {node.target.name()}{_source_of(node)} "
                "(control flow such as torch.cond / while_loop), which precompile does not "
                "support; write the branch as plain Python (it is specialized to the example "
                "inputs) or keep it outside fn"
            )
        if compat.has_effects(node.target):
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
    graph = capture.graph.graph
    _name_graph_inputs(graph, capture.convention)
    _keep_user_frames(graph)
    graph.eliminate_dead_code()  # keeps in-place and random ops (Node.is_impure)
    # verbose: each node's shape/dtype and, where capture recorded one, its source line.
    code = graph.python_code(root_module="self", verbose=True, expanded_def=True)
    imports, unknown = compat.fx_builtin_imports(code.globals)
    if unknown:
        raise PrecompileError(f"the captured graph refers to globals the artifact cannot render: {unknown}")
    source = re.sub(r"\bdef forward\(\s*self,?\s*", "def eager_graph(\n    ", code.src.strip(), count=1)
    graph_code = (
        "# The captured ATen graph: inputs in the calling convention's order (p_ parameters,\n"
        "# b_ buffers, then fn's tensors by argument), each value's dtype[shape], and the\n"
        "# source line of fn or the model that produced it where capture recorded one.\n"
        + "\n".join(imports)
        + "\n\n\n"
        + source
        + "\n"
    )
    return _Lowered(graph_code, '_run_graph = _driver["eager_runner"](eager_graph)\n')


def _name_graph_inputs(graph: torch.fx.Graph, convention: CallingConvention) -> None:
    """Name each placeholder after what the driver passes there (FX makes them identifiers)."""
    placeholders = list(graph.find_nodes(op="placeholder"))
    names = _graph_input_names(convention)
    if len(names) != len(placeholders):
        raise AssertionError(
            f"the calling convention names {len(names)} graph inputs, the graph has {len(placeholders)}"
        )
    for node, name in zip(placeholders, names):
        compat.rename_node(node, name)
        node.target = node.name  # FX renders a placeholder's parameter from its target


def _graph_input_names(convention: CallingConvention) -> list[str]:
    """What each graph input is, in CallingConvention's input order."""

    def fqn(state_index: int) -> str:
        return convention.state[state_index].names[0][1]

    user_spec = convention.input_spec
    paths = [
        f"args_{convention.user_positions[position.idx]}{pytree.keystr(tuple(rest))}"
        for (position, *rest), _ in pytree.tree_flatten_with_path(
            pytree.tree_unflatten([None] * user_spec.num_leaves, user_spec)
        )[0]
    ]
    names = [f"{'p' if s.kind == 'parameter' else 'b'}_{fqn(i)}" for i, s in enumerate(convention.state)]
    names += [paths[i] for i, leaf in enumerate(convention.inputs) if leaf.tensor is not None]
    names += [f"size_{paths[leaf]}_dim{dim}" for leaf, dim in convention.sizes]
    for optimizer in convention.optimizers:
        names += [f"lr_group{g}" for g in range(len(optimizer.groups))]
        for group, index in optimizer.stepped:
            names += [f"{key}_{fqn(optimizer.groups[group][index])}" for key in optimizer.keys]
    names += [f"grad_{fqn(i)}" for i in convention.grad_inputs]
    names += [f"constant{i}" for i in range(len(convention.constants))]
    return names


def _keep_user_frames(graph: torch.fx.Graph) -> None:
    """Reduce each node's recorded stack trace to its innermost frame in fn's or the model's code.

    FX's verbose codegen shows a trace's innermost frame: for an nn.Linear that
    is torch's linear.py, not the model line that called it.
    """
    for node in graph.nodes:
        frame = compat.innermost_frame(node.stack_trace, _is_user_file)
        node.stack_trace = "".join(traceback.format_list([frame])) if frame else None


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


def _inductor_config(capture: _Capture) -> dict:
    config = dict(_INDUCTOR_CONFIG)
    if capture.convention.sizes:
        # Free (unbacked) dims.  Layout optimization makes convolutions
        # channels_last, and the stride Inductor predicts for their output is
        # then contiguous while the kernel returns channels_last: every call
        # failed its stride assert.  Constant folding of uniform values
        # (`ones_like(loss)` in backward) asks `numel == 0`, which a mark
        # without min=1 cannot decide.
        config["layout_optimization"] = False
        config["joint_graph_constant_folding"] = False
    return config


def _views_as_reshapes(graph: torch.fx.GraphModule) -> None:
    """Turn each ``aten.view`` whose aliasing nothing observes into ``aten.reshape``.

    The real-mode trace records ``view`` where the real kernels happened to
    return compatible strides; Inductor's decompositions may not (its ``cat``
    drops an empty input and keeps the other's strides), and AOTAutograd's
    re-trace then fails with "Cannot view a tensor ...".  ``reshape`` computes
    the same values and is a view whenever one is possible; only a view in an
    alias set that something writes to must stay a view.
    """
    root, written = _alias_sets(graph)
    for node in graph.graph.find_nodes(op="call_function", target=torch.ops.aten.view.default):
        if root(node) not in written:
            node.target = torch.ops.aten.reshape.default
    graph.recompile()


def _fill_randoms_in_eager_memory_order(graph: torch.fx.GraphModule) -> None:
    """Make random fills draw into memory laid out as eager laid it out.

    ``bernoulli_`` & co. draw numbers in memory order, so a dropout mask
    ``empty_like(x).bernoulli_(p)`` depends on x's strides.  Inductor clones
    the fill's target contiguous, which gave other masks than eager under the
    same seed wherever x was not contiguous (nn.MultiheadAttention's output).
    Fill a contiguous tensor in eager's memory order, then permute it to x's
    strides: the same numbers land in the same elements on both backends.
    """
    aten = torch.ops.aten
    fills = {
        aten.bernoulli_.float, aten.bernoulli_.Tensor, aten.uniform_.default, aten.normal_.default,
        aten.exponential_.default, aten.random_.default, aten.geometric_.default,
        aten.log_normal_.default, aten.cauchy_.default,
    }
    for node in graph.graph.find_nodes(op="call_function", target=aten.empty_like.default):
        value = node.meta.get("val")
        (fill,) = node.users if len(node.users) == 1 else (None,)
        if (
            fill is None
            or fill.target not in fills
            or value is None
            or not all(isinstance(v, int) for v in (*value.shape, *value.stride()))
            or value.is_contiguous()
            or not compat.is_non_overlapping_and_dense(value)
        ):
            continue
        order = sorted(range(value.dim()), key=lambda d: -value.stride(d))  # outermost first
        inverse = sorted(range(value.dim()), key=order.__getitem__)
        with graph.graph.inserting_before(node):
            base = graph.graph.call_function(
                aten.empty.memory_format,
                ([value.shape[d] for d in order],),
                {"dtype": value.dtype, "device": value.device},
            )
        fill.args = (base, *fill.args[1:])
        with graph.graph.inserting_after(fill):
            permuted = graph.graph.call_function(aten.permute.default, (fill, inverse))
        fill.replace_all_uses_with(permuted, delete_user_cb=lambda user: user is not permuted)
        graph.graph.erase_node(node)
    graph.recompile()


def _alias_sets(graph: torch.fx.GraphModule) -> tuple[Callable, set]:
    """Union the nodes that share storage (per op schemas): (root of a node, written roots)."""
    import operator

    parent: dict = {}

    def root(node):
        while parent.get(node, node) is not node:
            node = parent[node]
        return node

    written = []
    for node in (n for n in graph.graph.nodes if n.op == "call_function"):
        if node.target is operator.getitem:  # an element of a multi-output op aliases it
            parent[root(node)] = root(node.args[0])
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        bound = dict(zip((a.name for a in schema.arguments), node.args)) | dict(node.kwargs)
        for argument in schema.arguments:
            if argument.alias_info is None:
                continue
            # Conservatively, the outputs alias every argument with alias info
            # (view ops, in-place and out= ops; `Tensor(a)[]` returns of split).
            for value in pytree.tree_leaves(bound.get(argument.name)):
                if isinstance(value, torch.fx.Node):
                    parent[root(node)] = root(value)
                    if argument.alias_info.is_write:
                        written.append(value)
    return root, {root(node) for node in written}


def _refuse_tensor_subclasses(capture: _Capture) -> None:
    # AOTAutograd would unwrap them into their inner tensors, a calling
    # convention the driver does not speak.
    state = capture.convention.state
    for i, tensor in enumerate(capture.example_inputs):
        if isinstance(tensor, torch.Tensor) and compat.is_traceable_wrapper_subclass(tensor):
            what = f"{state[i].kind} '{state[i].names[0][1]}'" if i < len(state) else "an input of fn"
            raise PrecompileError(
                f"{what} is a {type(tensor).__name__}: backend='inductor' does not support tensor "
                "subclasses (DTensor, as from fully_shard or tensor parallelism) yet; use "
                "backend='eager', or pass plain tensors (e.g. DTensor.to_local())"
            )


def _lower_inductor(capture: _Capture) -> _Lowered:
    # torch 2.13 has no compile_to_python: keep the module Inductor generates
    # for the single inner graph through an inner_compile hook.
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    num_inputs = len(capture.example_inputs)
    num_outputs = sum(1 for leaf in capture.convention.outputs if leaf.graph_output is not None) + len(
        capture.convention.grad_state
    )
    _refuse_tensor_subclasses(capture)
    _views_as_reshapes(capture.graph)
    _fill_randoms_in_eager_memory_order(capture.graph)
    with torch.no_grad():
        try:
            compiled = compat.inductor_compile(capture.graph, capture.example_inputs, _inductor_config(capture))
        except GuardOnDataDependentSymNode as error:
            raise PrecompileError(
                f"backend='inductor' needs to decide {error.cond} about a dim marked with "
                "mark_unbacked while optimizing the graph; give the mark bounds that decide it "
                "(e.g. mark_unbacked(x, 0, min=1)), remove the mark, or use backend='eager'"
            ) from error
    if len(compiled) != 1 or compiled[0][1:] != (num_inputs, num_outputs):
        signature = [(inputs, outputs) for _, inputs, outputs in compiled]
        raise PrecompileError(
            "backend='inductor' cannot reproduce this graph faithfully: AOTAutograd changed its "
            f"calling signature (expected one graph with {num_inputs} inputs and {num_outputs} "
            f"outputs, got {signature}); this happens with metadata mutations such as x.t_() or "
            "x.resize_(): avoid them in fn, or use backend='eager'"
        )
    if not hasattr(compiled[0][0], "source_code"):
        # Inductor generates no module for a graph without compute (fn returns an
        # input, detached or viewed): the captured graph itself is the program.
        return _lower_eager(capture)
    source = compat.without_input_asserts(_strip_stand_in_imports(compiled[0][0].source_code))
    graph_code = (
        "# Inductor's generated module, verbatim but for its imports from torch._inductor\n"
        "# (a 2 s import): the driver binds stand-ins for them in the forward section below;\n"
        "# and for its graph-input size/stride asserts, which the driver's guards perform.\n"
        f"EXTERN_KERNELS = {pprint.pformat(_extern_kernel_table(source))}\n\n\n"
        f"{_DEFERRED_KERNELS}\n\n{source}"
    )
    bind = (
        '_kernel_loader = _driver["bind_inductor_graph"](globals(), EXTERN_KERNELS, _kernel_files)\n'
        "_run_graph = call  # Inductor's call(list_of_inputs) -> outputs\n"
    )
    return _Lowered(graph_code, bind)


# Stands in for Inductor's AsyncCompile while the graph section runs, before the
# driver: kernels are loaded when the forward section binds them.
_DEFERRED_KERNELS = '''\
class PendingKernel(tuple):
    """(argtypes, C++ source) of a kernel Inductor's module requests; bind_inductor_graph loads it."""


class AsyncCompile:
    def cpp_pybinding(self, argtypes, source):
        return PendingKernel((argtypes, source))

    def wait(self, scope):
        pass
'''


def _strip_stand_in_imports(source: str) -> str:
    lines = source.splitlines(keepends=True)
    drop = set()
    for node in _parse(source).body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith(compat.INDUCTOR_MODULE)
            and all((alias.asname or alias.name) in compat.INDUCTOR_STAND_INS for alias in node.names)
        ):
            drop.update(range(node.lineno - 1, node.end_lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _extern_kernel_table(source: str) -> dict[str, str]:
    """Map each extern kernel the graph calls to a torch name that resolves without Inductor."""
    extern_kernels = compat.inductor_extern_kernels()
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


# ---------------------------------------------------------------------------
# Render: python_code = header (calling convention) + graph + driver + forward.
# ---------------------------------------------------------------------------


# After the header, python_code is sections of plain code in reading order, each
# opened by its marker line.  Run alone, they share one namespace; load() compiles
# them one by one and skips the driver when the installed one is the same text.
_SECTIONS = ("graph", "driver", "forward")


def _marker(section: str) -> str:
    return f"\n# {'=' * 20} {section} {'=' * 20}\n"


@functools.lru_cache(maxsize=None)
def _driver_source() -> str:
    """The installed driver's source: what artifacts embed, and what load() compares them with."""
    with open(runtime.__file__, encoding="utf-8") as f:
        return f.read()


def _describe_call(convention: CallingConvention) -> str:
    """One comment line per argument, for the artifact's header."""
    lines = []
    modules = {m.position: m for m in convention.modules}
    optimizers = {o.position: o for o in convention.optimizers}
    spec = convention.input_spec
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
    if leaf.is_value:
        return f"{leaf.value!r} (baked)"
    t = leaf.tensor
    return f"Tensor{t.describe_shape()} {t.dtype} {t.device}"


def _render(convention: CallingConvention, lowered: _Lowered) -> str:
    header = f"""\
# torch.compiler.precompile artifact -- format {convention.format_version}, backend {convention.backend!r}.
# Generated by torch {torch.__version__}. Do not edit: the cache is bound to this
# exact text by its sha256, and the constants below are the calling convention.
#
# Load it with:   fn = torch.compiler.precompile.load(python_code, cache)
# Or run it alone (no cache; any kernels are compiled on first use):
#     namespace = {{}}
#     exec(open("this_file.py").read(), namespace)
#     out = namespace["forward"](model, *inputs)
#
# Sections: the constants, then {", ".join(_SECTIONS)}.
# Calling convention (positional arguments only):
{_describe_call(convention)}
# Pass the model(s) again at every call; no weights are stored here.

{_NO_BYTECODE}
CALLING_CONVENTION = {pprint.pformat(convention.to_literal(), width=100, sort_dicts=False)}
"""
    forward = (
        "# Binds the graph to the driver.  load() passes its driver (the installed\n"
        "# torch._precompile_runtime when it is the driver section's exact text), the\n"
        "# cached kernels' files and the calling convention it already decoded and\n"
        "# validated; run alone, the driver section above, no files, and it is decoded here.\n"
        '_driver = globals().get("__precompile_driver__") or globals()\n'
        '_kernel_files = globals().get("__precompile_kernel_files__", {})\n'
        + lowered.bind_code
        + '_convention = globals().get("__precompile_convention__") or _driver["CallingConvention"].from_literal(\n'
        "    CALLING_CONVENTION\n"
        ")\n"
        'forward = _driver["PrecompiledFunction"](\n'
        '    _convention, _run_graph, _driver["materialize_constants"](_convention.constants)\n'
        ")\n"
    )
    sections = {"graph": lowered.graph_code, "driver": _driver_source(), "forward": forward}
    _check_names_disjoint(header, sections)
    return header + "".join(_marker(name) + sections[name] for name in _SECTIONS)


def _check_names_disjoint(header: str, sections: dict[str, str]) -> None:
    """Run alone, the sections share one namespace: the driver must not rebind a name the others bind."""
    driver = _driver_names()
    others: dict[str, str | None] = {}
    for source in (header, sections["graph"], sections["forward"]):
        others.update(_top_level_names(source))
    # The same import twice is harmless; anything else would rebind the other's name.
    clashes = sorted(
        name for name in driver.keys() & others.keys() if driver[name] is None or driver[name] != others[name]
    )
    if clashes:
        raise AssertionError(f"the driver section rebinds names the artifact's other sections bind: {clashes}")


@functools.lru_cache(maxsize=None)
def _driver_names() -> dict[str, str | None]:
    return _top_level_names(_driver_source())


def _top_level_names(source: str) -> dict[str, str | None]:
    """Names a module binds at top level -> the module an import binds there (None: anything else)."""
    names: dict[str, str | None] = {}

    def visit(statements: list) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.partition(".")[0]
                    names[alias.asname or bound] = bound
            elif isinstance(node, ast.ImportFrom):
                names.update({alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names})
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = None
            elif isinstance(node, (ast.If, ast.Try)):  # as the driver's choice of PrecompileError
                handlers = [handler.body for handler in getattr(node, "handlers", [])]
                for block in (node.body, node.orelse, getattr(node, "finalbody", []), *handlers):
                    visit(block)
            else:  # assignments; over-approximated for other compound statements
                names.update(dict.fromkeys(_stored_names(node)))

    visit(_parse(source).body)
    return names


def _stored_names(node: ast.stmt) -> list[str]:
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


# ---------------------------------------------------------------------------
# Package: the cache is a zip archive of stored entries (``unzip -l`` lists
# it): ``envelope.json``, a plain dict (format, version, backend, code_hash,
# build_env, payload_sha256, artifact) whose bytes values are references
# {"$blob": NAME} to the entries holding them.  Written by hand rather than
# with torch.save: a process's first torch.load costs ~3 ms (it imports and
# tokenizes serialization config), a third of a warm load, and pickle protocol
# 2 stores bytes as latin-1 text.  Reading JSON and raw entries runs no code
# (Note invariant 7).
# ---------------------------------------------------------------------------


_ENVELOPE_ENTRY = "envelope.json"
_BLOB_REFERENCE = "$blob"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same artifact gives the same bytes


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


def _package(python_code: str, backend: str, kernels: dict[str, bytes], bytecode: bytes | None = None) -> bytes:
    return _pack_envelope(
        {
            "format": CACHE_FORMAT,
            "version": FORMAT_VERSION,
            "backend": backend,
            "code_hash": _code_hash(python_code),
            "build_env": _build_environment(),
            "payload_sha256": _payload_hash(kernels),
            "artifact": {"kernels": kernels, "bytecode": {"magic": _BYTECODE_MAGIC, "code": bytecode}},
        }
    )


def _pack_envelope(envelope: dict) -> bytes:
    """The cache bytes holding ``envelope`` (JSON values and bytes)."""
    blobs: dict[str, bytes] = {}

    def reference(value: Any) -> dict[str, str]:
        if not isinstance(value, bytes):
            raise TypeError(f"a cache envelope holds JSON values and bytes, not {type(value).__name__}")
        name = f"blobs/{len(blobs)}"
        blobs[name] = value
        return {_BLOB_REFERENCE: name}

    entries = {_ENVELOPE_ENTRY: json.dumps(envelope, default=reference, indent=1).encode(), **blobs}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(zipfile.ZipInfo(name, _ZIP_EPOCH), data)
    return buffer.getvalue()


def _record_kernel_hashes(python_code: str, kernels: dict[str, bytes]) -> str:
    """python_code with KERNEL_SHA256 (kernel key -> sha256 of its compiled bytes) in its header.

    The cache is bound to python_code by code_hash, so this binds each cache
    key to its bytes: load() never runs a kernel under another kernel's key.
    """
    hashes = {key: hashlib.sha256(blob).hexdigest() for key, blob in sorted(kernels.items())}
    header_end = python_code.index(_marker("graph"))
    recorded = f"\nKERNEL_SHA256 = {pprint.pformat(hashes, width=100)}\n"
    return python_code[:header_end] + recorded + python_code[header_end:]


# python_code's sections compiled for this interpreter travel in the cache, so a
# warm load() compiles no Python, and so do its header's constants
# (marshalled), so a warm load() parses no header either.  python_code pins
# these parts by sha256 (like its kernels), and they record the sha256 of the
# text they were made from: the cache cannot substitute other code or values,
# and an edited python_code is compiled and parsed as it now reads.
_NO_BYTECODE = "BYTECODE_SHA256 = None"
_BYTECODE_MAGIC = importlib.util.MAGIC_NUMBER.hex()
_CACHED_PARTS = ("header", *_SECTIONS)


def _record_bytecode(python_code: str) -> tuple[str, bytes]:
    """python_code with BYTECODE_SHA256 set, and the marshalled parts it pins.

    The sections are compiled first: replacing the placeholder line keeps every
    line number and the sections' text, so their code objects stay exact.  The
    header's constants are all but BYTECODE_SHA256 itself.
    """
    compiled = _compile_sections(python_code)
    header = {name: value for name, value in _read_constants(python_code).items() if name != "BYTECODE_SHA256"}
    parts = {"header": header, **compiled}
    # Each part marshalled on its own: load() unmarshals only those it needs.
    bytecode = marshal.dumps((_code_hash(python_code), *(marshal.dumps(parts[name]) for name in _CACHED_PARTS)))
    recorded = f"BYTECODE_SHA256 = {hashlib.sha256(bytecode).hexdigest()!r}"
    return python_code.replace(_NO_BYTECODE, recorded, 1), bytecode


def _bytecode_hash(constants: dict[str, Any]) -> str | None:
    recorded = constants.get("BYTECODE_SHA256")
    if recorded is not None and not (isinstance(recorded, str) and _SHA256_HEX.fullmatch(recorded)):
        raise PrecompileError("python_code: BYTECODE_SHA256 is malformed (expected a sha256 hex or None); it was edited")
    return recorded


def _pinned_parts(python_code: str, envelope: dict, pin: str | None) -> tuple[dict[str, bytes], str | None]:
    """The cache's compiled parts (part -> marshalled bytes), if python_code pins exactly
    these bytes and is the text they were made from; else {} and why, if worth a warning."""
    artifact = envelope.get("artifact")
    entry = artifact.get("bytecode") if isinstance(artifact, dict) else None
    if pin is None or not isinstance(entry, dict) or entry.get("magic") != _BYTECODE_MAGIC:
        return {}, None  # none pinned, or built by another Python: compile python_code
    bytecode = entry.get("code")
    if not isinstance(bytecode, bytes) or hashlib.sha256(bytecode).hexdigest() != pin:
        return {}, "the cache's compiled Python does not match the sha256 python_code records for it"
    source_hash, *parts = marshal.loads(bytecode)
    if source_hash != _code_hash(python_code.replace(f"BYTECODE_SHA256 = {pin!r}", _NO_BYTECODE, 1)):
        return {}, "python_code was edited after its compiled Python was recorded"
    return dict(zip(_CACHED_PARTS, parts)), None


_PIN_LINE = re.compile(r"^BYTECODE_SHA256 = '([0-9a-f]{64})'$", re.MULTILINE)


def _pinned_header(python_code: str, envelope: dict) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """The header's constants and the compiled parts as the cache carries them, or None.

    load()'s warm path, which parses no header: taken when the header's one
    BYTECODE_SHA256 line pins the cache's parts and python_code is the text
    they were made from (``_pinned_parts``), so the constants are the ones
    precompile read from this very text.
    """
    header_end = python_code.find(_marker(_SECTIONS[0]))
    pins = _PIN_LINE.findall(python_code, 0, max(header_end, 0))
    parts = _pinned_parts(python_code, envelope, pins[0])[0] if len(pins) == 1 else {}
    if "header" not in parts:
        return None
    return {**marshal.loads(parts["header"]), "BYTECODE_SHA256": pins[0]}, parts


def _harvest_kernels(python_code: str) -> dict[str, bytes]:
    """Run the artifact once (JIT, Inductor's cache is warm) and keep its kernels."""
    namespace = _exec_artifact(python_code, _read_constants(python_code), {})
    kernels = {}
    loader = namespace.get("_kernel_loader")  # none when Inductor generated no module
    for key, path in (loader.compiled if loader else {}).items():
        with open(path, "rb") as f:
            kernels[key] = f.read()
    return kernels


# ---------------------------------------------------------------------------
# load: read_artifact (header by ast, envelope, pairing, payload) -> usable cache
# -> prime kernels -> warn -> exec.
# ---------------------------------------------------------------------------


class _CacheUnusable(PrecompileError):
    """The cache cannot accelerate this load: damaged, foreign, or another version.

    The cache only accelerates (Note invariant 6): load() warns and compiles
    from python_code instead.  A cache bound to other code still raises.
    """


class _StoreUnusable(Exception):
    """A kernel store directory cannot be used; the message names the path and cause."""


# CPython 3.11 (seen on 3.11.7) keeps ast.parse's recursion-depth counter in shared
# state: parses racing in two threads raise "SystemError: AST constructor
# recursion depth mismatch" (gh-106905).  load() is called from threads.
_AST_LOCK = threading.Lock()

_REQUIRED_CONSTANTS = ("CALLING_CONVENTION",)
# Recorded after the kernels are harvested; absent in artifacts of older versions.
_HEADER_CONSTANTS = (*_REQUIRED_CONSTANTS, "KERNEL_SHA256", "BYTECODE_SHA256")


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


def _read_constants(python_code: str) -> dict[str, Any]:
    if not isinstance(python_code, str):
        raise PrecompileError(f"python_code: expected str, got {type(python_code).__name__}")
    # The constants precede the graph: parsing only that header keeps load()
    # fast for large graphs; the rest is compiled when executed.
    header_end = python_code.find(_marker("graph"))
    try:
        module = _parse(python_code if header_end < 0 else python_code[:header_end])
    except (SyntaxError, ValueError) as error:
        raise PrecompileError(f"python_code is not valid Python ({error}); it is not a precompile artifact") from None
    except (MemoryError, RecursionError) as error:
        raise PrecompileError(
            f"python_code is nested too deeply to parse ({type(error).__name__}); it is not a precompile artifact"
        ) from None
    constants = {}
    for node in module.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in _HEADER_CONSTANTS
        ):
            if node.targets[0].id in constants:
                raise PrecompileError(f"python_code assigns {node.targets[0].id} twice; it was edited")
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as error:
                raise PrecompileError(
                    f"python_code: {node.targets[0].id} is not a plain literal ({error})"
                ) from error
    missing = set(_REQUIRED_CONSTANTS) - set(constants)
    if missing:
        raise PrecompileError(
            f"python_code is missing the calling-convention metadata {sorted(missing)}; "
            "it is not a precompile artifact"
        )
    return constants


def _read_convention(python_code: str) -> CallingConvention:
    return _convention_from(_read_constants(python_code))


def _convention_from(constants: dict[str, Any]) -> CallingConvention:
    literal = constants["CALLING_CONVENTION"]
    _check_format_version("python_code", literal.get("format_version") if isinstance(literal, dict) else None)
    return CallingConvention.from_literal(literal)


def _check_format_version(what: str, version: Any) -> None:
    """The one check of an artifact's format version (python_code's, and the cache
    envelope's, which load() turns into ignoring the cache) against the supported range."""
    if type(version) is int and MIN_FORMAT_VERSION <= version <= FORMAT_VERSION:
        return
    low, high = MIN_FORMAT_VERSION, FORMAT_VERSION
    supported = f"the versions this torch.compiler.precompile supports ({low}..{high})"
    if type(version) is not int:  # bool is an int subclass: refuse it too
        raise PrecompileError(f"{what} has format version {version!r}, which is malformed (expected an int in {low}..{high}); it was edited")
    if version > high:
        raise PrecompileError(
            f"{what} has format version {version}, newer than {supported}; load it with the torch "
            "version that produced it, or precompile again"
        )
    raise PrecompileError(
        f"{what} has format version {version}, older than {supported}: it does not record "
        "everything the calling convention now checks; precompile again"
    )


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _kernel_hashes(constants: dict[str, Any]) -> dict[str, str] | None:
    """Kernel key -> sha256 of its compiled bytes, as python_code records it (None: not recorded)."""
    hashes = constants.get("KERNEL_SHA256")
    if hashes is None:
        return None
    if not isinstance(hashes, dict) or not all(
        isinstance(key, str) and isinstance(digest, str) and _SHA256_HEX.fullmatch(digest)
        for key, digest in hashes.items()
    ):
        raise PrecompileError("python_code: KERNEL_SHA256 is malformed (expected {key: sha256 hex}); it was edited")
    return hashes


def _read_envelope(cache: bytes) -> dict:
    """The envelope ``_pack_envelope`` wrote, its blob references resolved; _CacheUnusable if damaged."""
    if not isinstance(cache, (bytes, bytearray, memoryview)):
        raise PrecompileError(f"cache: expected bytes, got {type(cache).__name__}")
    data = bytes(cache)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except Exception as error:  # any parser failure means damaged bytes
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache (not a zip archive: {str(error)[:200]})"
        ) from None
    try:
        with archive:
            _check_stored(archive, len(data))

            def resolve(value: dict) -> Any:
                name = value.get(_BLOB_REFERENCE) if len(value) == 1 else None
                return value if name is None else archive.read(name)

            envelope = json.loads(archive.read(_ENVELOPE_ENTRY), object_hook=resolve)
    except _CacheUnusable:
        raise
    except Exception as error:  # any parser failure means damaged bytes
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache ({type(error).__name__}: {str(error)[:200]})"
        ) from None
    if not isinstance(envelope, dict) or envelope.get("format") != CACHE_FORMAT:
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    return envelope


def _check_stored(archive: zipfile.ZipFile, size: int) -> None:
    """Refuse a cache that would inflate when read, before reading any entry.

    A genuine cache is a zip of stored (uncompressed) entries, so it never
    declares more bytes than it has.
    """
    entries = archive.infolist()
    declared = sum(entry.file_size for entry in entries)
    compressed = sum(entry.compress_type != zipfile.ZIP_STORED for entry in entries)
    if compressed or declared > size:
        raise _CacheUnusable(
            f"cache is damaged or not a precompile cache: it declares {declared} bytes in {size} "
            f"({compressed} compressed entries); refused before inflating it"
        )


_ENVELOPE_KEYS = {"format", "version", "backend", "code_hash", "build_env", "payload_sha256", "artifact"}


def _pair_error(python_code: str, convention: CallingConvention, envelope: dict) -> PrecompileError | None:
    """Why the cache belongs to other code (load() refuses the pair), or None.

    _CacheUnusable if the fields that say so are damaged."""
    backend, code_hash = envelope.get("backend"), envelope.get("code_hash")
    if not isinstance(backend, str) or not isinstance(code_hash, str):
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    if backend != convention.backend:
        return PrecompileError(
            f"cache was built for backend {backend!r} but python_code is for "
            f"{convention.backend!r}: the pair does not belong together"
        )
    if code_hash != _code_hash(python_code):
        return PrecompileError(
            "cache belongs to a different python_code (code_hash mismatch): pass the cache "
            "returned together with this python_code"
        )
    return None


def _version_error(envelope: dict) -> _CacheUnusable | None:
    try:
        _check_format_version("cache", envelope.get("version"))
    except PrecompileError as error:  # the cache only accelerates: ignored, not refused
        return _CacheUnusable(str(error))
    return None


def _payload(envelope: dict) -> dict[str, bytes]:
    """The cache's kernels, whatever code it is paired with; _CacheUnusable if they are damaged."""
    if set(envelope) != _ENVELOPE_KEYS:
        raise _CacheUnusable("cache is damaged or not a precompile cache (unexpected envelope)")
    artifact = envelope["artifact"]
    kernels = artifact.get("kernels") if isinstance(artifact, dict) else None
    if (
        not isinstance(kernels, dict)
        or not all(isinstance(k, str) and isinstance(v, bytes) for k, v in kernels.items())
        or _payload_hash(kernels) != envelope["payload_sha256"]
    ):
        raise _CacheUnusable("cache is damaged: its payload does not match its recorded sha256")
    return kernels


class Artifact(NamedTuple):
    """A ``(python_code, cache)`` pair as read and checked, with nothing executed.

    ``read_artifact`` makes it: the first stage of ``load()``, and what the
    inspector (``python -m torch._precompile inspect``) and the benchmarks
    read.  python_code's header must be readable (else PrecompileError); each
    verdict on the cache is recorded, not raised: ``load()`` raises
    ``pair_error``, and warns about ``version_error`` / ``cache_error`` and
    compiles from python_code; the inspector reports them.
    """

    python_code: str
    cache_size: int  # bytes
    constants: dict[str, Any]  # the header's literals: CALLING_CONVENTION, KERNEL_SHA256, BYTECODE_SHA256
    convention: CallingConvention  # decoded and validated
    kernel_hashes: dict[str, str] | None  # KERNEL_SHA256 (None: an older artifact records none)
    bytecode_hash: str | None  # BYTECODE_SHA256 (None: no compiled Python pinned)
    envelope: dict | None  # the cache's envelope (None: unreadable, see cache_error)
    kernels: dict[str, bytes]  # the cache's kernels, their payload sha256 checked ({} when not)
    compiled: dict[str, bytes]  # the cache's marshalled header and sections, as BYTECODE_SHA256 pins them
    compiled_problem: str | None  # why the cache's compiled parts are not used, when they are not pinned
    pair_error: PrecompileError | None  # the cache is for another backend or another python_code
    version_error: PrecompileError | None  # the cache has another format version
    cache_error: PrecompileError | None  # the cache is unreadable or its payload damaged

    @property
    def pair_problem(self) -> PrecompileError | None:
        """Why ``load()`` would not use this pair's cache as is (None: they belong together)."""
        return self.pair_error or self.version_error

    def describe(self) -> dict[str, Any]:
        """The inspector's JSON-serializable report (see ``torch._precompile_inspect``)."""
        from torch._precompile_inspect import report

        return report(self)


def read_artifact(python_code: str, cache: bytes, *, header_from_cache: bool = False) -> Artifact:
    """Read ``(python_code, cache)`` without executing either: the envelope (JSON and
    raw entries), the header (``ast``), the pairing, version and payload checks.

    ``header_from_cache`` is load()'s warm path: the header's constants are
    the cache's copy that python_code pins, when it does (``_pinned_header``).
    """
    if not isinstance(python_code, str):
        raise PrecompileError(f"python_code: expected str, got {type(python_code).__name__}")
    envelope, cache_error = None, None
    try:
        envelope = _read_envelope(cache)
    except _CacheUnusable as problem:
        cache_error = problem
    pinned = _pinned_header(python_code, envelope) if header_from_cache and envelope is not None else None
    constants = pinned[0] if pinned else _read_constants(python_code)
    convention = _convention_from(constants)
    hashes, bytecode_hash = _kernel_hashes(constants), _bytecode_hash(constants)  # malformed: refused first
    kernels, compiled, compiled_problem, pair_error, version_error = {}, {}, None, None, None
    if envelope is not None:
        try:
            pair_error = _pair_error(python_code, convention, envelope)
            version_error = _version_error(envelope)
            kernels = _payload(envelope)
            compiled, compiled_problem = (
                (pinned[1], None) if pinned else _pinned_parts(python_code, envelope, bytecode_hash)
            )
        except _CacheUnusable as problem:
            cache_error = problem
    return Artifact(
        python_code=python_code,
        cache_size=memoryview(cache).nbytes,
        constants=constants,
        convention=convention,
        kernel_hashes=hashes,
        bytecode_hash=bytecode_hash,
        envelope=envelope,
        kernels=kernels,
        compiled=compiled,
        compiled_problem=compiled_problem,
        pair_error=pair_error,
        version_error=version_error,
        cache_error=cache_error,
    )


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    # Called by load()'s helpers: the warning points at load()'s caller.
    warnings.warn(message, stacklevel=4)


def _usable_cache(artifact: Artifact) -> tuple[dict, dict]:
    """What this load may use of the cache, warning about the rest: key -> (sha256,
    bytes) of the kernels, and part -> marshalled code of python_code's compiled sections."""
    if artifact.pair_error is not None:
        raise artifact.pair_error
    problem = artifact.version_error or artifact.cache_error
    if problem is not None:
        warnings.warn(
            f"torch.compiler.precompile: ignoring the cache: {problem}; compiling from python_code "
            "instead (slower first call)",
            stacklevel=3,
        )
        return {}, {}
    if artifact.compiled_problem is not None:
        _warn_once(f"torch.compiler.precompile: {artifact.compiled_problem}; compiling python_code instead")
    return _usable_kernels(artifact.envelope, artifact.kernels, artifact.kernel_hashes), artifact.compiled


def _usable_kernels(envelope: dict, kernels: dict[str, bytes], hashes: dict[str, str] | None) -> dict:
    if not kernels:
        return {}
    here = _build_environment()
    if envelope["build_env"] != here:
        _warn_once(
            f"torch.compiler.precompile: the cache's kernels were built for {envelope['build_env']!r}, "
            f"this process runs {here!r}; compiling the kernels from python_code instead (slower first call)"
        )
        return {}
    return _bound_kernels(kernels, hashes)


def _bound_kernels(kernels: dict[str, bytes], hashes: dict[str, str] | None) -> dict:
    """The kernels whose bytes hash to what python_code records for their key.

    A cache's own hashes can be recomputed by whoever edits it; python_code's
    are bound to the cache by code_hash, so rotated or swapped kernels are
    compiled instead of being run with the wrong arguments.
    """
    if hashes is None:
        warnings.warn(
            "torch.compiler.precompile: python_code records no hashes of its compiled kernels (made by an "
            "older version); compiling them from python_code instead of loading the cache's",
            stacklevel=4,
        )
        return {}
    bound = {}
    for key, blob in kernels.items():
        digest = hashlib.sha256(blob).hexdigest()
        if hashes.get(key) == digest:
            bound[key] = (digest, blob)
    if len(bound) < len(kernels):
        warnings.warn(
            f"torch.compiler.precompile: {len(kernels) - len(bound)} of the cache's {len(kernels)} kernels "
            "do not match the sha256 python_code records for them (a forged or mixed-up cache); "
            "compiling those from python_code instead",
            stacklevel=4,
        )
    return bound


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
    return os.path.abspath(os.path.join(root, "precompile_kernels"))


def _prime_kernels(kernels: dict) -> dict[str, str]:
    """Place the verified kernels in a private store; key -> path of a file holding exactly its bytes."""
    if not kernels:
        return {}
    preferred = _kernel_directory()
    try:
        return _place_kernels(_private_directory(preferred), kernels)
    except _StoreUnusable as problem:
        store_problem = str(problem)
    try:
        fallback = _fallback_directory()
        files = _place_kernels(fallback, kernels)
    except _StoreUnusable as problem:
        raise PrecompileError(
            f"cannot write the cache's compiled kernels, neither to the kernel store ({store_problem}) nor to "
            f"a private temporary directory ({problem}); set TORCHINDUCTOR_CACHE_DIR to a writable directory"
        ) from None
    _warn_once(
        f"torch.compiler.precompile: not using the kernel store {preferred} ({store_problem}); "
        f"using the private directory {fallback} for this process"
    )
    return files


def _private_directory(path: str) -> str:
    """``path`` as a directory no other user can change, created (0700) if missing."""
    try:
        _make_private_dirs(path)
        problem = _untrusted_reason(path)
    except OSError as error:
        raise _StoreUnusable(f"{error.filename or path}: {error.strerror or error}") from None
    if problem is not None:
        raise _StoreUnusable(f"{path} {problem}")
    return path


def _make_private_dirs(path: str) -> None:
    if os.path.lexists(path):
        return
    _make_private_dirs(os.path.dirname(path))
    with contextlib.suppress(FileExistsError):  # a concurrent loader made it
        os.mkdir(path, 0o700)


def _untrusted_reason(path: str) -> str | None:
    """Why another local user could change what ``path`` holds; None if nobody can.

    The store must be ours and writable only by us, and every directory above
    it ours or root's and, if others can write it, sticky (like /tmp): else
    someone could swap a verified file, or the whole store, before it loads.
    """
    uid = os.geteuid()
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}, not this user ({uid})"
    if _writable_by_others(info):
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    parent = os.path.dirname(path)
    while True:
        info = os.stat(parent)
        if info.st_uid not in (uid, 0):
            return f"lies in {parent}, owned by uid {info.st_uid}"
        if _writable_by_others(info) and not info.st_mode & stat.S_ISVTX:
            return f"lies in {parent}, which group or others can write"
        if parent == os.path.dirname(parent):
            return None
        parent = os.path.dirname(parent)


def _writable_by_others(info: os.stat_result) -> bool:
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _is_private_group(info.st_gid)


@functools.lru_cache(maxsize=None)
def _is_private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's private group (named after the user, no other members).

    With user private groups (the Debian/Fedora default, umask 0002), the
    directories Inductor creates are group-writable by this user alone.
    """
    try:
        import grp
        import pwd

        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


@functools.lru_cache(maxsize=None)
def _fallback_directory() -> str:
    """A private directory for this process, removed at exit."""
    try:
        directory = tempfile.mkdtemp(prefix="torch_precompile_kernels_")
    except OSError as error:
        raise _StoreUnusable(f"{error.filename or tempfile.gettempdir()}: {error.strerror or error}") from None
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def _place_kernels(directory: str, kernels: dict) -> dict[str, str]:
    files, cleaned = {}, False
    for key, (digest, blob) in kernels.items():
        path = os.path.join(directory, digest + ".so")
        if not _holds(path, blob):  # missing, planted, damaged, a symlink: (re)write it
            try:
                if not cleaned:
                    _remove_stale_temporaries(directory)
                    cleaned = True
                _write_atomically(directory, path, blob)
            except OSError as error:
                raise _StoreUnusable(f"{path}: {error.strerror or error}") from None
        files[key] = path
    return files


def _holds(path: str, blob: bytes) -> bool:
    """Whether ``path`` is a regular file, not a symlink, holding exactly ``blob``."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != len(blob):
            return False
        with open(fd, "rb", closefd=False) as f:
            return f.read(len(blob) + 1) == blob
    except OSError:
        return False
    finally:
        os.close(fd)


# mkstemp names, with the writer's pid (older versions wrote tmpXXXXXXXX.tmp without one).
_TEMPORARY = re.compile(r"tmp(?:-(\d+)-)?\w+\.tmp")
_STALE_AFTER_S = 600


def _write_atomically(directory: str, path: str, blob: bytes) -> None:
    # Atomic: concurrent loaders never see a half-written file; the pid in the
    # temp name lets a later loader remove it if this process dies mid-write.
    fd, temporary = tempfile.mkstemp(prefix=f"tmp-{os.getpid()}-", suffix=".tmp", dir=directory)
    try:
        with open(fd, "wb") as f:
            f.write(blob)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _remove_stale_temporaries(directory: str) -> None:
    """Remove temp files of loaders that died mid-write: their pid is gone, or they are old."""
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _TEMPORARY.fullmatch(entry.name)
            if match is None:
                continue
            try:
                dead = match.group(1) is not None and not _pid_alive(int(match.group(1)))
                if dead or now - entry.stat(follow_symlinks=False).st_mtime > _STALE_AFTER_S:
                    os.unlink(entry.path)
            except OSError:
                pass  # its writer finished it, or another loader removed it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _exec_artifact(
    python_code: str,
    constants: dict[str, Any],
    kernel_files: dict[str, str],
    convention: CallingConvention | None = None,
    compiled: dict[str, bytes] | None = None,
) -> dict:
    """Run python_code as ``exec`` would, compiling only the sections this process needs.

    The header's constants were read already (and ``convention``, when given,
    decoded and validated from them); the driver section is compiled only when
    the installed driver is not its exact text, and a section is not compiled
    at all when ``compiled`` (the cache's marshalled parts) has it.
    """
    sections = _split_sections(python_code)
    filename = _register_source(python_code)
    compiled = compiled or {}

    def code(name: str) -> Any:
        return marshal.loads(compiled[name]) if name in compiled else _compile_section(filename, *sections[name])

    namespace = {
        "__name__": "torch_precompile_artifact",
        **constants,
        "__precompile_kernel_files__": kernel_files,
    }
    exec(code("graph"), namespace)
    driver = namespace["__precompile_driver__"] = _driver_namespace(sections["driver"][1], lambda: code("driver"))
    if convention is not None and driver is vars(runtime):  # the installed driver's records: no second decode
        namespace["__precompile_convention__"] = convention
    exec(code("forward"), namespace)
    return namespace


def _split_sections(python_code: str) -> dict[str, tuple[int, str]]:
    """Section name -> (lines before it in python_code, its text)."""
    starts = []
    for name in _SECTIONS:
        at = python_code.find(_marker(name), starts[-1][1] if starts else 0)
        if at < 0:
            raise PrecompileError(
                f"python_code has no {name} section (marker {_marker(name).strip()!r}); it was edited"
            )
        starts.append((name, at))
    ends = [at for _, at in starts[1:]] + [len(python_code)]
    sections = {}
    for (name, at), end in zip(starts, ends):
        body = at + len(_marker(name))
        sections[name] = (python_code.count("\n", 0, body), python_code[body:end])
    return sections


def _compile_section(filename: str, line_offset: int, text: str) -> Any:
    # Blank lines in front: tracebacks give the line numbers of python_code as a whole.
    return compile("\n" * line_offset + text, filename, "exec", dont_inherit=True)


def _compile_sections(python_code: str) -> dict[str, Any]:
    filename = _register_source(python_code)
    return {name: _compile_section(filename, *text) for name, text in _split_sections(python_code).items()}


def _register_source(python_code: str) -> str:
    """A stable file name for python_code, whose lines tracebacks and pdb then show (as torch.fx does).

    Named after the sections and where they start, not the header's hashes:
    the compiled sections, which carry the name, are made before those are set.
    """
    body = python_code.index(_marker(_SECTIONS[0]))
    lines_before = python_code.count("\n", 0, body)
    located = f"{lines_before}:{python_code[body:]}"
    filename = f"<precompile artifact {_code_hash(located)[:12]}>"
    linecache.cache[filename] = (len(python_code), None, python_code.splitlines(keepends=True), filename)
    return filename


def _driver_namespace(source: str, compiled: Callable[[], Any]) -> dict:
    """The artifact's driver: the installed module when the driver section is its exact text.

    Importing ``torch._precompile_runtime`` reuses Python's cached bytecode;
    otherwise ``compiled()`` gives the section's code (the cache's, or compiled
    now: ~8 ms).
    """
    if source == _driver_source():
        return vars(runtime)
    namespace = {"__name__": "torch_precompile_driver"}
    exec(compiled(), namespace)
    return namespace


# Capture and lowering change process-global state (Note invariant 10): one
# precompile() at a time.  Reentrant: fn calling precompile() must not deadlock.
_PRECOMPILE_LOCK = threading.RLock()


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
        with _PRECOMPILE_LOCK, _caller_rng_kept():
            with timer("capture+enforce"):
                capture = _capture(fn, example_inputs, backend, decompositions)
            with timer("lower"):
                lowered = _lower_eager(capture) if backend == "eager" else _lower_inductor(capture)
            with timer("render"):
                python_code = _render(capture.convention, lowered)
            with timer("package"):
                kernels = _harvest_kernels(python_code) if backend == "inductor" else {}
                python_code = _record_kernel_hashes(python_code, kernels)
                python_code, bytecode = _record_bytecode(python_code)
                cache = _package(python_code, backend, kernels, bytecode)
        timer.done(
            f"backend={backend} graph_inputs={len(capture.example_inputs)} kernels={len(kernels)} "
            f"python_code={len(python_code)}B cache={len(cache)}B"
        )
        return python_code, cache

    def load(self, python_code: str, cache: bytes) -> Callable:
        """Rebuild the runnable from ``(python_code, cache)``; executes python_code."""
        with _gc_paused():
            return self._load(python_code, cache)

    def _load(self, python_code: str, cache: bytes) -> Callable:
        timer = _StageTimer("load")
        with timer("verify"):
            artifact = read_artifact(python_code, cache, header_from_cache=True)
            kernels, compiled = _usable_cache(artifact)
            constants, convention = artifact.constants, artifact.convention
        with timer("prime"):
            kernel_files = _prime_kernels(kernels)
        log.warning(
            "torch.compiler.precompile.load executes python_code (backend %r) and loads %d "
            "compiled kernels: only load artifacts you trust",
            convention.backend,
            len(kernel_files),
        )
        with timer("exec"):
            try:
                namespace = _exec_artifact(python_code, constants, kernel_files, convention, compiled)
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


@contextlib.contextmanager
def _gc_paused():
    """Parsing and compiling python_code allocate many short-lived objects, which
    trigger collections over everything a process with torch imported holds
    (measured: 147 ms instead of 24 ms for a 93 KB header's first ast.parse)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _caller_rng_kept():
    """Invariant 8: tracing dropout & co. and lowering draw random numbers; the caller's
    generators are restored, so seeding before precompile() seeds the first call."""
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=cuda)


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
        compat.register_log_alias("precompile", __name__)
    except Exception:  # never break `import torch` for everyone
        log.debug("torch._precompile: attach failed", exc_info=True)


_attach()
