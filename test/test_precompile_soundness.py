# Owner(s): ["module: dynamo"]
"""Soundness of a precompiled call (issue 12, the driver's half).

Nothing the trace baked goes unchecked: every call either computes exactly
what eager ``fn`` computes (results, ``.grad``, buffer and input updates) or
raises a ``PrecompileError`` naming the argument before any state changes.
One test per way a call can differ from the capture, on both backends; see
Note [precompile programming model], invariant 11.  Artifacts are compiled
once per process and models stay tiny.
"""

import copy
import logging
import math
import re

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

from torch_precompile import _precompile_runtime as runtime
from torch_precompile import _precompile_schema as schema
from torch_precompile import PrecompileError


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design

_RUNNABLES: dict = {}


def _runnable(key, fn, *example_inputs, backend):
    """Capture and load each (fn, backend) once per test process."""
    if (key, backend) not in _RUNNABLES:
        _RUNNABLES[key, backend] = precompile.load(*precompile(fn, *example_inputs, backend=backend))
    return _RUNNABLES[key, backend]


def _forward(model, x):
    return model(x)


def _train_step(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss


def _scale_first(a, b):
    a.mul_(2)
    return a + b


def _divide(x, s):
    return x / s


def _double(x):
    return x * 2


class _Accumulator(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return x * self.total


class _Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.lin = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.fc2(self.lin(x))


class _ModeProperty(nn.Module):
    @property
    def training(self):
        return self.__dict__.get("_mode", True)

    @training.setter
    def training(self, mode):
        self.__dict__["_mode"] = mode

    def forward(self, x):
        return x * 2 if self.training else x * 3


def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))


def _eager_and_artifact_linears(fn, backend: str) -> tuple:
    """fn precompiled on a Linear(3, 3), an input, and two equal Linear(3, 3): eager's and the artifact's."""
    x = torch.randn(2, 3)
    f = precompile.load(*precompile(fn, nn.Linear(3, 3), x, backend=backend))
    expected, got = nn.Linear(3, 3), nn.Linear(3, 3)
    got.load_state_dict(expected.state_dict())
    return f, x, expected, got


def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def _bn_linear():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))


def _bn_step(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss.detach()


def _bn_clipped_step(model, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    return loss.detach()


def _sparse_embedding():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(6, 3, sparse=True), nn.Linear(3, 1))


def _sparse_step(model, ids):
    loss = model(ids).sum()
    loss.backward()
    return loss.detach()


def _sparse_step_reading_grad(model, ids):
    loss = _sparse_step(model, ids)
    return loss, model[0].weight.grad.sum()


def _sparse_steps_accumulated(model, ids):
    _sparse_step(model, ids)
    return _sparse_step(model, ids)


def _layers():
    torch.manual_seed(0)
    return _Layers()


def _train_runnable(backend):
    x, y = torch.randn(3, 4), torch.randn(3, 2)
    return _runnable("train", _train_step, _linear(), x, y, backend=backend)


def _state(*objects):
    """Bit-exact copies of everything a call could write: tensors, parameters,
    buffers and .grad of modules, in order."""
    copies = []
    for obj in objects:
        if isinstance(obj, nn.Module):
            copies += [(n, t.detach().clone()) for n, t in obj.state_dict(keep_vars=True).items()]
            copies += [(n + ".grad", None if p.grad is None else p.grad.clone()) for n, p in obj.named_parameters()]
        else:
            copies.append(("input", obj.detach().clone()))
            copies.append(("input.grad", None if obj.grad is None else obj.grad.clone()))
    return copies


_INFERENCE_IN_BACKWARD = (
    " is an inference tensor (made under torch.inference_mode()) and fn runs backward: outside inference mode "
    "eager's autograd refuses to save one for backward and to update one in place, so a training step refuses "
    "every inference tensor it takes. Make it outside inference_mode() (e.g. .clone() it there), or call fn eagerly"
)


def _momentum_step(m, x, y, opt):
    loss = F.mse_loss(m(x), y)
    loss.backward()
    opt.step()
    return loss


def _inference_step_inputs():
    """A model with a BatchNorm and a frozen weight, its batch and an SGD with momentum, after one
    eager step: each trainable parameter has a .grad and a momentum buffer."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    m[2].weight.requires_grad_(False)
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    _momentum_step(m, x, y, opt)
    return m, x, y, opt


def _copy_step_inputs(m, opt, *tensors):
    """A copy of a training step's arguments with their .grad (deepcopy leaves a parameter's .grad behind)."""
    copied = copy.deepcopy((m, opt, *tensors))
    for p, q in zip(m.parameters(), copied[0].parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    return copied


def _optimizer_state(m, opt):
    """Copies of what a training step can write: parameters, buffers, .grad, optimizer state."""
    tensors = [t.detach().clone() for t in m.state_dict().values()]
    tensors += [p.grad.clone() for p in m.parameters() if p.grad is not None]
    return tensors + [v.clone() for state in opt.state.values() for v in state.values()]


def _undo_inference(m, opt, xy):
    """Each inference tensor of a training step's arguments made again outside inference mode."""
    for i, t in enumerate(xy):
        xy[i] = t.clone()
    for module in m:
        for name, buffer in module.named_buffers(recurse=False):
            setattr(module, name, buffer.clone())
    for p in m.parameters():
        p.data = p.data.clone()
        if p.grad is not None:
            p.grad = p.grad.clone()
    for state in opt.state.values():
        for key, value in state.items():
            state[key] = value.clone()


class _PairOfParameters(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(4, 8))
        self.b = nn.Parameter(torch.randn(4, 8))


def _shared_gradient(m, x):  # a and b receive one gradient tensor
    ((m.a + m.b) * x).sum().backward()


def _caller_gradient(m, x, g):  # a's gradient is the caller's g
    (m.a + x).backward(gradient=g)
    return g


def _returned_gradient(m, x):  # a's gradient is fn's result
    t = x * 2
    (m.a + x).backward(gradient=t)
    return t


def _layouts_of_gradients(m, x):  # a's gradient expanded (stride 0), b's transposed
    (m.a.sum() + (m.b.t().contiguous() * x.t()).sum()).backward()


def _zeroed_step(m, x):
    m.zero_grad(set_to_none=False)
    (m.a * x + m.b * x * 3).sum().backward()


class TestSoundness(TestCase):
    def assertRefused(self, regex, call, *touched):
        """``call()`` raises a PrecompileError matching ``regex`` and writes nothing."""
        before = _state(*touched)
        with self.assertRaisesRegex(PrecompileError, regex):
            call()
        after = _state(*touched)
        self.assertEqual([n for n, _ in before], [n for n, _ in after])
        for (name, old), (_, new) in zip(before, after):
            if old is None or new is None:
                self.assertIs(old, new, f"a refused call wrote {name}")
            else:
                self.assertTrue(old.equal(new) and old.stride() == new.stride(), f"a refused call changed {name}")

    @parametrize(
        "fact",
        ["is_leaf", "grad_fn", "_version", "_base", "_is_view()", "is_inference()", "storage_offset()", "data_ptr()"],
    )
    def test_tensor_facts_fn_reads_are_refused(self, fact):
        """How the caller made a tensor (a leaf, a view, in inference mode) and where it sits:
        no call checks them, so a branch on them in fn's code would be baked."""
        name = fact.removesuffix("()")

        def fn(x):
            value = getattr(x, name)
            value = value() if fact.endswith("()") else value
            return x * 2 if value in (None, False, 0) else x * 3

        with self.assertRaisesRegex(PrecompileError, rf"^fn reads a tensor's {re.escape('.' + fact)} at \S+:\d+ \(value = .*\): it depends on how the caller made the tensor"):
            precompile(fn, torch.ones(4), backend="eager")

    @parametrize("backend", BACKENDS)
    def test_written_tensors_version_counters_move(self, backend):
        """Inductor's kernels write through raw pointers: a backward that saved an input or a
        buffer the artifact then wrote is refused, as eager refuses it."""
        x, b = torch.randn(3), torch.randn(3)
        f = _runnable("scale_first", _scale_first, x.clone(), b.clone(), backend=backend)
        g = _runnable("bn", _forward, _bn_net(), torch.randn(3, 4), backend=backend)
        model = _bn_net()
        for call, written in ((lambda: f(x, b), lambda: x), (lambda: g(model, torch.randn(3, 4)), lambda: model[1].num_batches_tracked)):
            w = torch.ones((), requires_grad=True)
            saved = (w * written()).sum()  # autograd saves the tensor the call writes
            before = written()._version
            call()
            self.assertGreater(written()._version, before)
            with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                saved.backward()

    @parametrize("backend", BACKENDS)
    def test_batch_norm_whose_output_is_discarded_updates_running_stats(self, backend):
        """A train-mode BatchNorm whose output fn drops (a pass that only refreshes the running
        stats, as SWA's update_bn makes) updates them in eager: aten.native_batch_norm's schema
        does not say it writes them, and the eager graph's dead-code pass removed it."""
        def refresh(model, x):
            with torch.no_grad():
                model(x)
            return x.sum()

        x = torch.randn(8, 4)
        f = precompile.load(*precompile(refresh, nn.BatchNorm1d(4), x, backend=backend))
        expected, got = nn.BatchNorm1d(4), nn.BatchNorm1d(4)
        refresh(expected, x)
        f(got, x)
        for name, buffer in expected.named_buffers():
            self.assertEqual(dict(got.named_buffers())[name], buffer, msg=name)

    @parametrize("backend", BACKENDS)
    def test_a_backward_through_a_returned_view_of_a_parameter_reaches_it(self, backend):
        """A view of a parameter fn returns was made with grad mode off: it said requires_grad
        but had no history, so a backward through it left .grad untouched and raised nothing."""
        def rows(m, x):
            return m.weight[0], m.weight.t(), x * 2

        f, x, expected, got = _eager_and_artifact_linears(rows, backend)
        for model, run in ((expected, rows), (got, f)):
            row, transposed, _ = run(model, x)
            self.assertIs(row._base, model.weight)
            (row * 2).sum().backward()
            (transposed * torch.arange(9.0).view(3, 3)).sum().backward()
        self.assertEqual(got.weight.grad, expected.weight.grad)
        with torch.no_grad():  # as eager's views under no_grad: no history
            row = f(got, x)[0]
        self.assertIsNone(row.grad_fn)
        self.assertEqual(row.requires_grad, rows(expected, x)[0].requires_grad)

    @parametrize("backend", BACKENDS)
    def test_a_returned_view_fn_detached_from_a_parameter_has_no_history(self, backend):
        """``m.weight.detach()`` / ``.data`` returned: rebuilt from the parameter with history, it
        required grad, a backward through it reached .grad and an in-place write through it raised,
        where eager's has no history and writes the parameter."""
        def views(m, x):
            return m.weight.detach(), m.weight.data[0], x * 2

        f, x, expected, got = _eager_and_artifact_linears(views, backend)
        for model, run in ((expected, views), (got, f)):
            detached, row, _ = run(model, x)
            self.assertEqual((detached.requires_grad, detached.grad_fn, row.requires_grad), (False, None, False))
            self.assertEqual((detached.data_ptr(), row.data_ptr()), (model.weight.data_ptr(),) * 2)
            detached.mul_(2)
            row.add_(1)
        self.assertEqual(got.weight, expected.weight, atol=0, rtol=0)
        self.assertIsNone(got.weight.grad)
        # Captured frozen (a forward checks no requires_grad), called trainable: still detached.
        f = precompile.load(*precompile(views, nn.Linear(3, 3).requires_grad_(False), x, backend=backend))
        detached, row, _ = f(got, x)
        self.assertEqual((detached.requires_grad, row.requires_grad), (False, False))

    @parametrize("backend", BACKENDS)
    def test_a_returned_view_made_under_fns_no_grad_has_no_history(self, backend):
        """A view of a parameter fn makes under no_grad() requires grad in eager but has no grad_fn,
        so a backward through it stops there; rebuilt with history, it reached the parameter's .grad."""
        def step(m, x):
            with torch.no_grad():
                row = m.weight[0]
            m(x).sum().backward()
            return row, m.weight.t()

        f, x, expected, got = _eager_and_artifact_linears(step, backend)
        for model, run in ((expected, step), (got, f)):
            row, transposed = run(model, x)
            self.assertEqual((row.requires_grad, row.grad_fn), (True, None))
            self.assertIsNotNone(transposed.grad_fn)
            model.zero_grad()
            (row * 2).sum().backward()  # stops at the view
            (transposed * 3).sum().backward()
        self.assertEqual(got.weight.grad, expected.weight.grad)

    def test_a_returned_view_as_strided_cannot_rebuild_is_eagers_or_refused(self):
        """backend='eager' returns its graph's own view of a parameter where as_strided cannot
        rebuild it (a lazy conjugate, another dtype): eager's where autograd does not follow it
        back (a frozen parameter, .view(dtype)); where it does, that view had no history, so a
        backward through it left .grad untouched and raised nothing: refused."""
        def views(m, x):
            return m.weight.conj(), m.weight.view(torch.float64), x * 2

        x = torch.randn(2, 3)
        frozen = nn.Linear(3, 4, dtype=torch.complex64).requires_grad_(False)
        f = precompile.load(*precompile(views, frozen, x, backend="eager"))
        model = nn.Linear(3, 4, dtype=torch.complex64).requires_grad_(False)
        for got, expected in zip(f(model, x), views(model, x), strict=True):
            self.assertEqual(got, expected, atol=0, rtol=0)
            self.assertEqual((got.is_conj(), got.dtype, got.requires_grad), (expected.is_conj(), expected.dtype, expected.requires_grad))
        self.assertEqual(f(model, x)[0].data_ptr(), model.weight.data_ptr())
        trainable = nn.Linear(3, 4, dtype=torch.complex64)
        f = precompile.load(*precompile(lambda m, x: m.weight.view(torch.float64), trainable, x, backend="eager"))
        self.assertEqual(f(trainable, x), trainable.weight.view(torch.float64), atol=0, rtol=0)
        for view, differs in ((torch.conj, "a lazy conjugate"), (torch.view_as_real, "another dtype")):
            with self.subTest(differs), self.assertRaisesRegex(
                PrecompileError,
                rf"fn returns a view of args\[0\]\.weight \(parameter\) with {differs}.* that autograd follows back "
                r"to it: .*a backward through it would not reach the input as in eager\. Return the input "
                r"itself and take the view outside fn, or \.detach\(\) it",
            ):
                precompile(lambda m, x: view(m.weight), trainable, x, backend="eager")

    def test_nearest_upsampling_by_a_scale_factor_is_differentiated_as_eager_or_refused(self):
        """Inductor's upsample_nearest2d_backward ignores the scale: with scale_factor=1.7 the
        gradient went to other input pixels than eager's (the forward was right)."""
        def step(m, scale):
            out = F.interpolate(m.weight[None, None], scale_factor=scale, mode="nearest")
            (out * torch.arange(out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
            return out.detach()

        with self.assertRaisesRegex(PrecompileError, r"nearest upsampling with scale_factor=1.7 \(4 -> 6\).*size="):
            precompile(lambda m: step(m, 1.7), nn.Linear(5, 4), backend="inductor")
        f = precompile.load(*precompile(lambda m: step(m, 2.0), nn.Linear(5, 4), backend="inductor"))
        expected, got = nn.Linear(5, 4), nn.Linear(5, 4)
        got.load_state_dict(expected.state_dict())
        self.assertEqual(f(got), step(expected, 2.0))
        self.assertEqual(got.weight.grad, expected.weight.grad)

    @parametrize("backend", BACKENDS)
    def test_outputs_fn_computes_are_new_tensors(self, backend):
        """``x + zeros`` is a new tensor in eager: a write to it must not reach x or a parameter
        (Inductor's folding of uniform constants returned the operand itself)."""
        def plus_zeros(m, x):
            y = x * 2
            return x + torch.zeros(2, 3), y, y + torch.zeros(2, 3), m.bias * torch.ones(3)

        m, x = nn.Linear(3, 3), torch.randn(2, 3)
        f = precompile.load(*precompile(plus_zeros, m, x, backend=backend))
        bias, kept = m.bias.detach().clone(), x.clone()
        a, y, b, c = f(m, x)
        self.assertFalse(torch._C._is_alias_of(a, x))
        self.assertFalse(torch._C._is_alias_of(b, y))
        self.assertFalse(torch._C._is_alias_of(c, m.bias))
        with torch.no_grad():
            for out in (a, b, c):
                out.zero_()
        torch.testing.assert_close(x, kept)
        torch.testing.assert_close(m.bias.detach(), bias)
        torch.testing.assert_close(y, kept * 2)

    @parametrize("backend", BACKENDS)
    def test_writes_through_unsafe_split_pieces_reach_the_input(self, backend):
        """unsafe_split / unsafe_chunk return views in eager, though their schema declares none."""
        def scale_half(x):
            _, second = x.unsafe_chunk(2)
            second.mul_(3)
            pieces = x.unsafe_split_with_sizes([1, 3])
            pieces[0].add_(1)
            return x.sum(), second

        f = precompile.load(*precompile(scale_half, torch.ones(4, 3), backend=backend))
        ours, eager = torch.ones(4, 3), torch.ones(4, 3)
        (total, second), (eager_total, eager_second) = f(ours), scale_half(eager)
        torch.testing.assert_close(ours, eager)
        torch.testing.assert_close(total, eager_total)
        second.zero_()  # a view of the input, as eager's
        eager_second.zero_()
        torch.testing.assert_close(ours, eager)

    @parametrize("backend", BACKENDS)
    def test_written_inference_tensors_are_refused(self, backend):
        """Outside inference mode eager refuses to write an inference tensor in place (a cache
        filled under torch.inference_mode()); Inductor's kernels would write it."""
        f = _runnable("scale_first", _scale_first, torch.randn(3), torch.randn(3), backend=backend)
        g = _runnable("bn", _forward, _bn_net(), torch.randn(3, 4), backend=backend)
        with torch.inference_mode():
            x, b = torch.randn(3), torch.randn(3)
            model = _bn_net()
        with self.assertRaisesRegex(RuntimeError, "Inplace update to inference tensor outside InferenceMode"):
            _scale_first(x, b)  # eager, outside inference mode
        kept = x.clone()
        for call, where, touched in (
            (lambda: f(x, b), r"args\[0\]", ()),
            (lambda: g(model, torch.randn(3, 4)), r"args\[0\]\.1\.num_batches_tracked \(buffer\)", (model,)),
        ):
            self.assertRefused(where + r" is an inference tensor .* the graph writes it in place", call, *touched)
        self.assertTrue(torch.equal(x, kept))
        with torch.inference_mode():  # where eager writes it too
            torch.testing.assert_close(f(x, b), _scale_first(kept, b))
            torch.testing.assert_close(x, kept)

    @parametrize("backend", BACKENDS)
    def test_inference_tensors_a_training_step_takes_are_refused(self, backend):
        """Outside inference mode eager's autograd refuses to save an inference tensor for backward
        (an input, a frozen weight, a BatchNorm running stat) and to update one in place (momentum,
        an incoming .grad); the artifacts trained on them, the eager backend after writing some."""
        def inference(t):
            with torch.inference_mode():
                return t.detach().clone()

        def momentum(m, opt):
            return opt.state[m[0].weight]["momentum_buffer"]

        saved, updated = "Inference tensors cannot be saved for backward", "Inplace update to inference tensor outside InferenceMode"
        cases = (  # (name, put an inference tensor there, path in the message, eager's error)
            ("x", lambda m, opt, xy: xy.__setitem__(0, inference(xy[0])), "args[1]", saved),
            ("y", lambda m, opt, xy: xy.__setitem__(1, inference(xy[1])), "args[2]", saved),
            ("frozen weight", lambda m, opt, xy: setattr(m[2].weight, "data", inference(m[2].weight)), "args[0].2.weight (parameter)", saved),
            ("running_mean", lambda m, opt, xy: setattr(m[1], "running_mean", inference(m[1].running_mean)), "args[0].1.running_mean (buffer)", saved),
            (
                "momentum_buffer",
                lambda m, opt, xy: opt.state[m[0].weight].__setitem__("momentum_buffer", inference(momentum(m, opt))),
                "args[3] (optimizer) state of param_groups[0]['params'][0]['momentum_buffer']",
                updated,
            ),
            (".grad", lambda m, opt, xy: setattr(m[0].weight, "grad", inference(m[0].weight.grad)), "args[0].0.weight.grad", updated),
        )
        f = _runnable("inference_step", _momentum_step, *_inference_step_inputs(), backend=backend)
        for name, make_inference, path, eager_error in cases:
            with self.subTest(name):
                m, x, y, opt = _inference_step_inputs()
                f(m, x, y, opt)  # arms the guards with tensors made outside inference mode
                em, eopt, ex, ey = _copy_step_inputs(m, opt, x, y)  # before: a copy of an inference tensor is none
                exy = [ex, ey]
                make_inference(em, eopt, exy)
                with self.assertRaisesRegex(RuntimeError, eager_error):
                    _momentum_step(em, *exy, eopt)
                xy = [x, y]
                make_inference(m, opt, xy)
                before = _optimizer_state(m, opt) + [t.clone() for t in xy]
                with self.assertRaises(PrecompileError) as refused:
                    f(m, *xy, opt)
                self.assertEqual(str(refused.exception), path + _INFERENCE_IN_BACKWARD)
                self._assert_unchanged(before, _optimizer_state(m, opt) + list(xy))
                # Made outside inference mode again, the next call trains as eager does.
                _undo_inference(m, opt, xy)
                em, eopt, ex, ey = _copy_step_inputs(m, opt, *xy)
                torch.testing.assert_close(f(m, *xy, opt), _momentum_step(em, ex, ey, eopt))
                torch.testing.assert_close(_optimizer_state(m, opt), _optimizer_state(em, eopt))

    def _assert_unchanged(self, before, after):
        self.assertEqual(len(before), len(after))
        for old, new in zip(before, after):
            self.assertTrue(old.equal(new), "a refused call changed state")

    @parametrize("backend", BACKENDS)
    def test_a_training_step_under_inference_mode_is_refused(self, backend):
        """Under inference_mode() (grad mode enabled inside it) eager records no autograd graph
        and its backward raises; the artifact trained."""
        f = _runnable("inference_step", _momentum_step, *_inference_step_inputs(), backend=backend)
        m, x, y, opt = _inference_step_inputs()
        f(m, x, y, opt)
        em, eopt, ex, ey = _copy_step_inputs(m, opt, x, y)
        with torch.inference_mode(), torch.enable_grad():
            with self.assertRaisesRegex(RuntimeError, "does not require grad"):
                _momentum_step(em, ex, ey, eopt)
            before = _optimizer_state(m, opt)
            with self.assertRaisesRegex(PrecompileError, r"^called under torch\.inference_mode\(\), but this artifact runs autograd"):
                f(m, x, y, opt)
        self._assert_unchanged(before, _optimizer_state(m, opt))
        em, eopt, ex, ey = _copy_step_inputs(m, opt, x, y)
        torch.testing.assert_close(f(m, x, y, opt), _momentum_step(em, ex, ey, eopt))
        torch.testing.assert_close(_optimizer_state(m, opt), _optimizer_state(em, eopt))

    @parametrize("backend", BACKENDS)
    def test_an_optimizer_step_refuses_inference_state_outside_inference_mode(self, backend):
        """An artifact that steps an optimizer without backward: eager's step refuses to update an
        inference momentum buffer outside inference mode and updates it inside."""
        def step_only(m, opt):
            opt.step()

        f = _runnable("step_only", step_only, *_inference_step_inputs()[::3], backend=backend)
        m, _, _, opt = _inference_step_inputs()
        with torch.inference_mode():
            opt.state[m[0].weight]["momentum_buffer"] = opt.state[m[0].weight]["momentum_buffer"].clone()
        em, eopt = _copy_step_inputs(m, opt)
        with torch.inference_mode():  # the copy made it a normal tensor
            eopt.state[em[0].weight]["momentum_buffer"] = eopt.state[em[0].weight]["momentum_buffer"].clone()
        with self.assertRaisesRegex(RuntimeError, "Inplace update to inference tensor outside InferenceMode"):
            step_only(em, eopt)
        before = _optimizer_state(m, opt)
        with self.assertRaises(PrecompileError) as refused:
            f(m, opt)
        self.assertEqual(
            str(refused.exception),
            "args[1] (optimizer) state of param_groups[0]['params'][0]['momentum_buffer'] is an inference tensor "
            "(made under torch.inference_mode()) and the optimizer step updates it in place, which eager refuses "
            "outside inference mode: call the artifact under torch.inference_mode(), or pass a tensor made "
            "outside it (e.g. .clone() it there)",
        )
        self._assert_unchanged(before, _optimizer_state(m, opt))
        em, eopt = _copy_step_inputs(m, opt)
        with torch.inference_mode():  # where eager updates it too
            eopt.state[em[0].weight]["momentum_buffer"] = eopt.state[em[0].weight]["momentum_buffer"].clone()
            f(m, opt)
            step_only(em, eopt)
        torch.testing.assert_close(_optimizer_state(m, opt), _optimizer_state(em, eopt))
        # A call under inference_mode() arms no check that passes the inference tensor outside it.
        self.assertRaisesRegex(PrecompileError, r"is an inference tensor", f, m, opt)

    @parametrize("backend", BACKENDS)
    def test_an_inference_artifact_takes_inference_tensors(self, backend):
        """A forward only reads its tensors: inference tensors pass, inside inference mode and out."""
        f = _runnable("linear", _forward, _linear(), torch.randn(3, 4), backend=backend)
        with torch.inference_mode():
            model, x = _linear(), torch.randn(3, 4)
            torch.testing.assert_close(f(model, x), model(x))
        torch.testing.assert_close(f(model, x), model(x))

    def test_a_training_flag_outside_the_instance_dict_is_refused(self):
        """The driver watches each flag fn read in the module's __dict__; a property there would
        hide m.eval() from every later call."""
        f = precompile.load(*precompile(_forward, _ModeProperty(), torch.ones(2), backend="eager"))
        model = _ModeProperty()
        self.assertRefused(
            r"^args\[0\] \(_ModeProperty\): fn reads its training flag, which is not a bool in the module's __dict__",
            lambda: f(model, torch.ones(2)),
        )

    @parametrize("backend", BACKENDS)
    def test_module_mode_is_checked(self, backend):
        """Row 1: the train/eval mode of every submodule fn reads is part of the contract."""
        x = torch.randn(3, 4)
        f = _runnable("bn", _forward, _bn_net(), x, backend=backend)
        self.assertEqual(
            [flag for _, flag in f.convention.modules[0].submodules], [None, None, True, True]
        )  # Sequential and Linear never read their flag: not checked
        model, ref = _bn_net(), _bn_net()

        def assert_eager():
            torch.manual_seed(1)
            out = f(model, x)
            torch.manual_seed(1)
            torch.testing.assert_close(out, ref(x))
            torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)

        assert_eager()
        model.eval()
        self.assertRefused(
            r"args\[0\]\.1 \(BatchNorm1d\) is in eval mode, but was in train mode at capture.*\.train\(\)",
            lambda: f(model, x),
            model,
            x,
        )
        model.train()
        model[2].eval()
        self.assertRefused(r"args\[0\]\.2 \(Dropout\) is in eval mode", lambda: f(model, x), model, x)
        model[2].training = True  # set directly, not through .train(): still seen
        model[0].eval()  # a Linear computes the same in either mode: honoured
        ref[0].eval()
        assert_eager()

    def test_capture_refuses_fn_that_changes_a_mode(self):
        def evaluate(model, x):
            model.eval()
            return model(x)

        model = _bn_net()
        with self.assertRaisesRegex(PrecompileError, r"fn changes the train/eval mode of args\[0\], args\[0\]\.0"):
            precompile(evaluate, model, torch.randn(3, 4), backend="eager")
        self.assertTrue(all(m.training for m in model.modules()))
        self.assertIs(type(model[1]), nn.BatchNorm1d)  # the read probes are gone

    @parametrize("backend", BACKENDS)
    def test_aliased_inputs_are_refused_when_written(self, backend):
        """Row 2: memory shared with a tensor the graph writes is refused."""
        a, b = torch.randn(3), torch.randn(3)
        f = _runnable("scale_first", _scale_first, a.clone(), b.clone(), backend=backend)
        ref_a = a.clone()
        torch.testing.assert_close(f(a, b), _scale_first(ref_a, b))
        torch.testing.assert_close(a, ref_a)
        self.assertRefused(r"args\[0\] and args\[1\] share memory.*writes args\[0\] in place.*\.clone\(\)", lambda: f(a, a[:]), a)
        # One tensor for both: refused by identity first (test_precompile_hook_guards.py
        # test_identity_between_tensor_inputs_is_as_captured).
        self.assertRefused(r"args\[1\] is args\[0\] \(one tensor\), but they were distinct tensors at capture", lambda: f(a, a), a)
        # Capture itself: it traces each example on its own clone (one tensor passed
        # twice is traced as one: test_precompile_hook_guards.py test_one_tensor_passed_twice_and_written).
        with self.assertRaisesRegex(PrecompileError, r"args\[0\] and args\[1\] share memory and fn writes args\[0\]"):
            precompile(_scale_first, a, a[:], backend=backend)
        # A user input sharing memory with a buffer the graph writes.
        m, x = _Accumulator(), torch.ones(3)
        g = _runnable("accumulator", _forward, _Accumulator(), x, backend=backend)
        ref = _Accumulator()
        torch.testing.assert_close(g(m, x), ref(x))
        self.assertRefused(
            r"args\[0\]\.total \(buffer\) and args\[1\] share memory", lambda: g(m, m.total), m
        )
        # Two buffers the graph writes, made to share memory after capture.
        pair = _runnable("accumulators", _forward, nn.Sequential(_Accumulator(), _Accumulator()), x, backend=backend)
        m = nn.Sequential(_Accumulator(), _Accumulator())
        torch.testing.assert_close(pair(m, x), nn.Sequential(_Accumulator(), _Accumulator())(x))
        m[1].register_buffer("total", m[0].total[:])
        self.assertRefused(
            r"args\[0\]\.0\.total \(buffer\) and args\[0\]\.1\.total \(buffer\) share memory", lambda: pair(m, x), m
        )

    @parametrize("backend", BACKENDS)
    def test_frozen_parameter_is_refused(self, backend):
        """Row 3: requires_grad of every parameter of a training step is checked."""
        f = _train_runnable(backend)
        model, ref = _linear(), _linear()
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        torch.testing.assert_close(f(model, x, y), _train_step(ref, x, y))
        torch.testing.assert_close(model.weight.grad, ref.weight.grad)
        model.weight.requires_grad_(False)
        self.assertRefused(
            r"args\[0\]\.weight \(parameter\): requires_grad was True at capture, got False.*requires_grad_\(True\)",
            lambda: f(model, x, y),
            model,
        )
        model.weight.requires_grad_(True)
        model.bias = nn.Parameter(model.bias.detach().clone(), requires_grad=False)
        self.assertRefused(r"args\[0\]\.bias \(parameter\): requires_grad was True", lambda: f(model, x, y), model)

    @parametrize("backend", BACKENDS)
    def test_input_requiring_grad_is_refused_by_a_training_step(self, backend):
        """Row 4: eager would write x.grad; the artifact was captured without it."""
        f = _train_runnable(backend)
        model, x, y = _linear(), torch.randn(3, 4), torch.randn(3, 2)
        f(model, x, y)  # arms the fast path with x not requiring grad
        x.requires_grad_()
        self.assertRefused(r"args\[1\]: requires_grad was False at capture, got True", lambda: f(model, x, y), model, x)
        self.assertIsNone(x.grad)

    @parametrize("backend", BACKENDS)
    def test_module_edits_bypassing_hooks_are_seen(self, backend):
        """Row 5: `del`, ModuleList reorders and deleted parameters after a call."""
        x = torch.randn(2, 4)
        f = _runnable("layers", _forward, _layers(), x, backend=backend)
        model = _layers()
        torch.testing.assert_close(f(model, x), model(x))
        # Reorder with del + insert: same names and shapes, new order: honoured.
        first = model.layers[0]
        del model.layers[0]
        model.layers.insert(2, first)
        torch.testing.assert_close(f(model, x), model(x))
        del model.layers[1]
        self.assertRefused(r"args\[0\]: the module's parameters differ.*missing \['layers\.2\.weight', 'layers\.2\.bias'\]", lambda: f(model, x), model)
        model = _layers()
        f(model, x)
        del model.fc2
        self.assertRefused(r"args\[0\]: the module's parameters differ.*missing \['fc2\.weight', 'fc2\.bias'\]", lambda: f(model, x), model)
        model = _layers()
        f(model, x)
        del model.lin.bias
        self.assertRefused(r"args\[0\]: the module's parameters differ.*missing \['lin\.bias'\]", lambda: f(model, x), model)
        # A module's _parameters dict rebound: the tensors in the new dict are the ones used.
        model = _layers()
        f(model, x)
        model.lin._parameters = {name: nn.Parameter(torch.randn_like(p)) for name, p in model.lin._parameters.items()}
        torch.testing.assert_close(f(model, x), model(x))
        model.lin._parameters = {name: nn.Parameter(p.detach().double()) for name, p in model.lin._parameters.items()}
        self.assertRefused(r"args\[0\]\.lin\.weight \(parameter\): expected dtype torch.float32, got torch.float64", lambda: f(model, x), model)

    @parametrize("backend", BACKENDS)
    def test_short_lived_models_are_never_mistaken_for_dead_ones(self, backend):
        """The module cache is keyed by id(): a model that dies takes its entry with it.

        deepcopy registers nothing (no structure-hook bump), and a copy made
        after another died often reuses its id.
        """
        x = torch.randn(2, 4)
        f = _runnable("layers", _forward, _layers(), x, backend=backend)
        template = _layers()
        ids = set()
        for step in range(20):
            model = copy.deepcopy(template)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(step)
            ids.add(id(model))
            torch.testing.assert_close(f(model, x), model(x))
            del model
        self.assertLess(len(ids), 20)  # ids were reused: the case this guards against happened

    @parametrize("backend", BACKENDS)
    def test_baked_floats_compare_bitwise(self, backend):
        """Row 9: -0.0 is not 0.0 (x / s flips the infinity's sign)."""
        x = torch.randn(3)
        f = _runnable("divide", _divide, x, 0.0, backend=backend)
        torch.testing.assert_close(f(x, 0.0), x / 0.0)
        self.assertRefused(r"args\[1\]: expected 0\.0 \(baked into the artifact at capture\), got -0\.0", lambda: f(x, -0.0), x)
        self.assertRefused(r"args\[1\]: expected 0\.0 .*got nan", lambda: f(x, math.nan), x)
        self.assertRefused(r"args\[1\]: expected 0\.0 .*got 0;", lambda: f(x, 0), x)

    def test_same_value(self):
        self.assertTrue(schema.same_value(math.nan, float("nan")))
        self.assertTrue(schema.same_value(-0.0, -0.0))
        self.assertFalse(schema.same_value(-0.0, 0.0))
        self.assertFalse(schema.same_value(True, 1))
        self.assertFalse(schema.same_value(1, 1.0))
        self.assertTrue(schema.same_value("a", "a"))
        self.assertTrue(schema.same_value(None, None))

    @parametrize("backend", BACKENDS)
    def test_lazy_conj_and_neg_bits(self, backend):
        """Row 10: inductor kernels read raw memory; eager honours the bits."""
        x = torch.randn(3, dtype=torch.complex64)
        f = _runnable("double", _double, x, backend=backend)
        torch.testing.assert_close(f(x), x * 2)  # arms the fast path on a plain tensor
        for view, bit in ((x.conj(), "conjugate"), (torch._neg_view(x), "negative")):
            if backend == "inductor":
                self.assertRefused(rf"args\[0\]: the tensor has a lazy {bit} bit.*resolve_", lambda: f(view), x)
            else:
                torch.testing.assert_close(f(view), view * 2)

    @parametrize("backend", BACKENDS)
    def test_gradients_keep_the_kernels_dtype(self, backend):
        """A bfloat16 model's loss against a float32 target: eager's mse_loss_backward gives the
        bfloat16 gradient Inductor's decomposition of it would promote to float32."""
        torch.manual_seed(0)
        model, x, y = nn.Linear(4, 2).bfloat16(), torch.randn(3, 4, dtype=torch.bfloat16), torch.randn(3, 2)
        reference = copy.deepcopy(model)
        try:
            want = _train_step(reference, x, y)
        except RuntimeError as error:  # "Found dtype Float but expected BFloat16" on torch 2.11
            self.skipTest(f"eager torch {torch.__version__} refuses this mse_loss: {error}")
        f = _runnable("bfloat16_train", _train_step, copy.deepcopy(model), x, y, backend=backend)
        torch.testing.assert_close(f(model, x, y), want)
        for got, want in zip(model.parameters(), reference.parameters()):
            self.assertEqual(got.grad.dtype, torch.bfloat16)
            torch.testing.assert_close(got.grad, want.grad)

    @parametrize("backend", BACKENDS)
    def test_global_state(self, backend):
        """Row 11: grad mode (training steps), autocast and the default dtype."""
        f = _train_runnable(backend)
        model, x, y = _linear(), torch.randn(3, 4), torch.randn(3, 2)
        f(model, x, y)
        for context, where in ((torch.inference_mode, r"torch\.inference_mode\(\)"), (torch.no_grad, r"torch\.no_grad\(\)")):
            with context():
                self.assertRefused(rf"called under {where}, but this artifact runs autograd", lambda: f(model, x, y), model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertRefused(r"autocast state differs from capture: captured no autocast, now \[\('cpu', 'bfloat16'\)\]", lambda: f(model, x, y), model)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            self.assertRefused(r"torch\.get_default_dtype\(\) is torch\.float64, but it was torch\.float32", lambda: f(model, x, y), model)
        finally:
            torch.set_default_dtype(default)
        # A forward computes the same values with grad mode off: honoured.
        g = _runnable("bn", _forward, _bn_net(), x, backend=backend)
        model, ref = _bn_net(), _bn_net()
        with torch.inference_mode():
            torch.manual_seed(1)
            out = g(model, x)
            torch.manual_seed(1)
            torch.testing.assert_close(out, ref(x))
        with torch.autograd.detect_anomaly(check_nan=False):
            self.assertRefused(r"anomaly detection enabled.*backward is compiled", lambda: f(model, x, y), model)

    @parametrize("backend", BACKENDS)
    def test_forward_with_an_input_that_requires_grad_runs_under_no_grad(self, backend):
        """Grad mode is part of the contract only when the graph runs autograd."""
        x = torch.randn(3, 4, requires_grad=True)
        f = _runnable("forward requires_grad", _forward, _linear(), x, backend=backend)
        with torch.no_grad():
            torch.testing.assert_close(f(_linear(), x), _linear()(x))

    @parametrize("backend", BACKENDS)
    def test_hooks_are_refused(self, backend):
        """Hooks on fn's modules or parameters: refused at capture, and at a call when added later."""
        model, x = _layers(), torch.randn(2, 4)
        handle = model.layers[1].register_forward_hook(lambda module, args, out: out * 2)
        with self.assertRaisesRegex(
            PrecompileError, r"args\[0\]\.layers\.1 has a forward hook \(test_precompile_soundness\..*<lambda>\): precompile cannot"
        ):
            precompile(_forward, model, x, backend=backend)
        handle.remove()
        f = _runnable("layers", _forward, _layers(), x, backend=backend)
        f(model, x)
        for register, where in (
            (lambda: model.fc2.register_forward_pre_hook(lambda module, args: None), r"args\[0\]\.fc2 has a forward pre-hook"),
            (lambda: model.lin.weight.register_hook(lambda grad: grad), r"args\[0\]\.lin\.weight \(parameter\) has a gradient hook"),
            (lambda: nn.modules.module.register_module_forward_hook(lambda *a: None), r"a global module forward hook"),
        ):
            handle = register()
            self.assertRefused(where + r".*which was not there at capture", lambda: f(model, x), model)
            handle.remove()
            torch.testing.assert_close(f(model, x), model(x))

    @parametrize("backend", BACKENDS)
    def test_module_classes_and_read_attributes_are_checked(self, backend):
        """A swapped submodule class, or a changed plain attribute fn read (eps, p), is refused."""
        def net():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.ReLU())

        x = torch.randn(3, 4)
        f = _runnable("layernorm", _forward, net(), x, backend=backend)
        model = net()
        absent = {"missing": ()}  # forward, read from each called module's class: guarded absent from the instance
        self.assertEqual(
            f.convention.modules[0].attributes,
            (
                ("", "forward", absent), ("0", "forward", absent), ("1", "eps", 1e-5), ("1", "forward", absent),
                ("1", "normalized_shape", (4,)), ("2", "forward", absent), ("2", "inplace", False),
            ),
        )
        model[0].in_features = 5  # never read by fn: honoured
        torch.testing.assert_close(f(model, x), model(x))
        model[1].eps = 1e-3
        self.assertRefused(r"args\[0\]\.1\.eps is 0\.001, but was 1e-05 at capture", lambda: f(model, x), model)
        model[1].eps = 1e-5  # an equal value, another object: accepted again
        torch.testing.assert_close(f(model, x), model(x))
        model[2] = nn.Tanh()
        self.assertRefused(
            r"args\[0\]\.2 is a torch\.nn\.modules\.activation\.Tanh, but was a torch\.nn\.modules\.activation\.ReLU",
            lambda: f(model, x),
            model,
        )

    @parametrize("backend", BACKENDS)
    def test_a_class_assigned_in_place_after_a_call_is_refused(self, backend):
        """``sub.__class__ = Other`` (as parametrize and module converters do) changes no dict the
        module cache watches: a warm call must still see it, as the first call's walk does."""

        class Zeroed(nn.ReLU):
            def forward(self, x):
                return x * 0

        def net():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.ReLU())

        x = torch.randn(3, 4)
        f = _runnable("layernorm", _forward, net(), x, backend=backend)
        for path, swap in (("2", lambda m: m[2]), ("", lambda m: m)):
            model = net()
            torch.testing.assert_close(f(model, x), model(x))  # warm: the module cache holds model
            module = swap(model)
            original = type(module)
            module.__class__ = Zeroed if path else type("Other", (nn.Sequential,), {})
            self.assertRefused(
                rf"args\[0\]{re.escape('.' + path) if path else ''} is a .*, but was a {re.escape(original.__module__)}",
                lambda: f(model, x),
                model,
            )
            module.__class__ = original  # the class put back: honoured again
            torch.testing.assert_close(f(model, x), model(x))

    def test_state_passed_again_as_an_input_is_refused(self):
        model, x = _linear(), torch.randn(3, 4)
        for again, path in (((model.weight,), r"args\[2\]\[0\] is \(or shares memory with\) args\[0\]\.weight"),
                            ((model.bias[:1],), r"args\[2\]\[0\] is \(or shares memory with\) args\[0\]\.bias")):
            with self.assertRaisesRegex(PrecompileError, path + r", a parameter of a module argument"):
                precompile(lambda m, x, params: m(x) + params[0].sum(), model, x, list(again), backend="eager")

    @parametrize("backend", BACKENDS)
    def test_torch_function_subclasses_are_refused(self, backend):
        class Logged(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                return super().__torch_function__(func, types, args, kwargs or {})

        model, x = _linear(), torch.randn(3, 4)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\] is a Logged, a tensor subclass with its own __torch_function__"):
            precompile(_forward, model, x.as_subclass(Logged), backend=backend)
        f = _runnable("linear", _forward, _linear(), x, backend=backend)
        f(model, x)
        self.assertRefused(r"args\[1\] is a Logged", lambda: f(model, x.as_subclass(Logged)), model)

    @parametrize("backend", BACKENDS)
    def test_strides_are_checked(self, backend):
        # The trace bakes layout decisions on every backend, not only Inductor's
        # kernels: .contiguous() of a contiguous example is an alias (a later
        # in-place write would reach the caller's input), reshape / flatten a
        # view (raising only after BatchNorm updated its running stats),
        # is_contiguous() a branch.  Another layout is refused before anything runs.
        def write_contiguous(x):
            y = x.contiguous()
            y.add_(1)
            return y

        f = precompile.load(*precompile(write_contiguous, torch.zeros(3, 3), backend=backend))
        transposed = torch.zeros(3, 3).t()
        self.assertRefused(
            r"args\[0\]: expected strides \(3, 1\), got \(1, 3\);.*\.contiguous\(\)", lambda: f(transposed), transposed
        )
        self.assertEqual(transposed, torch.zeros(3, 3))
        torch.testing.assert_close(f(transposed.contiguous()), torch.ones(3, 3))

        torch.manual_seed(0)
        model = nn.Sequential(nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 2))
        g = precompile.load(*precompile(_forward, model, torch.randn(4, 2, 2, 2), backend=backend))
        channels_last = torch.randn(4, 2, 2, 2).to(memory_format=torch.channels_last)
        self.assertRefused(
            r"args\[1\]: expected strides \(8, 4, 2, 1\), got \(8, 1, 4, 2\)",
            lambda: g(model, channels_last),
            model,
            channels_last,
        )
        self.assertEqual(model[0].num_batches_tracked.item(), 0)
        self.assertEqual(model[0].running_mean, torch.zeros(2))
        expected = copy.deepcopy(model)(channels_last)
        torch.testing.assert_close(g(model, channels_last.contiguous()), expected)

        h = precompile.load(*precompile(lambda x: x * 2 if x.is_contiguous() else x * 3, torch.ones(2, 2), backend=backend))
        self.assertRefused(r"args\[0\]: expected strides \(2, 1\), got \(1, 2\)", lambda: h(torch.ones(2, 2).t()))
        torch.testing.assert_close(h(torch.ones(2, 2)), torch.full((2, 2), 2.0))

    def test_module_tensors_strides_are_checked_on_size_one_dims(self):
        # A 1x1 convolution's weight moved to channels_last differs from the captured one only
        # on its size-1 dims, and torch picks the output's memory format from them.
        class PointwiseConv(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(2, 2, 1)

            def forward(self, x):
                y = self.conv(x)
                return y * 2 if y.is_contiguous() else y * 3

        torch.manual_seed(0)
        model, x = PointwiseConv(), torch.randn(1, 2, 3, 3)
        f = precompile.load(*precompile(_forward, model, x, backend="eager"))
        model.to(memory_format=torch.channels_last)
        self.assertRefused(r"^args\[0\]\.conv\.weight \(parameter\): expected strides \(2, 1, 1, 1\), got \(2, 1, 2, 2\)",
                           lambda: f(model, x), model)
        torch.testing.assert_close(f(model.to(memory_format=torch.contiguous_format), x), model(x))

    def test_eager_traces_inputs_sharing_memory_as_passed(self):
        # backend='eager' traces an expanded example with its stride 0, so
        # .contiguous() copies as in eager; Inductor refuses it at capture
        # (test_precompile_llm.py test_non_dense_inputs_keep_their_layout).
        def write_contiguous(x):
            y = x.contiguous()
            y.add_(1)
            return y

        f = precompile.load(*precompile(write_contiguous, torch.zeros(3).expand(4, 3), backend="eager"))
        expanded = torch.arange(3.0).expand(4, 3)
        torch.testing.assert_close(f(expanded), write_contiguous(expanded))
        self.assertEqual(expanded, torch.arange(3.0).expand(4, 3))
        dense = torch.zeros(4, 3)
        self.assertRefused(r"args\[0\]: expected strides \(0, 1\), got \(3, 1\)", lambda: f(dense), dense)

    def test_requires_grad_reads_are_checked(self):
        # A forward computes the same values whatever requires_grad is, unless fn or a
        # module reads it: then the argument's is checked at every call.
        def by_requires_grad(x):
            return x * 2 if x.requires_grad else x * 3

        f = precompile.load(*precompile(by_requires_grad, torch.ones(2), backend="eager"))
        torch.testing.assert_close(f(torch.ones(2)), torch.full((2,), 3.0))
        x = torch.ones(2, requires_grad=True)
        self.assertRefused(r"^args\[0\]: requires_grad was False at capture, got True", lambda: f(x), x)

        class ScalesWhileTrainable(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)

            def forward(self, x):
                return self.fc(x) * (2 if self.fc.weight.requires_grad else 1)

        model, x = ScalesWhileTrainable(), torch.ones(1, 2)
        g = precompile.load(*precompile(_forward, model, x, backend="eager"))
        with torch.no_grad():
            torch.testing.assert_close(g(model, x), model(x))
        model.fc.weight.requires_grad_(False)
        self.assertRefused(r"^args\[0\]\.fc\.weight \(parameter\): requires_grad was True at capture", lambda: g(model, x), model)

        # An intermediate's answer follows grad mode (and every argument's requires_grad).
        h = precompile.load(*precompile(lambda x: x * 2 if (x * 1).requires_grad else x * 3, x.requires_grad_(), backend="eager"))
        self.assertIn("requires_grad", h.convention.grad_mode_read)
        with torch.no_grad():
            self.assertRefused(r"torch\.no_grad\(\)", lambda: h(x), x)

    def test_written_input_that_requires_grad_is_refused(self):
        # Eager refuses an in-place write to a leaf that requires grad (and records one to a
        # non-leaf in autograd); the graph runs without autograd and would just write it.
        def double_in_place(x):
            x.mul_(2)
            return x.sum()

        f = precompile.load(*precompile(double_in_place, torch.ones(3), backend="eager"))
        x = torch.ones(3, requires_grad=True)
        self.assertRefused(r"^args\[0\] requires grad and fn writes it in place", lambda: f(x), x)
        self.assertEqual(x, torch.ones(3))
        self.assertIn("requires_grad=False", next(str(c) for c in f.checks if c.subject == "args[0]"))
        plain = torch.ones(3)
        torch.testing.assert_close(f(plain), torch.tensor(6.0))
        self.assertEqual(plain, torch.full((3,), 2.0))

    def test_sparse_grad_accumulates_like_eager(self):
        """Eager's AccumulateGrad adds a dense gradient onto a sparse .grad out of place
        (new + old, a dense tensor): so does the runnable (Note invariant 13)."""
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        f = _runnable("bn step", _bn_step, _bn_linear(), x, y, backend="eager")
        model, ref = _bn_linear(), _bn_linear()
        for m in (model, ref):
            m[0].weight.grad = torch.eye(4).to_sparse()
        torch.testing.assert_close(f(model, x, y), _bn_step(ref, x, y))
        self.assertEqual(model[0].weight.grad.layout, torch.strided)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for (name, b), c in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(b, c, msg=name)
        torch.testing.assert_close(f(model, x, y), _bn_step(ref, x, y))  # and onto the dense .grad it left
        torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad)

    @parametrize("backend", BACKENDS)
    def test_a_grad_backward_cannot_add_to_is_refused_before_anything_changes(self, backend):
        """A .grad backward adds to in place that eager's AccumulateGrad refuses to (RuntimeError
        after its forward updated BatchNorm's statistics): one with elements at one memory location
        (``p.grad = g.expand(...)``), an inference tensor.  The runnable refuses it before the graph
        runs, and adds onto a transposed one as eager."""

        def inference(t):
            with torch.inference_mode():
                return t.clone()

        cases = (  # (name, the .grad, the refusal, eager's error)
            (
                "expanded",
                lambda: torch.ones(1, 4).expand(4, 4),
                r"^args\[0\]\.0\.weight\.grad has strides \(0, 1\) for shape \(4, 4\): several of its elements "
                r"are one memory location \(an expanded tensor\), which eager's backward refuses to add the "
                r"gradient to in place .* give it a \.grad of its own \(p\.grad = p\.grad\.clone\(\)\)",
                "more than one element of the written-to tensor",
            ),
            (
                "inference",
                lambda: inference(torch.ones(4, 4)),
                "^" + re.escape("args[0].0.weight.grad" + _INFERENCE_IN_BACKWARD) + "$",
                "Inplace update to inference tensor outside InferenceMode",
            ),
        )
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        f = _runnable("bn step", _bn_step, _bn_linear(), x, y, backend=backend)
        for name, make_grad, refusal, eager_error in cases:
            with self.subTest(name):
                model = _bn_linear()
                grad = model[0].weight.grad = make_grad()
                before = {name: t.clone() for name, t in model.state_dict().items()}
                with self.assertRaisesRegex(PrecompileError, refusal):
                    f(model, x, y)
                for key, t in model.state_dict().items():
                    self.assertTrue(t.equal(before[key]), f"a refused call changed {key}")
                self.assertIs(model[0].weight.grad, grad)
                self.assertTrue(all(p.grad is None for key, p in model.named_parameters() if key != "0.weight"))
                with self.assertRaisesRegex(RuntimeError, eager_error):
                    _bn_step(model, x, y)
        model, ref = _bn_linear(), _bn_linear()
        for m in (model, ref):
            m[0].weight.grad = torch.ones(4, 4).t()
        torch.testing.assert_close(f(model, x, y), _bn_step(ref, x, y))
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        self.assertEqual(model[0].weight.grad.stride(), (1, 4))

    def test_sparse_grad_read_inside_the_graph_is_refused(self):
        """A .grad the graph takes as an input (fn reads it: clip_grad_norm_) must be dense:
        a sparse one is refused before anything is written."""
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        f = _runnable("bn clipped step", _bn_clipped_step, _bn_linear(), x, y, backend="eager")
        self.assertTrue(f.convention.grad_inputs)
        model = _bn_linear()
        sparse = model[0].weight.grad = torch.eye(4).to_sparse()
        before = {name: t.clone() for name, t in model.state_dict().items()}
        with self.assertRaisesRegex(
            PrecompileError,
            r"^args\[0\]\.0\.weight\.grad is a sparse tensor; fn reads or accumulates onto it inside the graph, "
            r"which needs a dense \(strided\) \.grad",
        ):
            f(model, x, y)
        for name, t in model.state_dict().items():
            self.assertTrue(t.equal(before[name]), f"a refused call changed {name}")
        self.assertIs(model[0].weight.grad, sparse)
        self.assertTrue(all(p.grad is None for name, p in model.named_parameters() if name != "0.weight"))

    @parametrize("backend", BACKENDS)
    def test_sparse_gradients_keep_eager_layout_or_are_refused(self, backend):
        """A parameter whose gradient is sparse (nn.Embedding(sparse=True)): where the runnable
        accumulates it as backward does, .grad is sparse as in eager, from None or onto a sparse
        .grad; where fn reads or accumulates it inside the graph, whose .grad is dense (zeros for
        None), capture refuses naming it, the caller's model untouched (Note invariant 13)."""
        ids = torch.tensor([[1, 2, 1], [3, 4, 5]])
        f = _runnable("sparse step", _sparse_step, _sparse_embedding(), ids, backend=backend)
        model, ref = _sparse_embedding(), _sparse_embedding()
        for call in range(2):  # .grad None, then sparse: accumulated in place, as eager's `grad += new`
            held = model[0].weight.grad
            torch.testing.assert_close(f(model, ids), _sparse_step(ref, ids))
            self.assertEqual(model[0].weight.grad.layout, torch.sparse_coo)
            if call:
                self.assertIs(model[0].weight.grad, held)
            torch.testing.assert_close(model[0].weight.grad.to_dense(), ref[0].weight.grad.to_dense())
            torch.testing.assert_close(model[1].weight.grad, ref[1].weight.grad)
        for fn in (_sparse_step_reading_grad, _sparse_steps_accumulated):
            model = _sparse_embedding()
            self.assertRefused(
                r"^args\[0\]\.0\.weight gets a sparse gradient \(nn\.Embedding / nn\.EmbeddingBag with sparse=True\) "
                r"from the backward at .*test_precompile_soundness\.py:\d+ \(loss\.backward\(\)\), and fn reads or "
                r"changes its \.grad: the graph accumulates it into a dense \.grad .* Make the layer's gradient dense "
                r"\(sparse=False\)",
                lambda: precompile(fn, model, ids, backend=backend), model, ids,
            )

    def _assert_grads_like_eager(self, model, reference):
        """Each .grad as eager's AccumulateGrad leaves it: values, strides, and which are one tensor."""
        params, expected = dict(model.named_parameters()), dict(reference.named_parameters())
        for name, p in params.items():
            torch.testing.assert_close(p.grad, expected[name].grad, msg=name)
            if p.grad is not None:
                self.assertEqual(p.grad.stride(), expected[name].grad.stride(), msg=name)
        for (a, p), (b, q) in zip(params.items(), list(params.items())[1:]):
            self.assertEqual(p.grad is q.grad, expected[a].grad is expected[b].grad, msg=f"{a}.grad is {b}.grad")

    @parametrize("backend", BACKENDS)
    def test_new_grad_is_accumulate_grads(self, backend):
        """A None .grad becomes what eager's AccumulateGrad makes of the gradient (Note invariant
        13): a copy where something else holds it (two parameters' one gradient, the caller's
        gradient=, a returned tensor), in the parameter's strides (p.sum()'s expanded gradient,
        a transposed one), so the next call accumulates as eager does."""
        torch.manual_seed(0)
        model, x, g = _PairOfParameters(), torch.randn(4, 8), torch.randn(4, 8)
        cases = ((_shared_gradient, (x,)), (_caller_gradient, (x, g)), (_returned_gradient, (x,)), (_layouts_of_gradients, (x,)))
        for fn, args in cases:
            f = _runnable(fn.__name__, fn, copy.deepcopy(model), *args, backend=backend)
            compiled, reference = copy.deepcopy(model), copy.deepcopy(model)
            passed, results = [a.clone() for a in args], []
            for _ in range(2):
                results.append(f(compiled, *passed))
                torch.testing.assert_close(results[-1], fn(reference, *args))
                self._assert_grads_like_eager(compiled, reference)
                held = [*passed, *(r for r in results if r is not None)]
                self.assertTrue(all(p.grad is not t for p in compiled.parameters() for t in held), fn.__name__)
            torch.testing.assert_close(passed, list(args))  # the caller's gradient= untouched
            if results[0] is not None:  # the first call's result, untouched by the second
                torch.testing.assert_close(results[0], fn(copy.deepcopy(model), *args))

    @parametrize("backend", BACKENDS)
    def test_fresh_gradients_are_kept_as_grad(self, backend):
        """The plain step's fresh, distinct, contiguous gradients are the new .grad as they are,
        as AccumulateGrad steals them (no copy on the fast path)."""
        f = _train_runnable(backend)
        self.assertEqual(f.convention.grads_owned, f.convention.grad_state)
        model, x, y = _linear(), torch.randn(3, 4), torch.randn(3, 2)
        copies = []
        original = runtime.new_grad
        runtime.new_grad = lambda *a: copies.append(a) or original(*a)
        try:
            f(model, x, y)
        finally:
            runtime.new_grad = original
        self.assertEqual(copies, [])
        self.assertTrue(all(p.grad.is_contiguous() for p in model.parameters()))

    @parametrize("backend", BACKENDS)
    def test_grads_sharing_memory_read_inside_the_graph(self, backend):
        """Parameters whose .grad is one tensor, with fn reading the grads (zero_grad
        set_to_none=False): eager accumulates both into it; Inductor's graph took them as
        distinct memory, so the call is refused before anything is written.  Views of one
        flat buffer that do not overlap are fine on both backends."""
        torch.manual_seed(0)
        model, x = _PairOfParameters(), torch.randn(4, 8)
        f = _runnable("zeroed step", _zeroed_step, copy.deepcopy(model), x, backend=backend)
        compiled, reference = copy.deepcopy(model), copy.deepcopy(model)
        for m in (compiled, reference):
            m.a.grad = m.b.grad = torch.ones(4, 8)
        if backend == "inductor":
            shared = compiled.a.grad
            self.assertRefused(r"^args\[0\]\.a\.grad shares memory with args\[0\]\.b\.grad, but backend='inductor'",
                               lambda: f(compiled, x), compiled)
            self.assertIs(compiled.b.grad, shared)
            self.assertEqual(shared, torch.ones(4, 8))
        else:
            f(compiled, x), _zeroed_step(reference, x)
            torch.testing.assert_close(compiled.a.grad, reference.a.grad)
            torch.testing.assert_close(compiled.b.grad, reference.b.grad)
        compiled, reference = copy.deepcopy(model), copy.deepcopy(model)
        for m in (compiled, reference):
            flat = torch.ones(64)
            m.a.grad, m.b.grad = flat[:32].view(4, 8), flat[32:].view(4, 8)
        for _ in range(2):
            f(compiled, x), _zeroed_step(reference, x)
            torch.testing.assert_close(compiled.a.grad, reference.a.grad)
            torch.testing.assert_close(compiled.b.grad, reference.b.grad)


instantiate_parametrized_tests(TestSoundness)


if __name__ == "__main__":
    run_tests()
