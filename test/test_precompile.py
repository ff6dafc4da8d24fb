# Owner(s): ["module: dynamo"]
"""Tests for torch.compiler.precompile (torch/_precompile.py).

Each class proves one part of Note [precompile programming model].  Inductor
compiles cost seconds on a small CPU machine, so artifacts are built once per
class (``_artifact`` caches them by key) and models stay tiny.
"""

import ast
import builtins
import copy
import gc
import hashlib
import importlib.util
import inspect
import io
import json
import logging
import os
import pickle
import re
import subprocess
import symtable
import sys
import tempfile
import textwrap
import threading
import traceback
import unittest
import warnings
import weakref
import zipfile
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile
import torch_precompile._precompile as precompile_module
import torch_precompile._precompile_artifact as artifact_module
import torch_precompile._precompile_capture as capture_module
import torch_precompile._precompile_format as format_module
import torch_precompile._precompile_runtime as runtime
import torch_precompile._precompile_schema as schema
from torch_precompile import PrecompileError
from _precompile_testing import Artifacts, load, MARK_BOUNDS, needs_mark_bounds, small_mlp, TORCH_RELEASE


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_artifact = Artifacts()


def _top_level_names(source):
    """The names a module's top level binds."""
    table = symtable.symtable(source, "driver", "exec")
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}


def _global_references(source):
    """The names a module reads from its globals, at top level or inside any function or class."""
    references = set()

    def visit(table):
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table.get_type() == "module" or symbol.is_global()):
                references.add(symbol.get_name())
        for child in table.get_children():
            visit(child)

    visit(symtable.symtable(source, "driver", "exec"))
    return references


def _forward(m, x):
    return m(x)


def _train_step(m, x, y):
    loss = F.mse_loss(m(x), y)
    loss.backward()
    return loss


def _snapshot(module):
    return {
        "state": {k: v.clone() for k, v in module.state_dict(keep_vars=True).items()},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in module.named_parameters()},
    }


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _run_python(code, env=None, timeout=600):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout
    )


class TestAPI(TestCase):
    def test_is_callable_instance_with_load(self):
        self.assertTrue(callable(precompile))
        self.assertTrue(callable(precompile.load))
        self.assertIs(precompile, precompile_module.precompile)
        self.assertEqual(torch_precompile.load, precompile.load)
        self.assertIs(precompile_module.PrecompileError, PrecompileError)

    def test_tracer_dynamo_not_implemented(self):
        with self.assertRaisesRegex(NotImplementedError, "tracer='dynamo'"):
            precompile(_forward, small_mlp(), torch.randn(2, 8), tracer="dynamo")

    def test_unknown_backend_names_choices(self):
        with self.assertRaisesRegex(ValueError, r"unknown backend 'tvm'.*'inductor', 'eager'"):
            precompile(_forward, small_mlp(), torch.randn(2, 8), backend="tvm")

    def test_unknown_tracer_names_choices(self):
        with self.assertRaisesRegex(ValueError, r"unknown tracer 'jit'.*'make_fx', 'dynamo'"):
            precompile(_forward, small_mlp(), torch.randn(2, 8), tracer="jit")

    def test_decompositions_reach_make_fx(self):
        calls = []

        def relu_as_clamp(x):
            calls.append(x.shape)
            return torch.clamp_min(x, 0)

        table = {torch.ops.aten.relu.default: relu_as_clamp}
        m, x = small_mlp(), torch.randn(2, 8)
        code, cache = precompile(_forward, m, x, backend="eager", decompositions=table)
        self.assertEqual(calls, [torch.Size([2, 16])])
        self.assertIn("aten.clamp_min", code)
        self.assertNotIn("aten.relu", code)
        torch.testing.assert_close(precompile.load(code, cache)(m, x), m(x))


    def test_load_leaves_the_garbage_collector_as_it_was(self):
        """load() pauses the collector and promotes what it made to the oldest generation unscanned:
        the collector's switch is as it was, garbage made before a load is still collected, and
        objects the process froze itself stay frozen."""
        m, x = small_mlp(), torch.randn(3, 8)  # the shape the other tests build "mlp_forward" with
        pair = _artifact("mlp_forward", _forward, m, x, backend="eager")

        class Node:
            pass

        node = Node()
        node.cycle = node
        garbage = weakref.ref(node)
        del node
        f = precompile.load(*pair)
        self.assertTrue(gc.isenabled())
        gc.collect()
        self.assertIsNone(garbage())
        torch.testing.assert_close(f(m, x), m(x))
        gc.disable()
        try:
            precompile.load(*pair)
            self.assertFalse(gc.isenabled())
        finally:
            gc.enable()
        kept_frozen = []
        gc.freeze()
        try:
            precompile.load(*pair)
            self.assertFalse(any(o is kept_frozen for o in gc.get_objects()))  # still in the permanent generation
        finally:
            gc.unfreeze()
        self.assertTrue(any(o is kept_frozen for o in gc.get_objects()))


class TestCapture(TestCase):
    @parametrize("backend", BACKENDS)
    def test_inference_matches_eager(self, backend):
        m, x = small_mlp(), torch.randn(3, 8)
        f = load(_artifact("mlp_forward", _forward, m, x, backend=backend))
        torch.testing.assert_close(f(m, x), m(x))
        # New weights at runtime are used: the artifact holds none.
        m2 = small_mlp(seed=1)
        torch.testing.assert_close(f(m2, x), m2(x))

    @parametrize("backend", BACKENDS)
    def test_several_modules_pytree_io_values_literals_tied(self, backend):
        torch.manual_seed(0)
        encoder = nn.Linear(4, 4)
        decoder = nn.Linear(4, 4)
        decoder.weight = encoder.weight  # tied across modules

        def fn(scale, enc, inputs, dec, mode):
            h = enc(inputs["x"]) * scale
            h = h + torch.tensor([1.0, float("-inf"), 0.5, 2.0]).clamp_min(-1.0)  # a literal
            out = dec(h)
            return {"out": out, "pair": (out.sum(), mode), "n": 3, "none": None}

        x = torch.randn(2, 4)
        args = (2.0, encoder, {"x": x, "tag": "a"}, decoder, "train")
        f = load(_artifact("multi", fn, *args, backend=backend))
        expected = fn(*args)
        result = f(*args)
        self.assertEqual(result, expected)
        self.assertEqual(result["pair"][1], "train")
        self.assertEqual(result["n"], 3)
        convention = f.convention
        self.assertEqual([m.position for m in convention.modules], [1, 3])
        # Tied weight: one graph input with both names, parameters before buffers.
        self.assertEqual(len(convention.state), 3)
        self.assertEqual(convention.state[0].names, ((0, "weight"), (1, "weight")))
        # Baked values are enforced.
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]: expected 2.0 .*got 3.0"):
            f(3.0, encoder, {"x": x, "tag": "a"}, decoder, "train")
        with self.assertRaisesRegex(PrecompileError, r"args\[2\]\['tag'\]: expected 'a'.*got 'b'"):
            f(2.0, encoder, {"x": x, "tag": "b"}, decoder, "train")
        with self.assertRaisesRegex(PrecompileError, r"args\[4\]: expected 'train'"):
            f(2.0, encoder, {"x": x, "tag": "a"}, decoder, "eval")
        # Untied at runtime is refused, not silently wrong.
        untied = copy.deepcopy(decoder)
        untied.weight = nn.Parameter(encoder.weight.detach().clone())
        with self.assertRaisesRegex(PrecompileError, r"args\[3\]\.weight was the same tensor as args\[1\]\.weight"):
            f(2.0, encoder, {"x": x, "tag": "a"}, untied, "train")
        # The tied name deleted after a call (`del` bypasses the registration hooks): named, not a KeyError.
        f(2.0, encoder, {"x": x, "tag": "a"}, decoder, "train")
        del decoder.weight
        with self.assertRaisesRegex(PrecompileError, r"args\[3\]: the module's parameters differ.*missing \['weight'\]"):
            f(2.0, encoder, {"x": x, "tag": "a"}, decoder, "train")

    @parametrize("backend", BACKENDS)
    def test_batchnorm_train_updates_running_stats_like_eager(self, backend):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        x = torch.randn(2, 3, 6, 6)
        f = load(_artifact("bn_train", _forward, m, x, backend=backend))
        reference = copy.deepcopy(m)
        for _ in range(2):
            torch.testing.assert_close(f(m, x), reference(x))
        for (name, ours), theirs in zip(m.named_buffers(), reference.buffers()):
            torch.testing.assert_close(ours, theirs, msg=name)
        self.assertEqual(m[1].num_batches_tracked.item(), 2)

    @parametrize("backend", BACKENDS)
    def test_input_mutation_and_aliasing_outputs(self, backend):
        def fn(x, y):
            x.add_(1)  # mutates the caller's input, as in eager
            return x.view(-1), y[:, :2], y

        x, y = torch.randn(2, 3), torch.randn(2, 3)
        pair = _artifact("mutation", fn, x, y, backend=backend)
        f = load(pair)
        x_ref, x_run = x.clone(), x.clone()
        expected = fn(x_ref, y)
        flat, head, same = f(x_run, y)
        torch.testing.assert_close(x_run, x_ref)
        torch.testing.assert_close(flat, expected[0])
        torch.testing.assert_close(head, expected[1])
        torch.testing.assert_close(same, y)

    @parametrize("backend", BACKENDS)
    def test_dropout_reproducible_under_seed(self, backend):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5))
        x = torch.randn(4, 8)
        pair = _artifact("dropout", _forward, m, x, backend=backend)
        first, second = load(pair), load(pair)
        torch.manual_seed(123)
        a = first(m, x)
        torch.manual_seed(123)
        b = second(m, x)
        torch.manual_seed(123)
        eager = m(x)
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, eager)
        self.assertTrue((a == 0).any())

    def test_inductor_computes_a_scalar_read_by_a_large_loop_once(self):
        # AdamW's bias corrections in miniature: a pow of a 0-d step tensor
        # scaling a 4096-element tensor (capture's _compute_scalars_once).
        def fn(x, step, small):
            return x * (1 - 0.9**step), small * (1 - 0.8**step)

        x, step, small = torch.randn(64, 64), torch.tensor(3.0), torch.randn(16)
        python_code, cache = precompile(fn, x, step, small, backend="inductor")
        f = load((python_code, cache))
        for s in (step, torch.tensor(7.0)):
            for got, want in zip(f(x, s, small), fn(x, s, small)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
        kernels = re.findall(r"r'''\n(.*?)'''\)", python_code, re.DOTALL)
        loops = [part for kernel in kernels for part in kernel.split("for(")[1:]]
        self.assertEqual(sum("4096L" in loop for loop in loops), 1)
        for loop in loops:
            # The large loop loads the scalar; below 1024 elements recomputing beats a buffer.
            self.assertEqual("std::pow" in loop, "4096L" not in loop, loop)


class TestTraining(TestCase):
    @parametrize("backend", BACKENDS)
    def test_grads_accumulate_like_eager(self, backend):
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        f = load(_artifact("mlp_train", _train_step, m, x, y, backend=backend))
        reference = copy.deepcopy(m)
        for _ in range(2):  # None -> assign, then add in place
            torch.testing.assert_close(f(m, x, y), _train_step(reference, x, y).detach())
            for ours, theirs in zip(m.parameters(), reference.parameters()):
                torch.testing.assert_close(ours.grad, theirs.grad)
        self.assertFalse(f(m, x, y).requires_grad)

    @parametrize("backend", BACKENDS)
    def test_frozen_and_unused_params_keep_none(self, backend):
        torch.manual_seed(0)
        m = nn.ModuleDict({"used": nn.Linear(4, 4), "frozen": nn.Linear(4, 4), "unused": nn.Linear(4, 4)})
        m["frozen"].requires_grad_(False)

        def step(m, x):
            loss = m["frozen"](m["used"](x)).sum()
            loss.backward()
            return loss

        x = torch.randn(2, 4)
        f = load(_artifact("frozen", step, m, x, backend=backend))
        reference = copy.deepcopy(m)
        f(m, x)
        step(reference, x)
        for (name, ours), theirs in zip(m.named_parameters(), reference.parameters()):
            self.assertEqual(ours.grad is None, theirs.grad is None, msg=name)
            if theirs.grad is not None:
                torch.testing.assert_close(ours.grad, theirs.grad)
        self.assertEqual(len(f.convention.grad_state), 2)

    def test_buffer_receiving_grad_refused(self):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.ones(4, requires_grad=True))

            def forward(self, x):
                return x * self.scale

        def step(m, x):
            m(x).sum().backward()

        with self.assertRaisesRegex(PrecompileError, "buffer 'scale' would receive a gradient"):
            precompile(step, M(), torch.randn(2, 4), backend="eager")

    def test_input_receiving_grad_refused(self):
        def step(m, x):
            m(x).sum().backward()

        x = torch.randn(2, 8, requires_grad=True)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\] would receive a gradient.*x.detach\(\)"):
            precompile(step, small_mlp(), x, backend="eager")

    def test_bare_backward_returns_none(self):
        def step(m, x):
            m(x).sum().backward()

        m, x = small_mlp(), torch.randn(2, 8)
        f = precompile.load(*precompile(step, m, x, backend="eager"))
        self.assertIsNone(f(m, x))
        self.assertIsNotNone(m[0].weight.grad)


_GLOBAL_TENSOR = torch.randn(4)


class TestCaptureContract(TestCase):
    def test_global_tensor_refused(self):
        with self.assertRaisesRegex(PrecompileError, "neither an argument of fn nor created inside it"):
            precompile(lambda x: x + _GLOBAL_TENSOR, torch.randn(4), backend="eager")

    def test_captured_local_refused(self):
        bias = torch.randn(4)
        with self.assertRaisesRegex(PrecompileError, "register_buffer"):
            precompile(lambda x: x * bias, torch.randn(4), backend="eager")

    def test_unregistered_module_attribute_refused(self):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
                self.offset = torch.randn(4)  # plain attribute, not a buffer

            def forward(self, x):
                return self.lin(x) + self.offset

        with self.assertRaisesRegex(PrecompileError, r"shape \(4,\).*in forward\): .*live state"):
            precompile(_forward, M(), torch.randn(2, 4), backend="eager")

    def test_library_style_mask_literal_accepted(self):
        def fn(x):
            n = x.shape[-1]
            mask = torch.full((n, n), torch.finfo(x.dtype).min).triu(1)
            bias = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0]])
            return (x @ x.transpose(-1, -2) + mask + bias).softmax(-1)

        x = torch.randn(2, 3, 3)
        f = precompile.load(*precompile(fn, x, backend="eager"))
        torch.testing.assert_close(f(x), fn(x))

    def test_effectful_op_refused(self):
        def fn(x):
            torch.ops.aten._print("side effect")
            return x + 1

        with self.assertRaisesRegex(PrecompileError, "effectful operator aten._print"):
            precompile(fn, torch.randn(2), backend="eager")

    def test_control_flow_refused(self):
        def fn(x):
            return torch.cond(x.sum() > 0, lambda y: y + 1, lambda y: y - 1, (x,))

        with self.assertRaisesRegex(PrecompileError, "higher-order operator cond"):
            precompile(fn, torch.randn(2), backend="eager")

    def test_rebinding_a_buffer_refused(self):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("count", torch.zeros(()))

            def forward(self, x):
                self.count = self.count + 1  # rebinds instead of updating in place
                return x * 2

        with self.assertRaisesRegex(PrecompileError, "rebinds M attribute 'count'.*copy_"):
            precompile(_forward, M(), torch.randn(2), backend="eager")

    def test_caller_state_untouched(self):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        m(x).sum().backward()  # existing .grad must neither change nor be baked in
        before, x_before = _snapshot(m), x.clone()
        f = precompile.load(*precompile(_train_step, m, x, y, backend="eager"))
        after = _snapshot(m)
        for key in before["state"]:
            self.assertEqual(before["state"][key], after["state"][key], atol=0, rtol=0)
        for key in before["grads"]:
            self.assertEqual(before["grads"][key], after["grads"][key], atol=0, rtol=0)
        self.assertEqual(x, x_before, atol=0, rtol=0)
        # The captured grads are fresh ones, not old grads baked in; they add onto .grad.
        reference = copy.deepcopy(m)  # (Parameter.__deepcopy__ drops .grad)
        for ours, theirs in zip(m.parameters(), reference.parameters()):
            theirs.grad = ours.grad.clone()
        f(m, x, y)
        _train_step(reference, x, y)
        for ours, theirs in zip(m.parameters(), reference.parameters()):
            torch.testing.assert_close(ours.grad, theirs.grad)

    def test_fn_exception_propagates_and_state_untouched(self):
        class Boom(Exception):
            pass

        error = Boom("from fn")

        def step(m, x):
            m(x).sum().backward()
            raise error

        m = small_mlp()
        before = _snapshot(m)
        with self.assertRaises(Boom) as raised:
            precompile(step, m, torch.randn(2, 8), backend="eager")
        self.assertIs(raised.exception, error)
        after = _snapshot(m)
        for key in before["grads"]:
            self.assertIsNone(after["grads"][key])
        for key in before["state"]:
            self.assertEqual(before["state"][key], after["state"][key], atol=0, rtol=0)

    def test_unsupported_leaf_refused(self):
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: unsupported leaf of type slice"):
            precompile(lambda x, d: x + 1, torch.randn(2), slice(1), backend="eager")
        # Python's and torch's own types get no advice to register them as pytree nodes.
        for leaf in (torch.float32, {1}, 1j):
            with self.assertRaisesRegex(
                PrecompileError, rf"^fn's output leaf 1: .* A {type(leaf).__name__} cannot be carried there: .*str\(value\)"
            ):
                precompile(lambda x: (x + 1, leaf), torch.randn(2), backend="eager")  # noqa: B023

    @parametrize(
        "name",
        ["t_", "resize_", "squeeze_", "as_strided_", "out_resized"],
    )
    def test_input_layout_changes(self, name):
        # Inductor's kernels would keep writing the input's old memory (a resize
        # through out= wrote past a 0-element buffer); eager runs the ops.
        def out_resized(x, out):
            torch.add(x, 1, out=out)
            return out

        fn, shape, change = {
            "t_": (lambda x: x.t_(), (2, 3), "(2, 3) strides (3, 1) offset 0 -> (3, 2) strides (1, 3) offset 0"),
            "resize_": (lambda x: x.resize_(2, 2), (3, 4), "(3, 4) strides (4, 1) offset 0 -> (2, 2) strides (2, 1) offset 0"),
            "squeeze_": (lambda x: x.squeeze_(), (1, 4), "(1, 4) strides (4, 1) offset 0 -> (4,) strides (1,) offset 0"),
            "as_strided_": (lambda x: x.as_strided_((2, 2), (1, 2)), (3, 4), "(3, 4) strides (4, 1) offset 0 -> (2, 2) strides (1, 2) offset 0"),
            "out_resized": (out_resized, (3, 4), "(0,) strides (1,) offset 0 -> (3, 4) strides (4, 1) offset 0"),
        }[name]
        example = [torch.randn(shape)] + ([torch.empty(0)] if name == "out_resized" else [])
        where = "args[1]" if name == "out_resized" else "args[0]"
        with self.assertRaisesRegex(PrecompileError, rf"fn changes the layout of {re.escape(where)} in place \(aten\.\w+\.\w+: {re.escape(change)}\)"):
            precompile(fn, *example, backend="inductor")
        f = precompile.load(*precompile(fn, *[t.clone() for t in example], backend="eager"))
        ours, theirs = [t.clone() for t in example], [t.clone() for t in example]
        torch.testing.assert_close(f(*ours), fn(*theirs))
        for got, want in zip(ours, theirs):
            self.assertEqual((got.shape, got.stride(), got.storage_offset()), (want.shape, want.stride(), want.storage_offset()))


class TestArtifact(TestCase):
    @parametrize("backend", BACKENDS)
    def test_python_code_layout_and_constants(self, backend):
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend=backend)
        self.assertTrue(code.startswith("# torch.compiler.precompile artifact"))
        self.assertIn('namespace["forward"](model, *inputs)', code)
        constants = format_module._read_constants(code)
        self.assertNotIn("FORMAT_VERSION", constants)  # stored once, in the convention
        convention = constants["CALLING_CONVENTION"]
        self.assertEqual(convention["backend"], backend)
        self.assertEqual(convention["format_version"], format_module.CONVENTION_VERSION)
        self.assertEqual(convention["modules"][0]["parameters"], ["0.weight", "0.bias", "2.weight", "2.bias"])
        self.assertEqual(convention["inputs"][0]["tensor"]["shape"], [3, 8])
        self.assertEqual(convention["grad_state"], [])
        compile(code, "artifact", "exec")  # valid Python on its own
        sections = artifact_module._split_sections(code)
        self.assertEqual(list(sections), ["graph", "driver", "forward"])
        # The driver's core, and of its optional parts those this convention uses.
        self.assertEqual(sections["driver"][1], format_module._driver_source(("inductor",) if backend == "inductor" else ()))
        for _, text in sections.values():
            compile(text, "section", "exec")  # each section is code, not a string literal
        if backend == "eager":
            self.assertIn("def eager_graph(", sections["graph"][1])
        else:
            self.assertIn("def call(self, args)", sections["graph"][1])  # Inductor's module
            self.assertIn("cpp_pybinding(['float*", sections["graph"][1])

    def test_eager_graph_is_annotated(self):
        class TwoLayers(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

            def forward(self, x):
                return self.fc2(torch.relu(self.fc1(x)))  # the line the graph cites

        code, _ = precompile(_train_step, TwoLayers(), torch.randn(3, 8), torch.randn(3, 4), backend="eager")
        graph = artifact_module._split_sections(code)["graph"][1]
        # Placeholders named after what they hold, each value with its dtype[shape].
        for name, shape in (("p_fc1_weight", "16, 8"), ("p_fc1_bias", "16"), ("args_1", "3, 8"), ("args_2", "3, 4")):
            self.assertIn(f'    {name}: "f32[{shape}]",\n', graph)
        self.assertIn('mse_loss: "f32[]" = torch.ops.aten.mse_loss.default(', graph)
        self.assertNotIn("arg0_1", graph)
        # The model's own line, not the F.linear call inside nn.Linear.
        self.assertIn(f"# File: {__file__}:", graph)
        self.assertIn("code: return self.fc2(torch.relu(self.fc1(x)))  # the line the graph cites", graph)
        self.assertNotIn("linear.py", graph)

    def test_eager_graph_drops_dead_code_keeps_mutations(self):
        def fn(m, x):
            unused = x.detach() * 2  # noqa: F841
            return m(x)

        m = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))
        code, _ = precompile(fn, m, torch.randn(3, 8), backend="eager")
        graph = artifact_module._split_sections(code)["graph"][1]
        self.assertNotIn("aten.mul", graph)
        self.assertIn("aten.add_.Tensor", graph)  # num_batches_tracked += 1, used by nothing

    def test_driver_may_not_rebind_names_of_the_other_sections(self):
        # Run alone, the sections share one namespace.
        graph = "import os\nimport torch.utils._pytree as pytree\ndef tensor_guard():\n    pass\n"
        with self.assertRaisesRegex(AssertionError, r"rebinds names .* \['tensor_guard'\]"):
            capture_module._check_names_disjoint("", {"graph": graph, "forward": ""})
        capture_module._check_names_disjoint("", {"graph": graph.split("def")[0], "forward": ""})

    def test_traceback_shows_artifact_lines(self):
        # An op failing on a bad value inside the graph: the traceback's frame in
        # the artifact shows the artifact's line, under one name per artifact.
        m, ids = nn.Embedding(10, 4), torch.tensor([[1, 2], [3, 4]])
        code, cache = precompile(lambda m, ids: m(ids).sum(), m, ids, backend="eager")
        runnable = precompile.load(code, cache)
        try:  # not assertRaises: it drops the traceback
            runnable(m, torch.tensor([[1, 2], [3, 40]]))
        except IndexError as error:
            trace = traceback.extract_tb(error.__traceback__)
        else:
            self.fail("an out-of-range index was accepted")
        filename = artifact_module._artifact_filename(format_module._text_hashes(code)[0])
        self.assertRegex(filename, r"^<precompile artifact [0-9a-f]{12}>\.py$")
        frames = [f for f in trace if f.filename == filename]
        self.assertEqual([f.name for f in frames], ["eager_graph"])
        self.assertIn("torch.ops.aten.embedding.default(p_weight, args_1)", frames[0].line)
        self.assertEqual(frames[0].line, code.splitlines()[frames[0].lineno - 1].strip())

    @parametrize("backend", BACKENDS)
    def test_source_of_graph_functions(self, backend):
        # pdb and inspect find the artifact's lines: the graph function's source is
        # python_code's text at the line its code object names.
        m, x = small_mlp(), torch.randn(3, 8)
        code, _ = _artifact("mlp_forward", _forward, m, x, backend=backend)
        namespace = artifact_module._exec_artifact(code, format_module._read_constants(code), {})
        graph = namespace["eager_graph"] if backend == "eager" else namespace["call"]
        source = inspect.getsource(graph)
        self.assertIn(source, code)
        self.assertEqual(code.count("\n", 0, code.index(source)) + 1, graph.__code__.co_firstlineno)

    def test_eager_graph_names_the_source_line_of_each_node(self):
        def scaled_relu(model, x):
            h = model(x)
            return (h * 3).relu()

        m, x = small_mlp(), torch.randn(3, 8)
        code, _ = _artifact("scaled_relu", scaled_relu, m, x, backend="eager")
        line = inspect.getsourcelines(scaled_relu)[1]
        self.assertIn(f"{__file__}:{line + 1} in scaled_relu, code: h = model(x)", code)
        self.assertIn(f"{__file__}:{line + 2} in scaled_relu, code: return (h * 3).relu()", code)

    @parametrize("backend", BACKENDS)
    def test_cache_is_a_zip_of_a_json_envelope_and_raw_entries(self, backend):
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend=backend)
        with zipfile.ZipFile(io.BytesIO(cache)) as archive:
            self.assertEqual({entry.compress_type for entry in archive.infolist()}, {zipfile.ZIP_STORED})
            raw = json.loads(archive.read("envelope.json"))
            blob_names = archive.namelist()[1:]
        envelope = format_module._read_envelope(cache)
        self.assertEqual(envelope, format_module._read_envelope(format_module._pack_envelope(envelope)))
        # Every bytes value (kernels, compiled Python) is an entry the JSON refers to by name.
        self.assertEqual(raw["artifact"]["bytecode"]["code"], {"$blob": blob_names[-1]})
        self.assertEqual(len(blob_names), len(envelope["artifact"]["kernels"]) + 1)
        self.assertEqual(envelope["format"], "torch.compiler.precompile")
        self.assertEqual(envelope["version"], format_module.CACHE_VERSION)
        self.assertEqual(envelope["backend"], backend)
        self.assertEqual(envelope["code_hash"], format_module._text_hashes(code)[1])
        digests = format_module._kernel_digests(envelope["artifact"]["kernels"])
        self.assertEqual(envelope["payload_sha256"], format_module._payload_hash(digests))
        if backend == "eager":
            self.assertEqual(envelope["artifact"]["kernels"], {})
        else:
            self.assertGreater(len(envelope["artifact"]["kernels"]), 0)
        bytecode = envelope["artifact"]["bytecode"]
        self.assertEqual(bytecode["magic"], importlib.util.MAGIC_NUMBER.hex())
        self.assertEqual(
            format_module._read_constants(code)["BYTECODE_SHA256"], hashlib.sha256(bytecode["code"]).hexdigest()
        )

    @parametrize("backend", BACKENDS)
    def test_warm_load_compiles_no_python(self, backend):
        """The cache carries python_code's compiled sections, pinned by BYTECODE_SHA256."""
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend=backend)

        def refuse(*args):
            raise AssertionError("load() compiled a section the cache holds")

        with mock.patch.object(artifact_module, "_compile_section", refuse):
            f = load((code, cache))
        torch.testing.assert_close(f(m, x), m(x))

    def test_cached_bytecode_is_used_only_when_python_code_pins_it(self):
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend="eager")
        envelope = format_module._read_envelope(cache)
        _, other_cache = precompile(lambda m, x: m(x) * 3, m, x, backend="eager")
        other = format_module._read_envelope(other_cache)
        for bytecode, warns in (
            (other["artifact"]["bytecode"], True),  # another artifact's code: not what python_code pins
            ({**other["artifact"]["bytecode"], "magic": "0d0d0a0a"}, False),  # another Python's: unused
        ):
            envelope["artifact"]["bytecode"] = bytecode
            artifact_module._warn_once.cache_clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                f = load((code, format_module._pack_envelope(envelope)))
            self.assertEqual(any("compiled Python does not match" in str(w.message) for w in caught), warns)
            torch.testing.assert_close(f(m, x), m(x))  # not m(x) * 3: compiled from python_code

    @parametrize("backend", BACKENDS)
    def test_warm_load_parses_no_header(self, backend):
        """The cache's copy of the header (pinned by BYTECODE_SHA256) is what ast reads from python_code."""
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend=backend)
        warm = format_module.read_artifact(code, cache, header_from_cache=True)
        parsed = format_module.read_artifact(code, cache)
        self.assertEqual(warm.constants, parsed.constants)
        self.assertEqual(warm.convention, parsed.convention)
        # No driver: load() takes the installed one, the section's exact text.
        self.assertEqual(set(warm.compiled), {"header", "graph", "forward"})
        with mock.patch.object(format_module, "_parse", side_effect=AssertionError("load() parsed python_code")):
            f = load((code, cache))
        torch.testing.assert_close(f(m, x), m(x))

    @parametrize("section", ["header", "forward"])
    def test_edited_python_code_runs_as_it_now_reads(self, section):
        # Edited text whose cache is re-bound to it (code_hash) keeps its stale
        # BYTECODE_SHA256: the cache's compiled parts are not used for it.
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend="eager")
        if section == "header":
            edited = code.replace("# Pass the model(s) again", "# An edited comment.\n# Pass the model(s) again", 1)
        else:
            edited = code + "\nforward = (lambda run: lambda *args: run(*args) * 2)(forward)\n"
        envelope = format_module._read_envelope(cache)
        envelope["code_hash"] = format_module._text_hashes(edited)[1]
        rebound = format_module._pack_envelope(envelope)
        self.assertEqual(format_module.read_artifact(edited, rebound, header_from_cache=True).compiled, {})
        artifact_module._warn_once.cache_clear()
        with self.assertWarnsRegex(UserWarning, "python_code was edited after its compiled Python was recorded"):
            f = load((edited, rebound))
        torch.testing.assert_close(f(m, x), m(x) * (2 if section == "forward" else 1))

    @parametrize("autoload", [False, True])
    @parametrize("backend", BACKENDS)
    def test_runs_alone_in_fresh_interpreter(self, backend, autoload):
        # python_code needs nothing but torch and no cache: run it as README's
        # "Running an artifact without load()" does, with the patch hidden
        # (autoload off) and with it installed (autoload on: no warning, and
        # the artifact's errors are torch_precompile.PrecompileError).
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        code, _ = _artifact("mlp_train", _train_step, m, x, y, backend=backend)
        with tempfile.TemporaryDirectory() as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("artifact.py", "state.pt", "out.pt")}
            with open(paths["artifact.py"], "w") as f:
                f.write(code)
            torch.save({"model": m.state_dict(), "x": x, "y": y}, paths["state.pt"])
            script = textwrap.dedent(
                f"""
                import sys, torch, torch.nn as nn
                data = torch.load({paths['state.pt']!r})
                m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
                m.load_state_dict(data["model"])
                namespace = {{}}
                exec(open({paths['artifact.py']!r}).read(), namespace)
                loss = namespace["forward"](m, data["x"], data["y"])
                assert "torch_precompile._precompile" not in sys.modules
                if {autoload}:
                    import torch_precompile

                    try:
                        namespace["forward"](m, data["x"][:1], data["y"][:1])
                    except torch_precompile.PrecompileError as error:
                        assert "expected shape" in str(error), error
                    else:
                        raise AssertionError("a wrong shape was accepted")
                torch.save({{"loss": loss, "grads": [p.grad for p in m.parameters()]}}, {paths['out.pt']!r})
                """
            )
            result = _run_python(script, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": str(int(autoload))})
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertNotIn("Warning", result.stderr)
            out = torch.load(paths["out.pt"])
        reference = copy.deepcopy(m)
        torch.testing.assert_close(out["loss"], _train_step(reference, x, y).detach())
        for ours, theirs in zip(out["grads"], reference.parameters()):
            torch.testing.assert_close(ours, theirs.grad)


    def test_driver_core_calls_into_parts_only_by_these_names(self):
        """The core refers to a part's names only where the convention has what the part serves
        (format_module.driver_parts); a part refers to the core and itself alone."""
        core, parts = format_module._installed_driver()
        self.assertEqual(
            list(parts), ["gradients", "data_parallel", "sharded", "optimizer", "input_objects", "inductor", "library_hooks"]
        )
        known = set(dir(builtins)) | _top_level_names(core)
        owners = {name: part for part, text in parts.items() for name in _top_level_names(text)}
        called_from_core = {name: owners.get(name) for name in _global_references(core) - known}
        self.assertEqual(
            called_from_core,
            {
                "Gradients": "gradients",  # where the convention checks, reads or writes a .grad
                "check_data_parallel": "data_parallel",  # for a module spec with data_parallel
                # for a state spec with sharded
                **dict.fromkeys(
                    ("check_fully_shard", "check_sharded_parameters", "parallel_hook_description", "parallel_style_settings",
                     "sharded_inputs"),
                    "sharded",
                ),
                "OptimizerArgument": "optimizer",  # for each optimizer spec
                **dict.fromkeys(
                    # for rebound_inputs / returned_inputs
                    ("LeftAsWritten", "_forget_written", "leaf_places", "leaf_slots", "mutable_node_types", "node_at",
                     "shared_container_error", "write_back", "write_places"),
                    "input_objects",
                ),
                "LIBRARY_HOOK_FIXES": "library_hooks",  # where a module argument has a library's class
            },
        )
        for part, text in parts.items():
            with self.subTest(part=part):
                self.assertEqual(_global_references(text) - known - _top_level_names(text), set())

    def test_driver_parts(self):
        """Each artifact carries the driver's core and the parts its convention uses, and runs alone."""
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)

        def rebinds(m, state):
            state["x"] = state["x"] * 2
            return m(state["x"])

        def optimizer_step(m, opt, x, y):
            F.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()

        for name, fn, arguments, backend, parts in (
            ("forward", _forward, lambda m: (m, x), "eager", ()),
            ("forward", _forward, lambda m: (m, x), "inductor", ("inductor",)),
            ("rebinds", rebinds, lambda m: (m, {"x": x.clone()}), "eager", ("input_objects",)),
            ("train_step", _train_step, lambda m: (m, x, y), "eager", ("gradients",)),
            (
                "optimizer",
                optimizer_step,
                lambda m: (m, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), x, y),
                "eager",
                ("gradients", "optimizer"),
            ),
        ):
            with self.subTest(name, backend=backend):
                code, _ = _artifact(f"parts_{name}", fn, *arguments(copy.deepcopy(m)), backend=backend)
                self.assertEqual(format_module.driver_parts(format_module._read_convention(code)), parts)
                self.assertEqual(artifact_module._split_sections(code)["driver"][1], format_module._driver_source(parts))
                self.assertTrue(format_module.runs_installed_driver(code))
                namespace = {}
                exec(code, namespace)  # alone: the embedded driver, not the installed one
                self.assertIsNot(namespace["PrecompiledFunction"], runtime.PrecompiledFunction)
                ours, theirs = arguments(copy.deepcopy(m)), arguments(copy.deepcopy(m))
                for _ in range(2):  # the second call accumulates onto the .grad the first left
                    torch.testing.assert_close(namespace["forward"](*ours), fn(*theirs))
                    for got, want in zip(ours[0].parameters(), theirs[0].parameters()):
                        torch.testing.assert_close(got.grad, want.grad)
                for got, want in zip(ours[0].parameters(), theirs[0].parameters()):
                    torch.testing.assert_close(got, want)
                if name == "rebinds":
                    torch.testing.assert_close(ours[1], theirs[1])
                if name == "forward" and backend == "eager":
                    # A hook is refused by the core alone: no library's fix is looked up.
                    ours[0].register_forward_hook(lambda *_: None)
                    with self.assertRaisesRegex(PrecompileError, r"args\[0\] has a forward hook .* Remove it"):
                        namespace["forward"](*ours)
        # library_hooks: carried where a module argument has a submodule of a library whose
        # handle-less hooks it names (test_precompile_llm.py runs one, transformers' Llama).
        convention = format_module._read_convention(_artifact("parts_forward", _forward, m, x, backend="eager")[0])
        module = convention.modules[0]
        library = module._replace(classes=(*module.classes[:-1], "transformers.activations.GELUActivation"))
        self.assertEqual(format_module.driver_parts(convention._replace(modules=(library,))), ("library_hooks",))
        self.assertEqual({key.partition(".")[0] for key in runtime.LIBRARY_HOOK_FIXES}, schema.HOOK_LIBRARIES)

    def test_installed_driver_is_recognised_only_by_its_exact_text(self):
        """load() runs the installed driver for a driver section that is its core then whole installed
        parts, compared in place inside python_code; any other text runs as the artifact's own."""
        core, parts = format_module._installed_driver()
        gradients, optimizer = parts["gradients"], parts["optimizer"]
        for what, text, installed in (
            ("core", core, True),
            ("core and two parts", core + gradients + optimizer, True),
            ("a part cut short", core + gradients[:-1], False),
            ("a core cut short", core[:-1] + gradients, False),
            ("an unknown part", core + gradients.replace("driver part: gradients", "driver part: gradient"), False),
            ("code after the core", core + "\nx = 1\n", False),
            ("an edited core", core.replace("def ", "def  ", 1), False),
        ):
            with self.subTest(what):
                self.assertEqual(format_module._is_installed_driver(text), installed)
                self.assertEqual(format_module._is_installed_driver("head" + text + "tail", 4, 4 + len(text)), installed)

    @parametrize("backend", BACKENDS)
    def test_embedded_driver_runs_when_installed_one_differs(self, backend):
        m, x = small_mlp(), torch.randn(3, 8)
        code, cache = _artifact("mlp_forward", _forward, m, x, backend=backend)
        self.assertIs(type(precompile.load(code, cache)), runtime.PrecompiledFunction)
        # Another driver version: the driver section is compiled and runs instead.
        marker = format_module._marker("forward")
        other = code.replace(marker, "\n# another driver version" + marker, 1)
        pin = format_module._pin_line(format_module._read_constants(code)["BYTECODE_SHA256"])
        other, bytecode = artifact_module._record_bytecode(other.replace(pin, format_module._NO_BYTECODE, 1))
        kernels = format_module._read_envelope(cache)["artifact"]["kernels"]
        compile_section = artifact_module._compile_section
        compiled = []

        def recording(filename, line_offset, text):
            compiled.append(text)
            return compile_section(filename, line_offset, text)

        with mock.patch.object(artifact_module, "_compile_section", recording):
            embedded = precompile.load(other, artifact_module._package(other, backend, kernels, bytecode))
        # The cache holds no driver: only that section is compiled, the others come from the cache.
        self.assertEqual(compiled, [artifact_module._split_sections(other)["driver"][1]])
        self.assertIsNot(type(embedded), runtime.PrecompiledFunction)
        self.assertEqual(type(embedded).__module__, "torch_precompile_driver")
        torch.testing.assert_close(embedded(m, x), m(x))
        with self.assertRaisesRegex(PrecompileError, "expected shape"):
            embedded(m, torch.randn(2, 8))


class TestLoad(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model, cls.x = small_mlp(), torch.randn(3, 8)
        cls.code, cls.cache = _artifact("mlp_forward", _forward, cls.model, cls.x, backend="eager")

    def test_warns_on_every_load(self):
        for _ in range(2):
            with self.assertLogs("torch_precompile._precompile", level=logging.WARNING) as logs:
                precompile.load(self.code, self.cache)
            self.assertIn("executes python_code", logs.output[0])

    def test_invalid_python(self):
        with self.assertRaisesRegex(PrecompileError, "not valid Python"):
            precompile.load("def broken(:\n", self.cache)

    def test_missing_metadata(self):
        with self.assertRaisesRegex(PrecompileError, r"missing the calling-convention metadata \['CALLING_CONVENTION'\]"):
            precompile.load("FORMAT_VERSION = 1\nBACKEND = 'eager'\n", self.cache)

    def test_non_literal_metadata_not_executed(self):
        code = "FORMAT_VERSION = 1\nBACKEND = 'eager'\nCALLING_CONVENTION = __import__('os').system('false')\n"
        with self.assertRaisesRegex(PrecompileError, "CALLING_CONVENTION is not a plain literal"):
            precompile.load(code, self.cache)

    def test_header_statements_other_than_the_constants_are_refused(self):
        # Standalone exec would run them; load() only reads the constants: refused so the two agree.
        marker = "\n# ==================== graph ====================\n"
        self.assertIn(marker, self.code)
        for statement, shown in (
            ("CALLING_CONVENTION['inputs'][0]['tensor']['shape'] = [5, 8]", r"CALLING_CONVENTION\['inputs'\]"),
            ("print('header statement ran')", r"print\('header statement ran'\)"),
            ("OTHER = 1", "OTHER = 1"),
        ):
            edited = self.code.replace(marker, f"\n{statement}\n{marker}", 1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the empty cache is ignored with a warning
                with self.assertRaisesRegex(
                    PrecompileError, rf"header .* may only assign literals .* but line \d+ is .{shown}.*the header was edited"
                ):
                    precompile.load(edited, b"")

    def test_sections_moved_above_the_graph_are_named(self):
        # They were reported as a header statement (the driver's docstring).
        graph, driver, forward = (f"\n# {'=' * 20} {name} {'=' * 20}\n" for name in ("graph", "driver", "forward"))
        header, rest = self.code.split(graph)
        graph_text, rest = rest.split(driver)
        driver_text, forward_text = rest.split(forward)
        tail = driver + driver_text + forward + forward_text
        for edited, message in (
            (header + driver + driver_text + graph + graph_text + forward + forward_text, "precedes the graph section"),
            (header + tail, "has no graph section before it"),
        ):
            with self.subTest(message), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the empty cache is ignored with a warning
                with self.assertRaisesRegex(PrecompileError, f"python_code's driver section {message} .*: it was edited"):
                    precompile.load(edited, b"")

    def test_newer_and_older_format_refused(self):
        low, high = format_module.MIN_CONVENTION_VERSION, format_module.CONVENTION_VERSION
        supported = rf"supports \({low}\.\.{high}\)"
        for other, word in ((99, "newer"), (low - 1, "older")):
            code = self.code.replace(f"{{'format_version': {high},", f"{{'format_version': {other},", 1)
            with self.assertRaisesRegex(PrecompileError, rf"python_code has format version {other}, {word} than .*{supported}"):
                precompile.load(code, self.cache)
        for other in ("'4'", "True", "None"):
            code = self.code.replace(f"{{'format_version': {high},", f"{{'format_version': {other},", 1)
            with self.assertRaisesRegex(PrecompileError, rf"format version {re.escape(other)}, which is malformed \(expected an int in {low}\.\.{high}\)"):
                precompile.load(code, self.cache)

    def test_code_hash_mismatch(self):
        with self.assertRaisesRegex(PrecompileError, "code_hash mismatch"):
            precompile.load(self.code + "\n# edited\n", self.cache)

    def test_backend_mismatch(self):
        m, x = self.model, self.x
        inductor_code, inductor_cache = _artifact("mlp_forward", _forward, m, x, backend="inductor")
        with self.assertRaisesRegex(PrecompileError, "built for backend 'inductor' but python_code is for 'eager'"):
            precompile.load(self.code, inductor_cache)
        with self.assertRaisesRegex(PrecompileError, "built for backend 'eager' but python_code is for 'inductor'"):
            precompile.load(inductor_code, self.cache)

    @parametrize(
        "damage",
        ["empty", "truncated", "flipped", "foreign", "pickle"],
    )
    def test_damaged_cache_is_ignored_with_a_warning(self, damage):
        # The cache only accelerates: the artifact compiles from python_code.
        code, cache = _artifact("mlp_forward", _forward, self.model, self.x, backend="inductor")
        buffer = io.BytesIO()
        torch.save({"weights": torch.ones(3)}, buffer)
        damaged = {
            "empty": b"",
            "truncated": cache[: len(cache) // 2],
            "flipped": bytes(b ^ 0xFF if i == len(cache) // 2 else b for i, b in enumerate(cache)),
            "foreign": b"\x89PNG\r\n\x1a\n" + os.urandom(64),
            "pickle": buffer.getvalue(),
        }[damage]
        # A flipped byte may land in the compiled Python, which is then compiled again (the kernels still load).
        artifact_module._warn_once.cache_clear()
        with self.assertWarnsRegex(UserWarning, "ignoring the cache: cache is damaged|compiled Python does not match"):
            f = precompile.load(code, damaged)
        self.assertEqual(f(self.model, self.x), self.model(self.x))

    def test_wrong_types(self):
        with self.assertRaisesRegex(PrecompileError, "python_code: expected str, got bytes"):
            precompile.load(b"x", self.cache)
        with self.assertRaisesRegex(PrecompileError, "cache: expected bytes, got str"):
            precompile.load(self.code, "x")
        with self.assertRaisesRegex(PrecompileError, "cache: expected bytes, got NoneType; to load without a cache pass b''"):
            precompile.load(self.code, None)


class TestConventionSchema(TestCase):
    """The calling convention's records are their schema: one codec, a short list of invariants."""

    @staticmethod
    def convention(**changes):
        """A hand-built convention using every record, field kind and union case."""
        pytree = torch.utils._pytree
        t = schema.TensorSpec
        x = t((None, 4), None, "float32", "cpu", free_dims=((0, 0, 2, None),), memory_format="contiguous_format")
        fields = dict(
            format_version=format_module.CONVENTION_VERSION,
            backend="inductor",
            arity=4,
            modules=(
                schema.ModuleSpec(
                    position=0,
                    parameters=("w",),
                    buffers=("b",),
                    submodules=(("", True), ("sub", None)),
                    classes=("torch.nn.Module", "torch.nn.Module"),
                    attributes=(
                        ("sub", "eps", 1e-5),
                        ("", "sizes", (1, (float("-inf"), None))),
                        # value_literal()'s tagged values (test_precompile_read_guards.py)
                        ("", "config.scales", {"list": (0.5, float("nan"), {"dtype": "float64"})}),
                        ("", "table", {"dict": ((2, {"size": (3, 4)}), ("a", {"enum": ("m.Mode", "A")}))}),
                        ("", "gain", {"numpy": ("float32", float("inf"))}),
                        ("", "window", {"missing": ()}),
                    ),
                ),
            ),
            state=(
                schema.StateSpec("parameter", ((0, "w"),), t((2,), (1,), "float32", "cpu", requires_grad=True)),
                schema.StateSpec("buffer", ((0, "b"),), t((), (), "int64", "cpu")),
            ),
            input_spec=pytree.tree_structure((0, {"a": 0, "b": 0})),
            inputs=(
                schema.LeafSpec(tensor=x),
                schema.LeafSpec(value=None),
                schema.LeafSpec(value=float("nan")),
            ),
            output_spec=pytree.tree_structure([0, 0, 0]),
            outputs=(
                schema.LeafSpec(graph_output=0),
                schema.LeafSpec(value=None),
                schema.LeafSpec(value=float("inf")),
            ),
            grad_state=(0,),
            constants=(schema.ConstantSpec((2,), "int32", "cpu", "AQAAAAIAAAA="),),
            needs_grad=True,
            mutated=(1,),
            default_dtype="float32",
            autocast=(("cpu", "bfloat16"),),
            optimizers=(
                schema.OptimizerSpec(
                    position=1,
                    cls="Adam",
                    groups=((0,),),
                    hyper=((("betas", (0.9, 0.999)), ("eps", 1e-8), ("foreach", None)),),
                    keys=("step", "exp_avg"),
                    stepped=((0, 0),),
                    tensors=(t((), (), "float32", "cpu"), t((2,), (1,), "float32", "cpu")),
                ),
            ),
            grad_inputs=(0,),
            grads_assigned=(0,),
            output_tensors=(t((None, 3), None, "float32", "cpu"),),
        )
        fields.update(changes)
        return schema.CallingConvention(**fields)

    def literal(self, **changes):
        return self.convention(**changes).to_literal()

    def assert_malformed(self, literal, message):
        with self.assertRaisesRegex(PrecompileError, "calling convention is malformed: " + message):
            schema.CallingConvention.from_literal(literal)

    def test_round_trip_of_every_record(self):
        convention = self.convention()
        literal = convention.to_literal()
        self.assertEqual(ast.literal_eval(repr(literal)), literal)  # plain literals only
        decoded = schema.CallingConvention.from_literal(literal)
        self.assertEqual(decoded, convention)
        self.assertIsInstance(decoded.input_spec, torch.utils._pytree.TreeSpec)  # serialized only at the edges
        self.assertTrue(schema.same_value(decoded.inputs[2].value, float("nan")))
        self.assertEqual(decoded.sizes, ((0, 0),))  # derived from the inputs' free dims
        for record in (decoded.modules[0], decoded.state[0], decoded.inputs[0], decoded.constants[0], decoded.optimizers[0]):
            self.assertEqual(schema._DECODERS[type(record)](schema._to_literal(record)), record)

    def test_records_behave_as_named_tuples(self):
        # Record: typing.NamedTuple's interface without its per-class eval at import.
        spec = schema.TensorSpec((2, 3), (3, 1), "float32", "cpu")
        self.assertEqual(spec, (((2, 3), (3, 1), "float32", "cpu", (), None, False)))
        self.assertEqual((spec.shape, spec.free_dims, spec.requires_grad), ((2, 3), (), False))
        self.assertEqual(schema.TensorSpec._fields[:4], ("shape", "stride", "dtype", "device"))
        self.assertEqual(spec._replace(dtype="int64").dtype, "int64")
        self.assertEqual(schema.TensorSpec._make(spec), spec)
        self.assertFalse(hasattr(spec, "__dict__"))
        self.assertEqual(copy.deepcopy(spec), spec)
        self.assertEqual(pickle.loads(pickle.dumps(spec)), spec)
        self.assertEqual(repr(schema.LeafSpec(graph_output=1)), "LeafSpec(tensor=None, graph_output=1, value=Ellipsis)")
        self.assertEqual(schema.OptimizerSpec(*range(7)).cls, 1)  # a field may be named cls
        with self.assertRaisesRegex(TypeError, r"TensorSpec\(\) lacks its field 'stride'"):
            schema.TensorSpec((2,))
        with self.assertRaisesRegex(TypeError, r"unexpected or repeated fields \['shape'\]"):
            schema.TensorSpec((2,), None, "float32", "cpu", shape=(3,))
        with self.assertRaisesRegex(TypeError, "takes 4 fields, got 5"):
            schema.StateSpec(1, 2, 3, 4, 5)
        with self.assertRaisesRegex(TypeError, "fields with defaults must come last"):

            class Bad(schema.Record):
                first: int = 0
                second: int

    def test_defaults_omitted_and_leaves_tagged(self):
        literal = self.literal()
        self.assertNotIn("grads_cleared", literal)
        self.assertEqual(literal["state"][1]["tensor"], {"shape": [], "stride": [], "dtype": "int64", "device": "cpu"})
        self.assertEqual(literal["inputs"][1], {"value": None})  # a baked None
        self.assertEqual(literal["outputs"][0], {"graph_output": 0})
        self.assertEqual(literal["inputs"][2], {"value": {"nonfinite_float": "nan"}})
        self.assertNotIn("sizes", literal)  # stored once, as free_dims
        self.assertFalse(schema.LeafSpec(tensor=self.convention().inputs[0].tensor).is_value)
        self.assertTrue(schema.LeafSpec(value=None).is_value)

    def test_malformed_field_of_each_kind(self):
        def edited(path, value):
            literal = self.literal()
            container = literal
            for key in path[:-1]:
                container = container[key]
            if value is KeyError:
                del container[path[-1]]
            else:
                container[path[-1]] = value
            return literal

        for path, value, message in (
            (("arity",), -1, r"arity = -1 \(an int >= 0\)"),
            (("arity",), True, r"arity = True \(an int >= 0\)"),
            (("needs_grad",), 1, r"needs_grad = 1 \(a bool\)"),
            (("modules", 0, "parameters", 0), 7, r"modules\[0\]\.parameters\[0\] = 7 \(a str\)"),
            (("modules", 0, "submodules", 1, 1), "no", r"modules\[0\]\.submodules\[1\]\[1\] = 'no' \(a bool\)"),
            (("modules", 0, "submodules", 1), ["sub"], r"modules\[0\]\.submodules\[1\] = \['sub'\] \(a list of 2\)"),
            (("grad_state",), (0,), r"grad_state = \(0,\) \(a list\)"),
            (("state", 0), [], r"state\[0\] = \[\] \(a dict of StateSpec fields\)"),
            (("state", 0, "kind"), "weight", r"state\[0\]\.kind = 'weight' \(one of \['parameter', 'buffer'\]\)"),
            (("state", 0, "tensor", "dtype"), "float33", r"state\[0\]\.tensor\.dtype = 'float33' \(a torch dtype name\)"),
            (("state", 0, "tensor", "device"), "nowhere:0", r"state\[0\]\.tensor\.device = 'nowhere:0' \(a torch device\)"),
            (("state", 0, "tensor", "shape", 0), None, None),  # Count | None: an invariant refuses it below
            (("state", 0, "tensor", "shape", 0), 2.0, r"state\[0\]\.tensor\.shape\[0\] = 2\.0 \(an int >= 0\)"),
            (("state", 0, "tensor"), KeyError, r"state\[0\]: StateSpec lacks its field 'tensor'"),
            (("inputs", 0, "extra"), 1, r"inputs\[0\]: LeafSpec has unknown fields \['extra'\]"),
            (("inputs", 1, "value"), [1], r"inputs\[1\]\.value = \[1\] \(a Python leaf value"),
            (("inputs", 2, "value"), {"nonfinite_float": "1e999"}, r"inputs\[2\]\.value = \{'nonfinite_float': '1e999'\}"),
            (("inputs", 0, "tensor", "memory_format"), "strided", r"inputs\[0\]\.tensor\.memory_format = 'strided' \(one of \['contiguous_format'"),
            (("input_spec",), "not a tree spec", r"input_spec = 'not a tree spec' \(a pytree\.treespec_dumps string\)"),
            (("modules", 0, "attributes", 0, 2), {"a": 1}, r"modules\[0\]\.attributes\[0\]\[2\] = \{'a': 1\} \(a Python leaf value"),
            (("modules", 0, "attributes", 0, 2), {"size": [-1]}, r"modules\[0\]\.attributes\[0\]\[2\] = \{'size': \[-1\]\} \(a Python leaf value"),
            (("modules", 0, "attributes", 0, 2), {"enum": ["m.Mode"]}, r"modules\[0\]\.attributes\[0\]\[2\] = \{'enum': \['m\.Mode'\]\} \(a Python leaf value"),
            (("modules", 0, "attributes", 0, 2), {"dtype": "float33"}, r"modules\[0\]\.attributes\[0\]\[2\] = \{'dtype': 'float33'\} \(a Python leaf value"),
            (("inputs", 1, "value"), {"list": [1]}, r"inputs\[1\]\.value = \{'list': \[1\]\} \(a Python leaf value"),
            (("autocast", 0, 0), "tpu", r"autocast\[0\]\[0\] = 'tpu' \(one of \['cpu'"),
            (("optimizers", 0, "hyper", 0, 0, 0), 1, r"optimizers\[0\]\.hyper\[0\]\[0\]\[0\] = 1 \(a str\)"),
        ):
            if message is None:
                continue
            with self.subTest(path=path):
                self.assert_malformed(edited(path, value), message)
        self.assert_malformed([], r"CALLING_CONVENTION = \[\] \(a dict of CallingConvention fields\)")

    def test_invariants_name_field_and_value(self):
        t = schema.TensorSpec
        for changes, message in (
            (dict(grad_state=(1,)), r"grad_state = \(1,\) \(expected increasing indices within \[0\]\)"),
            (dict(mutated=(5,)), r"mutated = \(5,\)"),
            (
                dict(modules=(self.convention().modules[0]._replace(position=4),)),
                r"modules\[0\]\.position = 4 \(expected a distinct argument position < arity 4\)",
            ),
            (dict(inputs=(schema.LeafSpec(),) * 3), r"inputs\[0\] = LeafSpec\(.*\) \(expected exactly one of tensor, value\)"),
            (dict(outputs=(schema.LeafSpec(graph_output=1),) * 3), r"outputs = \[1, 1, 1\] \(graph_output indices"),
            (dict(output_spec=torch.utils._pytree.tree_structure([0])), r"output_spec = .* \(expected 3 leaves\)"),
            (
                dict(inputs=(schema.LeafSpec(tensor=t((None,), None, "float32", "cpu")),) + self.convention().inputs[1:]),
                r"inputs\[0\]\.tensor\.free_dims = \(\) \(expected one entry per None dim",
            ),
            (
                dict(constants=(schema.ConstantSpec((3,), "int32", "cpu", "AQAAAAIAAAA="),)),
                r"constants\[0\]\.data = '8 bytes' \(expected \(3,\) int32\)",
            ),
            (dict(output_tensors=()), r"output_tensors = \(\) \(expected one per tensor output \(1\)\)"),
            (
                dict(output_tensors=(t((3,), (1,), "float32", "cpu"),)),
                r"output_tensors\[0\] = TensorSpec\(.*\) \(records only shape, dtype and device\)",
            ),
        ):
            with self.subTest(changes=list(changes)):
                self.assert_malformed(self.literal(**changes), message)

    def test_version_outside_the_supported_range(self):
        low, high = format_module.MIN_CONVENTION_VERSION, format_module.CONVENTION_VERSION
        for version, word in ((high + 1, "newer"), (low - 1, "older")):
            code = "CALLING_CONVENTION = " + repr(self.literal(format_version=version)) + "\n"
            with self.assertRaisesRegex(
                PrecompileError, rf"format version {version}, {word} than .* supports \({low}\.\.{high}\)"
            ):
                format_module._read_convention(code)
        self.assertEqual(format_module._read_convention("CALLING_CONVENTION = " + repr(self.literal())), self.convention())


class TestRuntimeChecks(TestCase):
    @parametrize("backend", BACKENDS)
    def test_call_errors_name_the_argument(self, backend):
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        f = load(_artifact("mlp_train", _train_step, m, x, y, backend=backend))
        cases = [
            ((m, x), {}, r"fn\(m, x, y\): missing a required argument: 'y'"),
            ((m, x), {"target": y}, r"fn\(m, x, y\): got an unexpected keyword argument 'target'"),
            ((x, x, y), {}, r"args\[0\]: expected an nn.Module .* got Tensor"),
            ((m, [x], y), {}, r"args\[1\]: input structure differs"),
            ((m, torch.randn(4, 8), y), {}, r"args\[1\]: expected shape \(3, 8\), got \(4, 8\)"),
            ((m, x.double(), y), {}, r"args\[1\]: expected dtype torch.float32, got torch.float64"),
            ((m, x.to("meta"), y), {}, r"args\[1\]: expected device cpu, got meta"),
            ((m, x, 1.0), {}, r"args\[2\]: expected a Tensor of shape \(3, 4\), got float"),
        ]
        for args, kwargs, pattern in cases:
            with self.assertRaisesRegex(PrecompileError, pattern):
                f(*args, **kwargs)
        self.assertIsNone(m[0].weight.grad)  # nothing ran

    @parametrize("backend", BACKENDS)
    def test_model_structure_checked(self, backend):
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        f = load(_artifact("mlp_train", _train_step, m, x, y, backend=backend))
        renamed = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        renamed.add_module("out", nn.Linear(16, 4))  # same count, other names
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]: the module's parameters differ.*missing \['2.weight', '2.bias'\]"):
            f(renamed, x, y)
        wider = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.2\.weight \(parameter\): expected shape \(4, 16\), got \(5, 16\)"):
            f(wider, x, y)
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.0\.weight \(parameter\): expected dtype torch.float32, got torch.float64"):
            f(copy.deepcopy(m).double(), x, y)
        # A parameter swapped after a successful call is re-checked.
        f(m, x, y)
        m[2].weight = nn.Parameter(torch.randn(4, 16, dtype=torch.float64))
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.2\.weight \(parameter\): expected dtype"):
            f(m, x, y)

    @parametrize("backend", BACKENDS)
    def test_layout_specialization(self, backend):
        # Both backends: eager's trace bakes layout decisions too (.contiguous(), reshape).
        m, x = small_mlp(), torch.randn(3, 8)
        f = load(_artifact("mlp_forward", _forward, m, x, backend=backend))
        transposed = torch.randn(8, 3).t()
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected strides \(8, 1\), got \(1, 3\).*contiguous\(\)"):
            f(m, transposed)
        torch.testing.assert_close(f(m, transposed.contiguous()), m(transposed))
        # Size-1 dims may have any stride (Inductor's own exemption, kept for eager).
        one = torch.randn(1, 8)
        g = load(_artifact("mlp_forward_b1", _forward, m, one, backend=backend))
        odd = torch.randn(8, 1).t()
        self.assertEqual(odd.stride(), (1, 1))  # captured (8, 1): differs only in the size-1 dim
        torch.testing.assert_close(g(m, odd), m(odd))

    @parametrize("backend", BACKENDS)
    def test_outputs_have_eagers_layout(self, backend):
        # Inductor's decompositions gave these other strides than ATen's: cat returns its
        # memory format (contiguous here) even when one input is all that is not empty, as
        # a DynamicCache's first update concatenates transposed keys to an empty cache;
        # index_select and linalg.cross of a channels_last tensor are contiguous.
        def fn(empty, x, channels_last, index):
            transposed = x.transpose(1, 2)
            return (
                torch.cat([empty, transposed], dim=2), torch.cat([transposed]), torch.cat([channels_last]),
                channels_last.index_select(1, index), torch.linalg.cross(channels_last[:, :3], channels_last[:, 1:], dim=1),
                transposed,  # a view keeps its base's strides
            )

        channels_last = torch.randn(2, 4, 5, 6).to(memory_format=torch.channels_last)
        args = torch.empty(2, 3, 0, 5), torch.randn(2, 4, 3, 5), channels_last, torch.tensor([2, 0])
        f = load(_artifact("output_layouts", fn, *args, backend=backend))
        for got, want in zip(f(*args), fn(*args)):
            torch.testing.assert_close(got, want)
            self.assertEqual(got.stride(), want.stride())

    @parametrize("backend", BACKENDS)
    def test_an_index_out_of_range_raises_and_the_process_goes_on(self, backend):
        # Inductor's C++ kernels check indices with a throw, which in the OpenMP region of a
        # kernel this large (2 x 512 elements a thread, or more) aborted the process, where
        # eager raises IndexError.  A decode step's cache write at a position past its end:
        # nothing is written there, and the next call goes on.
        class Decoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(10, 512)
                self.register_buffer("cache", torch.zeros(2, 8, 512))

            def forward(self, ids, position):
                self.cache.index_copy_(1, position, self.embed(ids))
                return self.cache.sum(1)

        def fn(m, ids, position):
            return m(ids, position)

        torch.manual_seed(0)
        m, ids = Decoder(), torch.tensor([[1], [2]])
        pair = _artifact("index_out_of_range", fn, m, ids, torch.tensor([3]), backend=backend)
        if backend == "inductor" and torch.get_num_threads() > 1:
            self.assertIn("#pragma omp parallel", pair[0])
            self.assertIn("catch (...) { precompile_error.keep(); }", pair[0])
        f, eager = load(pair), copy.deepcopy(m)
        error = IndexError if backend == "eager" else RuntimeError  # as Inductor's smaller kernels raise
        for bad_ids, position in [(ids, torch.tensor([8])), (torch.tensor([[1], [10]]), torch.tensor([3]))]:
            with self.assertRaises(IndexError):
                fn(eager, bad_ids, position)
            with self.assertRaisesRegex(error, "out of (range|bounds)"):
                f(m, bad_ids, position)
            if position.item() == 8:  # every write is past the end: none happens
                torch.testing.assert_close(m.cache, eager.cache, atol=0, rtol=0)
        # Where some of the indices are in range, the graph may have written those
        # (eager's op checks all of them first): the Note leaves that to the caller.
        m.cache.copy_(eager.cache)
        torch.testing.assert_close(f(m, ids, torch.tensor([7])), fn(eager, ids, torch.tensor([7])))
        torch.testing.assert_close(m.cache, eager.cache)

    @parametrize("backend", BACKENDS)
    def test_an_integer_division_by_zero_raises_and_the_process_goes_on(self, backend):
        # C++ integer division by zero kills the process (SIGFPE), where eager raises:
        # Inductor divided raw in trunc division, and on torch 2.11-2.12 in //, % and fmod
        # too.  Each division has a divisor of its own; 999 columns make vectorized loops
        # with a tail, whose lanes past the end are not the divisor's, over several threads.
        def fn(a, floor, mod, trunc, remainder, fmod, small):
            return (a // floor, a % mod, torch.div(a, trunc, rounding_mode="trunc"), torch.remainder(a, remainder),
                    torch.fmod(a, fmod), torch.div(small, small.flip(0), rounding_mode="trunc"))

        a = torch.arange(-32 * 999, 32 * 999).view(64, 999)
        divisors = [torch.randint(1, 9, (64, 999)) * (1 - 2 * (torch.rand(64, 999) < 0.5)) for _ in range(5)]
        small = torch.tensor([5, -3, 7, 2, -9, 4, 6], dtype=torch.int32)
        pair = _artifact("integer_division_by_zero", fn, a, *divisors, small, backend=backend)
        if backend == "inductor":
            self.assertIn("(precompile_check_divisor(", pair[0])
        f = load(pair)
        for position in range(6):
            args = [a, *divisors, small.clone()]
            if position < 5:
                args[1 + position] = args[1 + position].clone().index_put_((torch.tensor(40), torch.tensor(998)), torch.tensor(0))
            else:
                args[6][2] = 0
            with self.assertRaisesRegex(RuntimeError, "^ZeroDivisionError$"):
                fn(*args)
            with self.assertRaisesRegex(RuntimeError, "^ZeroDivisionError$"):
                f(*args)
            for got, want in zip(f(a, *divisors, small), fn(a, *divisors, small)):
                torch.testing.assert_close(got, want, atol=0, rtol=0)

    @parametrize("backend", BACKENDS)
    def test_a_scatter_add_in_a_tiled_kernel_adds_where_eager_does(self, backend):
        # Falcon's multi-query attention: a key picked by a list index, broadcast over the
        # heads.  Its gradient is a scatter-add, which Inductor's 2-D tiled C++ kernel
        # indexed twice over several threads: into the wrong elements of qkv's gradient.
        class MultiQueryAttention(nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = nn.Linear(8, 6 * 8)

            def forward(self, x):
                qkv = self.qkv(x).view(2, 16, 6, 8)
                q, k, v = (t.transpose(1, 2) for t in (qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]))
                return (q @ k.transpose(-1, -2)).softmax(-1) @ v

        def step(m, x):
            out = m(x)
            (out * out).sum().backward()
            return out

        torch.manual_seed(0)
        m, x = MultiQueryAttention(), torch.randn(2, 16, 8)
        eager = copy.deepcopy(m)
        threads = torch.get_num_threads()
        torch.set_num_threads(2)  # atomic adds: the kernel runs its loop on several threads
        try:
            f = load(_artifact("tiled_scatter_add", step, copy.deepcopy(m), x, backend=backend))
            torch.testing.assert_close(f(m, x), step(eager, x))
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(m.qkv.weight.grad, eager.qkv.weight.grad)
        torch.testing.assert_close(m.qkv.bias.grad, eager.qkv.bias.grad)

    @parametrize("backend", BACKENDS)
    def test_pytree_input_paths(self, backend):
        def fn(m, batch):
            return m(batch["x"][0]) + batch["bias"]

        m, x = small_mlp(), torch.randn(3, 8)
        batch = {"x": [x], "bias": torch.zeros(4)}
        f = load(_artifact("pytree_paths", fn, m, batch, backend=backend))
        torch.testing.assert_close(f(m, batch), fn(m, batch))
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]\['x'\]\[0\]: expected shape \(3, 8\), got \(2, 8\)"):
            f(m, {"x": [torch.randn(2, 8)], "bias": torch.zeros(4)})
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: input structure differs"):
            f(m, {"x": x, "bias": torch.zeros(4)})


class TestLoadedRunnable(TestCase):
    """The loaded runnable among Python's and torch's tools: torch.compile, copy, pickle."""

    @staticmethod
    def _bn_forward(backend):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).eval()
        x = torch.randn(3, 8)
        return m, x, load(_artifact("bn_forward", _forward, m, x, backend=backend))

    @parametrize("backend", BACKENDS)
    def test_torch_compile_runs_it_eagerly_with_its_checks(self, backend):
        # Dynamo graph-breaks around the call instead of inlining the driver (its checks
        # would become guards): the artifact runs eagerly and still refuses what it refuses.
        m, x, f = self._bn_forward(backend)
        compiled = torch.compile(lambda m, x: f(m, x) * 2, backend="eager")
        torch.testing.assert_close(compiled(m, x), m(x) * 2)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected shape \(3, 8\), got \(5, 8\)"):
            compiled(m, torch.randn(5, 8))
        whole = torch.compile(lambda m, x: f(m, x) * 2, backend="eager", fullgraph=True)
        with self.assertRaisesRegex(torch._dynamo.exc.Unsupported, "precompile artifact runs eagerly"):
            whole(m, x)

    @parametrize("backend", BACKENDS)
    def test_copies_are_the_runnable_and_pickling_is_refused(self, backend):
        # Like a function: what it holds besides code are caches valid for any caller.
        m, x, f = self._bn_forward(backend)
        self.assertIs(copy.copy(f), f)
        self.assertIs(copy.deepcopy(f), f)
        holder = nn.Module()
        holder.net, holder.run = m, f  # e.g. an EMA copy of a model holding its artifact
        twin = copy.deepcopy(holder)
        self.assertIs(twin.run, f)
        torch.testing.assert_close(twin.run(twin.net, x), m(x))
        with self.assertRaisesRegex(PrecompileError, r"cannot be pickled.*save its \(python_code, cache\) pair and load"):
            pickle.dumps(f)


class TestIntrospection(TestCase):
    """PrecompiledFunction.graph_inputs / run_graph / with_graph: the supported hooks the benchmarks use."""

    @parametrize("backend", BACKENDS)
    def test_graph_inputs_and_run_graph(self, backend):
        m, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        f = load(_artifact("mlp_train", _train_step, m, x, y, backend=backend))
        inputs = f.graph_inputs(m, x, y)
        # The convention's order: parameters, then the user tensors (no sizes, optimizers, grads or constants).
        self.assertEqual([id(t) for t in inputs], [id(t) for t in (*m.parameters(), x, y)])
        reference = copy.deepcopy(m)
        expected = _train_step(reference, x, y).detach()
        with torch.no_grad():
            outputs = f.run_graph(inputs)
        self.assertEqual(len(inputs), 6)  # left as they were
        self.assertEqual(len(outputs), 1 + 4)  # the loss, then one gradient per parameter
        torch.testing.assert_close(outputs[0], expected)
        for grad, p in zip(outputs[1:], reference.parameters()):
            torch.testing.assert_close(grad, p.grad)
        self.assertTrue(all(p.grad is None for p in m.parameters()))  # run_graph writes no .grad
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected shape \(3, 8\), got \(2, 8\)"):
            f.graph_inputs(m, torch.randn(2, 8), y)
        with self.assertRaisesRegex(PrecompileError, "missing a required argument: 'y'"):
            f.graph_inputs(m, x)

    def test_with_graph_keeps_the_checks(self):
        m, x = small_mlp(), torch.randn(3, 8)
        f = load(_artifact("mlp_forward", _forward, m, x, backend="eager"))
        seen = []
        alone = f.with_graph(lambda inputs: seen.append(len(inputs)) or [torch.ones(3, 4)])
        torch.testing.assert_close(alone(m, x), torch.ones(3, 4))
        self.assertEqual(seen, [5])  # 4 parameters and x
        with self.assertRaisesRegex(PrecompileError, "expected shape"):
            alone(m, torch.randn(2, 8))
        torch.testing.assert_close(f(m, x), m(x))  # f itself still runs its graph


class TestInductorCache(TestCase):
    """Warm reload compiles nothing (design.md section 3)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        torch.manual_seed(0)
        cls.model = small_mlp()
        cls.x, cls.y = torch.randn(3, 8), torch.randn(3, 4)
        code, cache = _artifact("mlp_train", _train_step, cls.model, cls.x, cls.y, backend="inductor")
        cls.paths = {n: os.path.join(cls.tmp.name, n) for n in ("a.py", "a.cache", "data.pt", "stubs")}
        with open(cls.paths["a.py"], "w") as f:
            f.write(code)
        with open(cls.paths["a.cache"], "wb") as f:
            f.write(cache)
        torch.save({"model": cls.model.state_dict(), "x": cls.x, "y": cls.y}, cls.paths["data.pt"])
        reference = copy.deepcopy(cls.model)
        cls.expected_loss = _train_step(reference, cls.x, cls.y).detach()
        cls.expected_grads = [p.grad for p in reference.parameters()]
        # Recording stub compilers that always fail.
        os.makedirs(cls.paths["stubs"])
        cls.compiler_log = os.path.join(cls.tmp.name, "compiler.log")
        for name in ("gcc", "g++", "cc", "c++", "clang", "clang++"):
            stub = os.path.join(cls.paths["stubs"], name)
            with open(stub, "w") as f:
                f.write(f'#!/bin/sh\necho "$0 $@" >> {cls.compiler_log}\nexit 1\n')
            os.chmod(stub, 0o755)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def _child(self, out, extra_env=None, threads=None, cache_file=None, code_file=None):
        script = textwrap.dedent(
            f"""
            import sys, time, torch, torch.nn as nn, torch_precompile
            {f'torch.set_num_threads({threads})' if threads else ''}
            data = torch.load({self.paths['data.pt']!r})
            m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
            m.load_state_dict(data["model"])
            code = open({code_file or self.paths['a.py']!r}).read()
            cache = open({cache_file or self.paths['a.cache']!r}, "rb").read()
            f = torch_precompile.load(code, cache)
            loss = f(m, data["x"], data["y"])
            heavy = sorted(k for k in sys.modules if k.startswith(("torch._inductor", "torch._dynamo")))
            torch.save({{"loss": loss, "grads": [p.grad for p in m.parameters()], "heavy": heavy}}, {out!r})
            """
        )
        env = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=self.tmp.name)}
        env.update(extra_env or {})
        return _run_python(script, env=env)

    def _check(self, out):
        result = torch.load(out)
        torch.testing.assert_close(result["loss"], self.expected_loss)
        for ours, theirs in zip(result["grads"], self.expected_grads):
            torch.testing.assert_close(ours, theirs)
        return result

    def test_warm_load_runs_no_compiler_and_no_inductor_import(self):
        out = os.path.join(self.tmp.name, "warm.pt")
        env = {"PATH": self.paths["stubs"] + os.pathsep + os.environ["PATH"], "CXX": "g++", "CC": "gcc"}
        result = self._child(out, extra_env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertFalse(os.path.exists(self.compiler_log), "a compiler was invoked on the warm path")
        self.assertEqual(self._check(out)["heavy"], [])

    def test_more_threads_than_build(self):
        out = os.path.join(self.tmp.name, "threads.pt")
        result = self._child(out, threads=8)
        self.assertEqual(result.returncode, 0, result.stderr)
        self._check(out)

    def test_more_threads_than_a_one_thread_build(self):
        # Lowered on one thread, Inductor once left a reduction's scalar epilogue to every
        # thread of the loading process: the loss came out divided once per thread.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            code, cache = precompile(_train_step, copy.deepcopy(self.model), self.x, self.y, backend="inductor")
        finally:
            torch.set_num_threads(threads)
        paths = [os.path.join(self.tmp.name, name) for name in ("one_thread.py", "one_thread.cache")]
        with open(paths[0], "w") as f:
            f.write(code)
        with open(paths[1], "wb") as f:
            f.write(cache)
        out = os.path.join(self.tmp.name, "one_thread.pt")
        result = self._child(out, threads=8, code_file=paths[0], cache_file=paths[1])
        self.assertEqual(result.returncode, 0, result.stderr)
        self._check(out)

    def _check_built_elsewhere(self, field, value):
        """A cache whose build_env has ``field`` = ``value``: its kernels are ignored (one warning naming it) and compiled."""
        envelope = format_module._read_envelope(open(self.paths["a.cache"], "rb").read())
        envelope["build_env"] = dict(envelope["build_env"], **{field: value})
        other = os.path.join(self.tmp.name, f"other_{field}.cache")
        with open(other, "wb") as f:
            f.write(format_module._pack_envelope(envelope))
        out = os.path.join(self.tmp.name, f"other_{field}.pt")
        result = self._child(out, cache_file=other)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.count("were built for"), 1, result.stderr)
        self.assertIn(value, result.stderr)
        self._check(out)

    def test_other_environment_warns_once_and_jit_compiles(self):
        self._check_built_elsewhere("cpu_capability", "SOME_OTHER_ISA")

    def test_cpu_with_other_extensions_jit_compiles(self):
        # Inductor builds with -march=native: a CPU of the same capability (AVX512) lacking
        # an extension the builder had would fault on the cached kernels (SIGILL).
        built = format_module._read_envelope(open(self.paths["a.cache"], "rb").read())["build_env"]
        self.assertEqual(built["cpu_features"], format_module._cpu_features())
        self._check_built_elsewhere("cpu_features", built["cpu_features"] + " some_future_extension")

    def test_four_processes_share_one_cache_dir(self):
        shared = tempfile.mkdtemp(dir=self.tmp.name)
        outs = [os.path.join(self.tmp.name, f"proc{i}.pt") for i in range(4)]
        results = []

        def run(out):
            results.append(self._child(out, extra_env={"TORCHINDUCTOR_CACHE_DIR": shared}))

        threads = [threading.Thread(target=run, args=(out,)) for out in outs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for result in results:
            self.assertEqual(result.returncode, 0, result.stderr)
        for out in outs:
            self._check(out)
        so_files = os.listdir(os.path.join(shared, "precompile_kernels"))
        self.assertTrue(so_files and all(name.endswith(".so") for name in so_files), so_files)


def _scaled_relu(m, x):
    return torch.relu(m(x) * 2 + 1)


class TestVectorISA(TestCase):
    """Inductor's C++ is written for the capturing host's vector ISA; compiled elsewhere it is
    compiled for that ISA or refused.  Another host is simulated with ATEN_CPU_CAPABILITY."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        torch.manual_seed(0)
        # Widths that are no multiple of 16: AVX512 code compiled for AVX2 skips half of each vector.
        cls.model = nn.Sequential(nn.Linear(16, 40), nn.ReLU(), nn.Linear(40, 24))
        cls.x = torch.randn(7, 16)
        cls.data = os.path.join(cls.tmp.name, "data.pt")
        torch.save({"model": cls.model, "x": cls.x}, cls.data)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def _child(self, capability, script):
        env = {"ATEN_CPU_CAPABILITY": capability, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=self.tmp.name)}
        prelude = f"import torch, torch_precompile\ndata = torch.load({self.data!r}, weights_only=False)\n"
        result = _run_python(prelude + textwrap.dedent(script), env=env)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])

    def _capture(self, capability):
        stem = os.path.join(self.tmp.name, f"captured_{capability}")
        self._child(
            capability,
            f"""
            def scaled_relu(m, x):  # _scaled_relu
                return torch.relu(m(x) * 2 + 1)

            code, cache = torch_precompile.precompile(scaled_relu, data["model"], data["x"], backend="inductor")
            open({stem + ".py"!r}, "w").write(code)
            open({stem + ".cache"!r}, "wb").write(cache)
            """,
        )
        return stem

    def _check_loaded_and_run_alone(self, stem, capability):
        """load() and exec(python_code) where the CPU capability is ``capability`` compute eager's result."""
        out = f"{stem}_on_{capability}.pt"
        self._child(
            capability,
            f"""
            m, x = data["model"], data["x"]
            code = open({stem + ".py"!r}).read()
            f = torch_precompile.load(code, open({stem + ".cache"!r}, "rb").read())
            alone = {{}}
            exec(code, alone)
            torch.save({{"load": f(m, x), "exec": alone["forward"](m, x)}}, {out!r})
            """,
        )
        expected = _scaled_relu(self.model, self.x)
        for how, result in torch.load(out).items():
            torch.testing.assert_close(result, expected, msg=lambda message: f"{how}: {message}")

    @unittest.skipUnless(torch.backends.cpu.get_cpu_capability() == "AVX512", "needs an AVX512 host")
    def test_avx512_kernels_compiled_where_avx2_is_picked(self):
        # Compiled with AVX2's 8-wide vectors, they computed wrong results.
        self._check_loaded_and_run_alone(self._capture("avx512"), "avx2")

    @unittest.skipUnless(torch.backends.cpu.get_cpu_capability() == "AVX512", "needs an AVX512 host")
    def test_avx2_kernels_compiled_where_avx512_is_picked(self):
        # Compiled with AVX512's 16-wide vectors, they wrote past their buffers (heap corruption).
        self._check_loaded_and_run_alone(self._capture("avx2"), "avx512")

    def test_isa_this_machine_lacks_is_refused(self):
        code, _ = _artifact("scaled_relu", _scaled_relu, self.model, self.x, backend="inductor")
        (line,) = [line for line in code.splitlines() if line.startswith("INDUCTOR_VEC_ISA = ")]
        for recorded, message in (
            ("['no_such_isa', 1024]", r"'no_such_isa' \(1024-bit\).*does not support.*precompile again on this machine"),
            ("['avx2', 512]", r"'avx2' \(512-bit\).*does not support"),  # an edited width
            ("'avx2'", r"INDUCTOR_VEC_ISA is malformed"),
        ):
            edited = code.replace(line, f"INDUCTOR_VEC_ISA = {recorded}")
            with self.subTest(recorded=recorded), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the empty cache
                with self.assertRaisesRegex(PrecompileError, message):
                    torch_precompile.load(edited, b"")
                with self.assertRaisesRegex(PrecompileError, message):
                    exec(edited, {})


def _marked(tensor, dim, **kwargs):
    from torch._dynamo.decorators import mark_unbacked

    mark_unbacked(tensor, dim, **kwargs)
    return tensor


class TestFreeDims(TestCase):
    """mark_unbacked: one inductor artifact for every size of a marked dim."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = small_mlp()
        # Independently marked x and y: mse_loss requires their batch sizes equal,
        # which capture turns into one shape group the driver checks.
        x = _marked(torch.randn(5, 8), 0)
        y = _marked(torch.randn(5, 4), 0, **({"max": 64} if MARK_BOUNDS else {}))
        cls.train = load(_artifact("free_train", _train_step, cls.model, x, y))
        cls.forward = load(_artifact("free_forward", _forward, cls.model, _marked(torch.randn(5, 8), 0)))

    def test_forward_and_training_across_sizes(self):
        for n in (1, 3, 5, 17, 64, 0):
            x, y = torch.randn(n, 8), torch.randn(n, 4)
            torch.testing.assert_close(self.forward(self.model, x), self.model(x))
            m, reference = copy.deepcopy(self.model), copy.deepcopy(self.model)
            loss = self.train(m, x, y)
            torch.testing.assert_close(loss, _train_step(reference, x, y).detach(), equal_nan=True)
            if n:
                for ours, theirs in zip(m.parameters(), reference.parameters()):
                    torch.testing.assert_close(ours.grad, theirs.grad)

    def test_unmarked_dims_and_groups_checked(self):
        m = self.model
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected shape \(\*, 8\), got \(3, 9\)"):
            self.forward(m, torch.randn(3, 9))
        with self.assertRaisesRegex(PrecompileError, r"args\[2\] dim 0 has size 4 but args\[1\] dim 0 has size 3; the captured graph requires them equal"):
            self.train(m, torch.randn(3, 8), torch.randn(4, 4))
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected a tensor in contiguous_format memory format.*\.contiguous\(memory_format=torch\.contiguous_format\)"):
            self.forward(m, torch.randn(8, 3).t())

    @needs_mark_bounds
    def test_bounds_checked(self):
        with self.assertRaisesRegex(PrecompileError, r"args\[2\]: dim 0 has size 65, outside the bounds \[0, 64\]"):
            self.train(self.model, torch.randn(65, 8), torch.randn(65, 4))

    def test_convention_records_free_dims(self):
        convention = self.train.convention
        x_spec, y_spec = (leaf.tensor for leaf in convention.inputs)
        self.assertEqual(x_spec.shape, (None, 8))
        self.assertEqual(x_spec.free_dims, ((0, 0, 0, None),))
        self.assertEqual(y_spec.free_dims, ((0, 0, 0, 64 if MARK_BOUNDS else None),))  # same shape group as x
        self.assertEqual(convention.sizes, ((0, 0), (1, 0)))
        self.assertEqual(x_spec.memory_format, "contiguous_format")

    @needs_mark_bounds
    def test_shape_id_shares_one_group(self):
        x = _marked(torch.randn(4, 8), 0, shape_id="batch")
        y = _marked(torch.randn(4, 4), 0, shape_id="batch", min=2)
        f = load(_artifact("free_shape_id", lambda m, x, y: m(x) + y, self.model, x, y))
        groups = [leaf.tensor.free_dims[0][1] for leaf in f.convention.inputs]
        self.assertEqual(groups[0], groups[1])
        x2, y2 = torch.randn(6, 8), torch.randn(6, 4)
        torch.testing.assert_close(f(self.model, x2, y2), self.model(x2) + y2)
        with self.assertRaisesRegex(PrecompileError, r"outside the bounds \[2, inf\]"):
            f(self.model, torch.randn(1, 8), torch.randn(1, 4))

    def test_branch_on_marked_dim_becomes_a_size_fact(self):
        def branchy(m, x):
            if x.shape[0] > 3:
                return m(x)
            return m(x) * 2

        f = precompile.load(*precompile(branchy, self.model, _marked(torch.randn(5, 8), 0)))
        (fact,) = f.convention.size_facts  # taken from the example: 5 > 3
        self.assertRegex(fact.where, r"test_precompile.py:\d+ \(if x.shape\[0\] > 3:\)")
        with torch.no_grad():
            for rows in (4, 9):
                x = torch.randn(rows, 8)
                torch.testing.assert_close(f(self.model, x), branchy(self.model, x))
        with self.assertRaisesRegex(
            PrecompileError,
            r"the captured graph requires \(args\[1\] dim 0\) - 3 > 0, decided by the example inputs at "
            r".*test_precompile.py:\d+ \(if x.shape\[0\] > 3:\), but args\[1\] dim 0 is 3",
        ):
            f(self.model, torch.randn(3, 8))

    def test_squeezed_marked_dim_becomes_a_size_fact(self):
        """Eager's squeeze drops a dim of size 1; the trace keeps a free one (not 1), or drops it where the example's is 1."""
        def squeezed(m, x):
            return m(x).squeeze() * 2

        for rows, op in ((5, "!="), (1, "==")):
            with self.subTest(rows=rows):
                f = precompile.load(*precompile(squeezed, self.model, _marked(torch.randn(rows, 8), 0)))
                (fact,) = f.convention.size_facts
                self.assertEqual(fact.op, op)
                self.assertRegex(fact.where, r"test_precompile.py:\d+ \(return m\(x\).squeeze\(\) \* 2\)")
                x = torch.randn(rows, 8)
                with torch.no_grad():
                    torch.testing.assert_close(f(self.model, x), squeezed(self.model, x))
                other = 1 if rows != 1 else 4
                with self.assertRaisesRegex(PrecompileError, rf"requires \(args\[1\] dim 0\) - 1 {op} 0, .* but args\[1\] dim 0 is {other}"):
                    f(self.model, torch.randn(other, 8))

    def test_a_free_size_tied_to_others_becomes_a_size_fact(self):
        """A mask one longer than a cache: the trace sets its size to the cache's + 1 (no guard)."""
        def masked(m, cache, mask, new):
            return m(torch.cat([cache, new])) * mask[:, None]

        m, new = nn.Linear(4, 4), torch.randn(1, 4)
        f = precompile.load(*precompile(masked, m, _marked(torch.randn(4, 4), 0), _marked(torch.ones(5), 0), new))
        (fact,) = f.convention.size_facts
        self.assertEqual((fact.terms, fact.constant, fact.op), (((0, -1), (1, 1)), -1, "=="))
        with torch.no_grad():
            for rows in (1, 7):
                cache, mask = torch.randn(rows, 4), torch.rand(rows + 1)
                torch.testing.assert_close(f(m, cache, mask, new), masked(m, cache, mask, new))
        with self.assertRaisesRegex(PrecompileError, r"requires -\(args\[1\] dim 0\) \+ \(args\[2\] dim 0\) - 1 == 0"):
            f(m, torch.randn(3, 4), torch.rand(3), new)
        with self.assertRaisesRegex(
            PrecompileError,
            r"fn requires -\(args\[1\] dim 0\) \+ \(args\[2\] dim 0\) - 1 == 0 \(marked with mark_unbacked; .*\), "
            r"which the example inputs' sizes \(args\[1\] dim 0 = 4, args\[2\] dim 0 = 3\) do not satisfy",
        ):
            precompile(masked, m, _marked(torch.randn(4, 4), 0), _marked(torch.ones(3), 0), new)

    def test_marked_dims_the_example_broadcasts_are_refused(self):
        """x + y over two marked dims: the graph requires them one size (it never broadcasts a
        free 1), so an example that broadcasts (5 vs 1) would be refused by its own artifact."""
        x, y = _marked(torch.randn(5, 4), 0), _marked(torch.randn(1, 4), 0)
        with self.assertRaisesRegex(
            PrecompileError,
            r"fn requires args\[1\] dim 0 and args\[2\] dim 0 \(marked with mark_unbacked\) to be one size, .* "
            r"the example inputs have args\[1\] dim 0 = 5, args\[2\] dim 0 = 1: leave a dim the example broadcasts unmarked",
        ):
            precompile(lambda m, x, y: m(x) + y, nn.Linear(4, 4), x, y)

    def test_guard_not_linear_in_marked_dims_refused_with_source_line(self):
        def branchy(m, x):
            if x.shape[0] * x.shape[0] > 20:
                return m(x)
            return m(x) * 2

        x = _marked(torch.randn(5, 8), 0)
        with self.assertRaisesRegex(
            PrecompileError,
            r"args\[1\] dim 0 \(marked with mark_unbacked\) to decide u0\*\*2 > 20 at .*test_precompile.py:\d+ "
            r"\(if x.shape\[0\] \* x.shape\[0\] > 20:\)",
        ):
            precompile(branchy, self.model, x)

    def test_what_inductors_lowering_asks_of_a_marked_dim_becomes_a_size_fact(self):
        """Lowering a CPU bmm, Inductor asks whether the computed mat1's rows are 1 (to pick its
        layout): the example's answer is a fact the artifact checks, and fn is captured again
        with it assumed, where the lowering can decide it."""
        def scaled_bmm(x, w):
            return torch.bmm(x * 2, w)

        w = torch.randn(2, 4, 3)
        f = precompile.load(*precompile(scaled_bmm, _marked(torch.randn(2, 5, 4), 1), w))
        (fact,) = f.convention.size_facts
        self.assertEqual((fact.terms, fact.constant, fact.op), (((0, 1),), -1, "!="))
        self.assertRegex(
            fact.where, r"^ for Inductor's lowering of aten\.bmm\.default \(at File \".*test_precompile\.py\", line \d+, in scaled_bmm\)$"
        )
        for rows in (2, 3, 9):
            x = torch.randn(2, rows, 4)
            torch.testing.assert_close(f(x, w), scaled_bmm(x, w))
        with self.assertRaisesRegex(
            PrecompileError,
            r"the captured graph requires \(args\[0\] dim 1\) - 1 != 0, decided by the example inputs for Inductor's "
            r"lowering of aten\.bmm\.default .*, but args\[0\] dim 1 is 1: pass sizes that satisfy it",
        ):
            f(torch.randn(2, 1, 4), w)

    def test_a_question_inductor_asks_not_linear_in_marked_dims_is_refused_where_asked(self):
        """torch 2.12+'s Inductor asks whether the flattened rows (a product of two marked sizes)
        are 1, which no size fact states: refused. 2.11's lays the bmm input out without asking."""
        def flat_bmm(x, w):
            batch, rows, features = x.shape
            return torch.bmm((x * 2).reshape(1, batch * rows, features), w)

        x, w = _marked(_marked(torch.randn(2, 5, 4), 0), 1), torch.randn(1, 4, 3)
        if TORCH_RELEASE >= (2, 12):
            with self.assertRaisesRegex(
                PrecompileError,
                r"^backend='inductor' needs to decide Eq\(u\d\*u\d, 1\) about a dim marked with mark_unbacked while "
                r"optimizing the graph; give the mark bounds that decide it",
            ):
                precompile(flat_bmm, x, w)
            return
        f = precompile.load(*precompile(flat_bmm, x, w))
        self.assertEqual(f.convention.size_facts, ())
        for shape in ((2, 5), (1, 1), (3, 1)):
            x = torch.randn(*shape, 4)
            torch.testing.assert_close(f(x, w), flat_bmm(x, w))

    def test_a_size_an_op_computes_from_a_marked_dim_is_refused_naming_its_line(self):
        """A slice starting at ``8 - rows``: for rows past 8 it would start before the table, so the
        trace gives the slice a size of its own (no marked size), which it cannot decide."""
        def tail_of_table(x, table):
            return table[8 - x.shape[0] : 8] * x

        table = torch.randn(8, 4)
        with self.assertRaisesRegex(
            PrecompileError,
            r"^fn requires u\d+ <= 8 of u\d+, a size an op computed from the marked dims at .*test_precompile\.py:\d+ "
            r"\(return table\[8 - x\.shape\[0\] : 8\] \* x\) that the trace cannot decide .*: give the marks bounds",
        ):
            precompile(tail_of_table, _marked(torch.randn(5, 4), 0), table)
        if not MARK_BOUNDS:
            return
        f = precompile.load(*precompile(tail_of_table, _marked(torch.randn(5, 4), 0, max=8), table))
        for rows in (1, 8):
            x = torch.randn(rows, 4)
            torch.testing.assert_close(f(x, table), tail_of_table(x, table))

    def test_requirement_no_bound_states_refused_saying_so(self):
        with self.assertRaisesRegex(PrecompileError, r"fn requires Eq\(Mod\(.*u0.*, 2\), 0\) .*; no mark bound states that"):
            precompile(lambda x: x.view(-1, 2) * 2, _marked(torch.randn(6, 3), 0))

    def test_specializing_view_refused(self):
        with self.assertRaisesRegex(PrecompileError, r"fn specializes args\[1\] dim 0 .* to 5.*use -1"):
            precompile(lambda m, x: m(x).view(5, 4), self.model, _marked(torch.randn(5, 8), 0))

    def test_refusals(self):
        x = _marked(torch.randn(5, 8), 0)
        with self.assertRaisesRegex(NotImplementedError, "only supported by backend='inductor'"):
            precompile(_forward, self.model, x, backend="eager")
        dynamic = torch.randn(5, 8)
        torch._dynamo.decorators.mark_dynamic(dynamic, 0)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: dims \[0\] are marked with mark_dynamic.*use torch._dynamo.decorators.mark_unbacked"):
            precompile(_forward, self.model, dynamic)
        strided = _marked(torch.randn(8, 5).t(), 0)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: an input with marked dims must be dense in a memory format.*x.contiguous\(\)"):
            precompile(_forward, self.model, strided)

        class Wrapped(torch.Tensor):
            pass

        subclass = torch.randn(5, 8).as_subclass(Wrapped)
        subclass._dynamo_unbacked_indices = {0}  # mark_unbacked's own record of the mark
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: mark_unbacked on a tensor subclass \(Wrapped\)"):
            precompile(_forward, self.model, subclass)


class TestChecksListing(TestCase):
    """``f.checks``: what every call checks, one line each, each enforced (Note invariant 11)."""

    @staticmethod
    def step(m, opt, x, y, scale):
        loss = F.mse_loss(m(x) * scale, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def artifact(self):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        pair = _artifact("checks_step", self.step, m, opt, x, y, 2.0, backend="eager")
        return m, opt, x, y, pair

    def test_checks_list_each_captured_fact(self):
        *_, pair = self.artifact()
        lines = list(map(str, load(pair).checks))
        for line in (
            "binding       the call: fn(m, opt, x, y, scale) bound as Python binds it, 5 arguments",
            "global        torch.is_grad_enabled(): True (the graph runs autograd)",
            "global        torch.get_default_dtype(): torch.float32",
            "module        args[0].1.training: True",
            "attribute     args[0].1.eps: 1e-05",
            "tensor        args[0].0.weight (parameter): Tensor(16, 8) float32 cpu, strides (8, 1), requires_grad=True",
            "tensor        args[2]: Tensor(5, 8) float32 cpu, strides (8, 1), requires_grad=False",
            "value         args[4]: 2.0 (baked)",
            "alias         args[0].1.num_batches_tracked (buffer): shares memory with no other tensor argument (the graph writes it)",
            "same          args[2], args[3]: 2 distinct tensors, as at capture (fn may branch on identity)",
            "optimizer     args[1]: torch.optim.AdamW over the captured parameters (parameter groups: 1), the other "
            "group entries its step or fn read as baked (lr and betas[0] read at every call)",
        ):
            self.assertIn(line, lines)
        kinds = [line.split(" ", 1)[0] for line in lines]
        order = ["binding", "global", "module", "attribute", "hooks", "tensor", "value", "alias", "same", "written", "optimizer", "grad"]
        self.assertEqual(sorted(set(kinds), key=order.index), [kind for kind in order if kind in kinds])
        self.assertEqual(kinds, sorted(kinds, key=order.index), "listed in the order a call checks them")

    def test_each_listed_kind_is_enforced_naming_its_subject(self):
        m, opt, x, y, pair = self.artifact()
        f = load(pair)
        subjects = {str(check.subject) for check in f.checks}
        cases = (
            ("tensor", "args[2]", lambda: f(m, opt, x.double(), y, 2.0)),
            ("value", "args[4]", lambda: f(m, opt, x, y, 3.0)),
            ("attribute", "args[0].1.eps", lambda: (setattr(m[1], "eps", 1e-3), f(m, opt, x, y, 2.0))),
            ("module", "args[0].1", lambda: (m[1].eval(), f(m, opt, x, y, 2.0))),
        )
        for kind, subject, call in cases:
            with self.subTest(kind):
                self.assertIn(subject if kind != "module" else subject + ".training", subjects)
                before = copy.deepcopy(m.state_dict())
                with self.assertRaisesRegex(PrecompileError, re.escape(subject)):
                    call()
                for name, value in m.state_dict().items():
                    torch.testing.assert_close(value, before[name])  # refused before any state changed
                m[1].eps, _ = 1e-5, m[1].train()

    def test_load_logs_the_checks_under_precompile_checks(self):
        *_, pair = self.artifact()
        with self.assertLogs("torch_precompile._precompile_checks", level=logging.INFO) as logs:
            f = load(pair)
        self.assertEqual(logs.records[0].getMessage().splitlines()[1:], list(map(str, f.checks)))


class TestLogging(TestCase):
    def test_stage_timings_through_torch_logs(self):
        script = textwrap.dedent(
            """
            import torch, torch_precompile
            code, cache = torch_precompile.precompile(lambda x: x * 2, torch.randn(2), backend="eager")
            torch_precompile.load(code, cache)
            """
        )
        # torch 2.11/2.12 parse TORCH_LOGS before running the entry point that
        # registers the alias (an unknown name fails `import torch`): name the module.
        setting = "precompile" if TORCH_RELEASE >= (2, 13) else "torch_precompile._precompile"
        result = _run_python(script, env={"TORCH_LOGS": setting})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr, r"precompile: capture\+enforce [\d.]+ ms, lower [\d.]+ ms.*cache=\d+B")
        self.assertRegex(result.stderr, r"load: import [\d.]+ ms, verify [\d.]+ ms, prime [\d.]+ ms, exec [\d.]+ ms")
        quiet = _run_python(script)
        self.assertNotIn("capture+enforce", quiet.stderr)

    @unittest.skipIf(TORCH_RELEASE < (2, 13), "torch 2.11/2.12 parse TORCH_LOGS before the entry point registers the alias")
    def test_checks_through_torch_logs(self):
        script = "import torch, torch_precompile\n" + textwrap.dedent(
            """
            code, cache = torch_precompile.precompile(lambda x: x * 2, torch.randn(2), backend="eager")
            torch_precompile.load(code, cache)
            """
        )
        result = _run_python(script, env={"TORCH_LOGS": "precompile_checks"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("tensor        args[0]: Tensor(2,) float32 cpu", result.stderr)
        self.assertNotIn("load: import", result.stderr)  # its own artifact, not the stage timings


def _sibling_imports(path: str) -> set[str]:
    """The precompile modules a file imports, at any depth (lazy imports count)."""
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import X / from .X import Y
            names.update([node.module] if node.module else [alias.name for alias in node.names])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):  # absolute spellings would bypass the check
            spelled = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names.update(s.rpartition(".")[2] for s in spelled if re.fullmatch(r"torch_?\w*\._precompile\w*", s))
    return names


class TestImportGraph(TestCase):
    """precompile's modules import downward only: no module imports its importer."""

    def graph(self) -> dict[str, set[str]]:
        directory = os.path.join(REPO, "torch")
        return {
            name.removesuffix(".py"): _sibling_imports(os.path.join(directory, name))
            for name in sorted(os.listdir(directory))
            if name.startswith("_precompile") and name.endswith(".py")
        }

    def test_import_graph_is_acyclic(self):
        graph = self.graph()
        done, path = set(), []

        def visit(module: str) -> None:
            if module in path:
                self.fail(f"import cycle: {' -> '.join(path[path.index(module):] + [module])}")
            if module in done:
                return
            path.append(module)
            for imported in sorted(graph[module]):
                visit(imported)
            path.pop()
            done.add(module)

        for module in graph:
            visit(module)

    def test_format_sits_at_the_bottom(self):
        graph = self.graph()
        self.assertLessEqual(graph["_precompile_format"], {"_precompile_schema", "_precompile_runtime", "_precompile_compat"})
        # The driver runs alone in an artifact, after the schema's text (its one import is skipped there).
        self.assertEqual(graph["_precompile_runtime"], {"_precompile_schema"})
        self.assertEqual(graph["_precompile_schema"], {"_precompile_error"})
        self.assertEqual(graph["_precompile_error"], set())
        for reader in ("_precompile_artifact", "_precompile_capture", "_precompile_inspect"):
            self.assertIn("_precompile_format", graph[reader])


instantiate_parametrized_tests(TestAPI)
instantiate_parametrized_tests(TestCapture)
instantiate_parametrized_tests(TestCaptureContract)
instantiate_parametrized_tests(TestTraining)
instantiate_parametrized_tests(TestArtifact)
instantiate_parametrized_tests(TestLoad)
instantiate_parametrized_tests(TestRuntimeChecks)
instantiate_parametrized_tests(TestLoadedRunnable)
instantiate_parametrized_tests(TestIntrospection)


if __name__ == "__main__":
    run_tests()
