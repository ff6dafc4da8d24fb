# Owner(s): ["module: dynamo"]
"""Hooks, tying and aliasing a call must see (issue 27 rows 6-9).

Each test builds its artifacts once per process (tiny models) and checks, on
both backends, that a call computes eager's values and side effects or raises
a PrecompileError before anything is written (Note [precompile programming
model], invariant 11: the "Hooks", "Parameters and buffers" and "Aliasing"
bullets).
"""

import copy
import logging

import torch
import torch.nn as nn
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile
from torch_precompile import PrecompileError
from torch_precompile import _precompile_runtime as runtime

from _precompile_testing import Artifacts, load, needs_mark_bounds


BACKENDS = ("eager", "inductor")
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design
_artifact = Artifacts()


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))


def _forward(model, x):
    return model(x)


def _step(model, x):
    loss = model(x).square().sum()
    loss.backward()
    return loss


def _fresh_step(model, x):
    model.zero_grad()
    loss = model(x).square().sum()
    loss.backward()
    return loss


def _scale_and_view(x):
    x.mul_(2)
    return x.view(-1)[1:], x.t()


def _view(x):
    return x.view(-1)[2:4], x


def _add_in_place(x):
    return x.add_(1)


def _as_bits(x):
    return x.view(torch.int32)


def _scale_first(a, b):
    a.mul_(2)
    return a + b


def _scale_last(a, b, c):
    c.add_(1)
    return a * b * c


def _self_or_sum(a, b, c):
    if a is b:  # as nn.MultiheadAttention's `query is key`
        return a * 0 + c
    return a + b + c


def _self_or_both(a, b, x):
    if a is b:  # a "shared encoder" shortcut
        return x * 2
    return a(x) + b(x)


class _Same(nn.Module):
    def forward(self, x):
        return x

    def right_inverse(self, x):
        return x


class _Counted(nn.Module):
    """Reads a weight (parametrized or not) and writes a buffer in place, as a running statistic."""

    def __init__(self, parametrized=False):
        super().__init__()
        torch.manual_seed(0)
        self.l = nn.Linear(4, 4, bias=False)
        self.register_buffer("count", torch.zeros(4, 4))
        if parametrized:
            nn.utils.parametrize.register_parametrization(self.l, "weight", _Same())

    def forward(self, x):
        self.count.add_(1.0)
        return self.l(x)


def _share_by_set(model):
    with torch.no_grad():
        model.l.weight.set_(model.count)


def _share_by_parametrize(model):
    model.l.weight = model.count  # runs right_inverse, then original.set_(count)


def _share_by_swapping_load(model):
    shared = torch.randn(4, 4)
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)  # load_state_dict(assign=True) swap_tensors
    try:
        model.load_state_dict({"l.weight": shared, "count": shared}, assign=True)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)


def _attend(attention, q, k, v):
    return attention(q, k, v, need_weights=False)[0]


def _sum_rows(x, y):
    return (x * y).sum(1)


class _Accumulator(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(2, 3))

    def forward(self, x):
        self.total.add_(x)
        return self.total[1], x * 2


def _snapshot(model, *tensors):
    """Bit-exact copies of what a call could write: parameters, buffers, .grad, inputs."""
    copies = [t.detach().clone() for t in model.state_dict(keep_vars=True).values()]
    copies += [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return copies + [t.detach().clone() for t in tensors]


class TestHookGuards(TestCase):
    def assertRefused(self, regex, call, model, *tensors):
        """``call()`` raises a PrecompileError matching ``regex`` and writes nothing."""
        before = _snapshot(model, *tensors)
        with self.assertRaisesRegex(PrecompileError, regex):
            call()
        for old, new in zip(before, _snapshot(model, *tensors), strict=True):
            if old is None or new is None:
                self.assertIs(old, new, "a refused call set a .grad")
            else:
                self.assertTrue(old.equal(new), "a refused call changed a tensor")

    def assertStepLikeEager(self, f, model, x, step=_step):
        """One training step through the artifact equals eager's on a copy: loss and every .grad."""
        reference = copy.deepcopy(model)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            q.grad = None if p.grad is None else p.grad.clone()  # Parameter.__deepcopy__ drops .grad
        torch.testing.assert_close(f(model, x), step(reference, x))
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad)

    @parametrize("backend", BACKENDS)
    def test_hooks_on_another_instance_or_a_swapped_submodule_are_refused(self, backend):
        """Row 6: hooks registered before an earlier clean call, on an instance or submodule not yet seen."""
        x = torch.randn(2, 4)
        f = load(_artifact("forward", _forward, _mlp(), x, backend=backend))
        clean, hooked = _mlp(), _mlp(1)
        handle = hooked[2].register_forward_hook(lambda module, args, out: out * 2)
        torch.testing.assert_close(f(clean, x), clean(x))
        for _ in range(2):  # alternating with the clean instance never skips the hooked one
            self.assertRefused(
                r"args\[0\]\.2 has a forward hook \(test_precompile_hook_guards\.TestHookGuards\.test_hooks_on_another_instance"
                r"_or_a_swapped_submodule_are_refused\.<locals>\.<lambda>\), which was not there at capture",
                lambda: f(hooked, x), hooked,
            )
            torch.testing.assert_close(f(clean, x), clean(x))
        handle.remove()
        torch.testing.assert_close(f(hooked, x), hooked(x))

        swapped = nn.Linear(4, 4)
        handle = swapped.register_forward_pre_hook(lambda module, args: (args[0] * 3,))
        clean[2] = swapped
        self.assertRefused(r"args\[0\]\.2 has a forward pre-hook \(.*<lambda>\), which was not there at capture", lambda: f(clean, x), clean)
        handle.remove()
        torch.testing.assert_close(f(clean, x), clean(x))

        g = load(_artifact("step", _step, _mlp(), x, backend=backend))
        clean, hooked = _mlp(), _mlp(1)
        handle = hooked[0].weight.register_hook(lambda grad: grad * 10)
        self.assertStepLikeEager(g, clean, x)
        self.assertRefused(r"args\[0\]\.0\.weight \(parameter\) has a gradient hook", lambda: g(hooked, x), hooked, x)
        handle.remove()
        self.assertStepLikeEager(g, hooked, x)

    @parametrize("backend", BACKENDS)
    def test_gradient_hooks_on_a_differentiated_input_are_refused(self, backend):
        """A hook on an input fn takes a gradient with respect to: eager's gradient runs it, the graph does not."""

        def saliency(model, x):
            return torch.autograd.grad(model(x).sum(), x)[0]

        model, x0 = _mlp(), torch.randn(2, 4)
        hooked = x0.clone().requires_grad_()
        handle = hooked.register_hook(lambda grad: grad * 2)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\] has a gradient hook \(.*<lambda>\): precompile cannot keep"):
            torch_precompile.precompile(saliency, model, hooked, backend=backend)
        handle.remove()
        f = load(_artifact("saliency", saliency, model, hooked, backend=backend))
        for _ in range(2):  # a clean call before does not let the hooked input through
            x = x0.clone().requires_grad_()
            torch.testing.assert_close(f(model, x), saliency(model, x))
            handle = x.register_hook(lambda grad: grad * 2)
            self.assertRefused(
                r"args\[1\] has a gradient hook \(.*<lambda>\), which was not there at capture: eager's gradient",
                lambda: f(model, x), model, x,
            )
            handle.remove()
        torch.testing.assert_close(f(model, x), saliency(model, x))

    @parametrize("backend", BACKENDS)
    def test_hooks_written_into_the_hook_dicts_are_refused(self, backend):
        """A hook put straight into a module's (or the global) hook dict, without a handle, after a clean call."""
        x = torch.randn(2, 4)
        f = load(_artifact("forward", _forward, _mlp(), x, backend=backend))
        model = _mlp()
        torch.testing.assert_close(f(model, x), model(x))
        model[2]._forward_hooks[12345] = lambda module, args, out: out * 2
        self.assertRefused(
            r"args\[0\]\.2 has a forward hook \(test_precompile_hook_guards\..*<lambda>\), which was not there at capture",
            lambda: f(model, x), model,
        )
        del model[2]._forward_hooks[12345]
        torch.testing.assert_close(f(model, x), model(x))
        hooks = torch.nn.modules.module._global_forward_pre_hooks
        hooks[12345] = lambda module, args: None
        try:
            self.assertRefused(r"a global module forward pre-hook \(test_precompile_hook_guards\..*<lambda>, registered with", lambda: f(model, x), model)
        finally:
            del hooks[12345]
        torch.testing.assert_close(f(model, x), model(x))

    @parametrize("backend", BACKENDS)
    def test_accumulate_grad_node_hooks_are_refused(self, backend):
        """Row 7: Horovod-style hooks on a parameter's AccumulateGrad node, by a step that accumulates it."""
        x = torch.randn(2, 4)
        model = _mlp()
        weight = model[0].weight
        nodes = [  # held, as a reducer holds them: a node nobody holds dies with its hooks
            weight.view_as(weight).grad_fn.next_functions[0][0],
            torch.autograd.graph.get_gradient_edge(model[2].bias).node,
        ]
        self.assertIs(nodes[0], torch.autograd.graph.get_gradient_edge(weight).node)
        calls = []
        handles = [
            nodes[0].register_hook(lambda grad_inputs, grad_outputs: calls.append("post")),
            nodes[1].register_prehook(lambda grad_outputs: calls.append("pre")),
        ]
        self.assertEqual(runtime.accumulate_grad_hooks(weight), ["hook"])
        self.assertEqual(runtime.accumulate_grad_hooks(model[2].bias), ["pre-hook"])
        self.assertEqual(runtime.accumulate_grad_hooks(model[0].bias), [])
        # A forward runs no backward: honoured.
        f = load(_artifact("forward", _forward, _mlp(), x, backend=backend))
        torch.testing.assert_close(f(model, x), model(x))
        with self.assertRaisesRegex(
            PrecompileError, r"args\[0\]\.0\.weight has a hook on its AccumulateGrad node .*: precompile cannot keep"
        ):
            _artifact("step_hooked", _step, model, x, backend=backend)
        g = load(_artifact("step", _step, _mlp(), x, backend=backend))
        self.assertRefused(
            r"args\[0\]\.0\.weight \(parameter\) has a hook on its AccumulateGrad node .*which was not there at capture",
            lambda: g(model, x), model, x,
        )
        handles[0].remove()
        self.assertRefused(r"args\[0\]\.2\.bias \(parameter\) has a pre-hook on its AccumulateGrad", lambda: g(model, x), model, x)
        self.assertEqual(calls, [])
        handles[1].remove()
        self.assertStepLikeEager(g, model, x)
        self.assertStepLikeEager(g, model, x)  # the probes count as no new hook: the fast path again
        clean_at = next(iter(g._state_cache.values())).hooks_clean_at[0]
        self.assertEqual(clean_at, runtime.hook_epoch())
        # Registered between calls on a model already checked clean.
        handle = nodes[0].register_prehook(lambda grad_outputs: None)
        self.assertRefused(r"args\[0\]\.0\.weight \(parameter\) has a pre-hook on its AccumulateGrad", lambda: g(model, x), model, x)
        handle.remove()
        self.assertStepLikeEager(g, model, x)

    @parametrize("backend", BACKENDS)
    def test_weights_tied_after_capture_are_refused(self, backend):
        """Row 8: captured untied, tied before a call: eager sums both uses into one .grad."""
        x = torch.randn(2, 4)
        f = load(_artifact("fresh_step", _fresh_step, _mlp(), x, backend=backend))
        model = _mlp()
        model[2].weight = model[0].weight
        self.assertRefused(
            r"args\[0\]\.2\.weight \(parameter\) is the same tensor as args\[0\]\.0\.weight \(parameter\) "
            r"\(tied weights\), but they were distinct tensors at capture",
            lambda: f(model, x), model, x,
        )
        model[2].weight = nn.Parameter(model[0].weight.detach().clone())
        self.assertStepLikeEager(f, model, x, _fresh_step)

    @parametrize("backend", BACKENDS)
    def test_outputs_aliasing_inputs_stay_views(self, backend):
        """Row 9: fn writes an input (or buffer) in place and returns a view of it; the caller writes through it."""
        example = torch.randn(2, 3)
        for key, fn in (("scale_and_view", _scale_and_view), ("view", _view), ("add_in_place", _add_in_place)):
            f = load(_artifact(key, fn, example, backend=backend))
            x, reference = torch.randn(2, 3), None
            reference = x.clone()
            got, want = f(x), fn(reference)
            torch.testing.assert_close(got, want)
            torch.testing.assert_close(x, reference)
            for out, eager_out in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want)), strict=True):
                self.assertEqual((out.shape, out.stride(), out.storage_offset()), (eager_out.shape, eager_out.stride(), eager_out.storage_offset()))
                self.assertEqual(out is x, eager_out is reference, key)  # `return x` is x itself
                out.fill_(7.0)  # reaches the input, as in eager
                eager_out.fill_(7.0)
                torch.testing.assert_close(x, reference)
        model = _Accumulator()
        f = load(_artifact("buffer_view", _forward, _Accumulator(), example, backend=backend))
        reference = copy.deepcopy(model)
        (row, doubled), (eager_row, eager_doubled) = f(model, example), reference(example)
        torch.testing.assert_close((row, doubled), (eager_row, eager_doubled))
        row.fill_(-1.0)
        eager_row.fill_(-1.0)
        torch.testing.assert_close(model.total, reference.total)
        self.assertEqual(model.total[1].tolist(), [-1.0] * 3)

    @parametrize("backend", BACKENDS)
    def test_views_inductor_cannot_rebuild_are_refused_at_capture(self, backend):
        """A view with another dtype: inductor would return a copy, so capture refuses; eager keeps the view."""
        x = torch.randn(2, 3)
        if backend == "inductor":
            with self.assertRaisesRegex(
                PrecompileError, r"fn returns a view of args\[0\] with another dtype: backend='inductor' returns new tensors"
            ):
                _artifact("as_bits", _as_bits, x, backend=backend)
            return
        f = load(_artifact("as_bits", _as_bits, x, backend=backend))
        bits = f(x)
        bits.zero_()
        self.assertEqual(x.tolist(), [[0.0] * 3] * 2)

    @parametrize("backend", BACKENDS)
    @parametrize("view", ["conj", "conj_slice", "neg"])
    def test_lazily_conjugated_views(self, backend, view):
        """A conjugate or negative view: inductor's output would carry the input's plain values."""
        fn = {"conj": lambda x: x.conj(), "conj_slice": lambda x: x.mH[1:], "neg": lambda x: torch._neg_view(x)}[view]
        x = torch.complex(torch.randn(2, 2), torch.randn(2, 2))
        if backend == "inductor":
            with self.assertRaisesRegex(
                PrecompileError, r"fn returns a view of args\[0\] with a lazy conjugate or negation \(\.conj\(\), \.mH\): "
            ):
                torch_precompile.precompile(fn, x, backend=backend)
            return
        f = load(torch_precompile.precompile(fn, x, backend=backend))
        ours, theirs = f(x), fn(x)
        self.assertEqual((ours.is_conj(), ours.is_neg()), (theirs.is_conj(), theirs.is_neg()))
        torch.testing.assert_close(ours.resolve_conj().resolve_neg(), theirs.resolve_conj().resolve_neg())
        ours.zero_()  # a view of x, as in eager
        self.assertEqual(x.abs().sum().item(), 0.0 if view != "conj_slice" else x[:, 0].abs().sum().item())

    @parametrize("backend", BACKENDS)
    @parametrize("returned", ["itself", "row", "detached"])
    @parametrize("existing_grad", [False, True])
    def test_views_of_a_grad(self, backend, returned, existing_grad):
        """A view of .grad after backward: inductor's would be a new tensor, so writes through it would not reach .grad."""
        take = {"itself": lambda g: g, "row": lambda g: g[0], "detached": lambda g: g.detach()}[returned]

        def step(m, x):
            m(x).sum().backward()
            return take(m.weight.grad)

        def make():
            torch.manual_seed(0)
            m = nn.Linear(3, 2)
            if existing_grad:
                m.weight.grad = torch.ones(2, 3)
            return m, torch.randn(4, 3)

        if backend == "inductor" and returned != "itself":
            with self.assertRaisesRegex(PrecompileError, r"fn returns a view of a \.grad or of optimizer state \(fn's output 0"):
                torch_precompile.precompile(step, *make(), backend=backend)
            return
        f = load(torch_precompile.precompile(step, *make(), backend=backend))
        (ours, x), (theirs, y) = make(), make()
        f(ours, x).mul_(2)  # through the view, as in eager
        step(theirs, y).mul_(2)
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)

    @parametrize("backend", ("inductor",))  # free dims are inductor's
    def test_marks_sharing_a_shape_id_are_one_unbounded_size(self, backend):
        """Raw error: a shared shape_id baked the example size as an upper bound (``u0 <= 8``)."""
        mark_unbacked = torch._dynamo.decorators.mark_unbacked
        x, y = torch.randn(8, 3), torch.randn(8, 3)
        mark_unbacked(x, 0, shape_id="batch")
        mark_unbacked(y, 0, shape_id="batch")
        f = load(_artifact("shape_id", _sum_rows, x, y, backend=backend))
        for rows in (1, 8, 16):
            x, y = torch.randn(rows, 3), torch.randn(rows, 3)
            torch.testing.assert_close(f(x, y), _sum_rows(x, y))
        with self.assertRaisesRegex(PrecompileError, r"args\[1\] dim 0 has size 5 but args\[0\] dim 0 has size 16"):
            f(x, torch.randn(5, 3))

    @needs_mark_bounds
    @parametrize("backend", ("inductor",))
    def test_shape_id_bounds_from_two_marks_are_merged(self, backend):
        mark_unbacked = torch._dynamo.decorators.mark_unbacked
        x, y = torch.randn(8, 3), torch.randn(8, 3)
        mark_unbacked(x, 0, shape_id="batch", min=2)
        mark_unbacked(y, 0, shape_id="batch", max=10)
        f = load(_artifact("shape_id_bounds", _sum_rows, x, y, backend=backend))
        x, y = torch.randn(10, 3), torch.randn(10, 3)
        torch.testing.assert_close(f(x, y), _sum_rows(x, y))
        for rows in (1, 11):
            with self.assertRaisesRegex(PrecompileError, rf"args\[0\]: dim 0 has size {rows}, outside the bounds \[2, 10\]"):
                f(torch.randn(rows, 3), torch.randn(rows, 3))

    @needs_mark_bounds
    def test_shape_id_examples_must_agree_and_fit_the_bounds(self):
        mark_unbacked = torch._dynamo.decorators.mark_unbacked
        refusals = [
            (3, 5, r"the marks of shape_id 'n' are one size, but the example inputs have args\[0\] dim 0 = 3, "
                   r"args\[1\] dim 0 = 5"),
            (10, 10, r"args\[0\] dim 0 has size 10 in the example inputs, outside its bounds \[0, 8\] \(the "
                     r"tightest of the marks of shape_id 'n'\): every call would be refused"),
        ]
        for rows_x, rows_y, message in refusals:
            x, y = torch.randn(rows_x, 3), torch.randn(rows_y, 3)
            mark_unbacked(x, 0, shape_id="n")
            mark_unbacked(y, 0, shape_id="n", max=8)
            with self.assertRaisesRegex(PrecompileError, message):
                torch_precompile.precompile(_sum_rows, x, y, backend="inductor")

    @parametrize("backend", BACKENDS)
    def test_one_tensor_passed_twice_and_written(self, backend):
        """fn(x, x) writing x: traced as one tensor, computed as eager; distinct tensors are then refused."""
        for key, fn, arity in (("scale_first_same", _scale_first, 2), ("scale_last_same", _scale_last, 3)):
            example = torch.ones(3)
            f = load(_artifact(key, fn, *[example] * arity, backend=backend))
            self.assertEqual(example.tolist(), [1.0] * 3)  # capture wrote nothing
            x = torch.randn(3)
            reference = x.clone()
            torch.testing.assert_close(f(*[x] * arity), fn(*[reference] * arity))
            torch.testing.assert_close(x, reference)
            others = [torch.randn(3) for _ in range(arity - 1)]
            self.assertRefused(
                r"args\[1\] must be the same tensor as args\[0\], as at capture: fn writes one of them in place",
                lambda: f(x, *others), nn.Module(), x, *others,
            )

    @parametrize("backend", BACKENDS)
    def test_identity_between_tensor_inputs_is_as_captured(self, backend):
        """Tensors fn does not write, one object at capture: traced as one (fn may branch on
        ``a is b``), and every call passes one object there and distinct ones elsewhere."""
        x, y = torch.randn(3), torch.randn(3)
        same = load(_artifact("self_or_sum_same", _self_or_sum, x, x, y, backend=backend))
        torch.testing.assert_close(same(x, x, y), _self_or_sum(x, x, y))  # the example itself
        self.assertEqual(same.convention.same_inputs, ((0, 1),))
        distinct = load(_artifact("self_or_sum_distinct", _self_or_sum, x, x.clone(), y, backend=backend))
        z = torch.randn(3)
        torch.testing.assert_close(distinct(x, y, z), _self_or_sum(x, y, z))
        refusals = (
            (same, (x, x.clone(), y), r"args\[1\] must be the same tensor as args\[0\], as at capture: fn may branch on identity"),
            (same, (x, x, x), r"args\[2\] is args\[0\] \(one tensor\), but they were distinct tensors at capture: "
                              r"fn may branch on identity \(nn\.MultiheadAttention does\); pass distinct tensors, "
                              r"or precompile with one tensor there too"),
            (distinct, (x, x, y), r"args\[1\] is args\[0\] \(one tensor\), but they were distinct tensors at capture"),
            (distinct, (x, y, y), r"args\[2\] is args\[1\] \(one tensor\)"),
        )
        for f, call_args, message in refusals:
            self.assertRefused(message, lambda: f(*call_args), nn.Module(), *call_args)
        listed = [str(check) for check in distinct.checks if check.kind == "same"]
        self.assertEqual(listed, ["same          args[0], args[1], args[2]: 3 distinct tensors, as at capture (fn may branch on identity)"])

    @parametrize("backend", BACKENDS)
    def test_identity_between_module_arguments_is_as_captured(self, backend):
        """Modules with no tensors have no tie to check: the module arguments' identity
        partition is checked itself (fn may branch on ``a is b``), as the tensors' is."""
        act, other, x = nn.ReLU(), nn.ReLU(), torch.tensor([-1.0, 2.0])
        same = load(_artifact("self_or_both_same", _self_or_both, act, act, x, backend=backend))
        torch.testing.assert_close(same(act, act, x), _self_or_both(act, act, x))
        distinct = load(_artifact("self_or_both_distinct", _self_or_both, act, other, x, backend=backend))
        torch.testing.assert_close(distinct(other, act, x), _self_or_both(other, act, x))
        refusals = (
            (same, (act, other), r"args\[1\] must be the same module as args\[0\], as at capture: fn may branch on "
                                 r"identity and was traced with both as one module\. Pass one module for both"),
            (distinct, (act, act), r"args\[1\] is args\[0\] \(one module\), but they were distinct modules at capture: "
                                   r"fn may branch on identity\. Pass distinct modules"),
        )
        for f, modules, message in refusals:
            self.assertRefused(message, lambda: f(*modules, x), nn.Module(), x)
        self.assertEqual(same.convention.same_modules, ((0, 1),))
        listed = [str(check) for check in same.checks if check.kind == "same"]
        self.assertEqual(listed, [
            "same          args[1]: the same module as args[0]",
            "same          args[0], args[1]: 1 distinct modules, as at capture (fn may branch on identity)",
        ])

    @parametrize("backend", BACKENDS)
    def test_state_made_to_share_memory_past_the_hooks_is_refused(self, backend):
        """``set_``, parametrize's assignment (``original.set_``) and load_state_dict(assign=True)
        under swap_tensors make a parameter share the memory of a buffer the graph writes
        without a registration hook: refused at every call, the module cache's walk long done."""
        x = torch.randn(2, 4)
        for parametrized, share, name in (
            (False, _share_by_set, "l.weight"),
            (True, _share_by_parametrize, r"l\.parametrizations\.weight\.original"),
            (False, _share_by_swapping_load, "l.weight"),
        ):
            f = load(_artifact(f"counted_{parametrized}", _forward, _Counted(parametrized), x, backend=backend))
            model, reference = _Counted(parametrized), _Counted(parametrized)
            torch.testing.assert_close(f(model, x), reference(x))  # walks the modules, arms the fast path
            share(model)
            self.assertRefused(
                rf"args\[0\]\.{name} \(parameter\) and args\[0\]\.count \(buffer\) share memory, but they were "
                r"distinct tensors at capture and the graph writes args\[0\]\.count \(buffer\) in place",
                lambda: f(model, x), model, x,
            )

    @parametrize("backend", BACKENDS)
    def test_multihead_self_attention_is_captured_as_self_attention(self, backend):
        """nn.MultiheadAttention branches on ``query is key is value`` (one packed projection)."""
        torch.manual_seed(0)
        attention, x = nn.MultiheadAttention(8, 2), torch.randn(5, 1, 8)
        f = load(_artifact("self_attention", _attend, attention, x, x, x, backend=backend))
        torch.testing.assert_close(f(attention, x, x, x), _attend(attention, x, x, x))
        self.assertRefused(
            r"args\[2\] must be the same tensor as args\[1\], as at capture: fn may branch on identity",
            lambda: f(attention, x, x.clone(), x), attention, x,
        )

    @needs_mark_bounds
    def test_one_tensor_passed_twice_with_marked_dims_is_refused_at_capture(self):
        """The symbolic trace takes each input leaf as its own tensor: refused, naming both."""
        x = torch.randn(4, 3)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        for fn in (_sum_rows, _scale_first):
            with self.assertRaisesRegex(
                PrecompileError, r"args\[1\] is args\[0\] \(one tensor\), and the example inputs have dims marked"
            ):
                torch_precompile.precompile(fn, x, x, backend="inductor")


instantiate_parametrized_tests(TestHookGuards)


if __name__ == "__main__":
    run_tests()
