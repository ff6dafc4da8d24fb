# Owner(s): ["module: dynamo"]
"""Calls users (and torch.compile) expect to work (issue 27, item 3).

Keyword arguments bind like fn's own signature; a dict input may come with
its keys in another order; plain namedtuples and pytree nodes registered
without serialized_type_name, keys or a JSON context are recorded by import
path and compared at each call; OneCycleLR's momentum / betas[0] are graph
inputs like lr.  Each case on both backends: eager's values, or the exact
PrecompileError with nothing changed.  See Note [precompile programming
model], invariants 3 and 15.  Artifacts are compiled once per process.
"""

import collections
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile

from torch_precompile import PrecompileError
from _precompile_testing import small_mlp
from test_precompile_optimizer import TOLERANCE, train_step
from test_precompile_soundness import _runnable, BACKENDS


precompile = torch_precompile.precompile
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design


def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def _snapshot(model, *tensors):
    """Copies of everything a call could write: parameters, their .grad, the tensors."""
    return [t.detach().clone() for t in (*model.parameters(), *tensors)] + [
        None if p.grad is None else p.grad.clone() for p in model.parameters()
    ]


class _RefusalAssertions(TestCase):
    def assertRefused(self, regex, call, model, *tensors):
        """``call()`` raises a PrecompileError matching ``regex`` and writes nothing."""
        before = _snapshot(model, *tensors)
        with self.assertRaisesRegex(PrecompileError, regex):
            call()
        for old, new in zip(before, _snapshot(model, *tensors)):
            if old is None or new is None:
                self.assertIs(old, new, "a refused call wrote a .grad")
            else:
                self.assertTrue(old.equal(new), "a refused call changed a tensor")


# ---------------------------------------------------------------------------
# Keyword arguments
# ---------------------------------------------------------------------------


def _scaled_step(model, x, y, scale=2.0, *, reduction="mean"):
    loss = F.mse_loss(model(x) * scale, y, reduction=reduction)
    loss.backward()
    return loss.detach()


def _sum_all(model, *xs):
    return sum(model(x) for x in xs)


def _positional_only(model, x, /):
    return model(x)


class TestKeywordArguments(_RefusalAssertions):
    @parametrize("backend", BACKENDS)
    def test_keywords_bind_like_fn(self, backend):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        f = _runnable("scaled_step", _scaled_step, _linear(), x, y, backend=backend)
        self.assertEqual(
            f.convention.signature,
            (
                ("model", "POSITIONAL_OR_KEYWORD", True),
                ("x", "POSITIONAL_OR_KEYWORD", True),
                ("y", "POSITIONAL_OR_KEYWORD", True),
                ("scale", "POSITIONAL_OR_KEYWORD", False),
                ("reduction", "KEYWORD_ONLY", False),
            ),
        )
        for call in (lambda m: f(m, x, y=y), lambda m: f(y=y, x=x, model=m), lambda m: f(m, x, y)):
            model, ref = _linear(), _linear()
            torch.testing.assert_close(call(model), _scaled_step(ref, x, y))
            torch.testing.assert_close(model.weight.grad, ref.weight.grad)

    @parametrize("backend", BACKENDS)
    def test_what_cannot_bind_is_refused_by_name(self, backend):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        f = _runnable("scaled_step", _scaled_step, _linear(), x, y, backend=backend)
        model = _linear()
        signature = r"fn\(model, x, y, scale=<baked at capture>, \*, reduction=<baked at capture>\): "
        self.assertRefused(signature + "got an unexpected keyword argument 'target'", lambda: f(model, x, target=y), model, x, y)
        self.assertRefused(signature + "missing a required argument: 'y'", lambda: f(model, x), model, x, y)
        self.assertRefused(signature + "multiple values for argument 'x'", lambda: f(model, x, y, x=x), model, x, y)
        baked = r"fn's parameter '{}' was not passed at capture, so its default is baked into the artifact"
        self.assertRefused(baked.format("scale"), lambda: f(model, x, y, scale=3.0), model, x, y)
        self.assertRefused(baked.format("scale"), lambda: f(model, x, y, 2.0), model, x, y)
        self.assertRefused(baked.format("reduction"), lambda: f(model, x, y, reduction="sum"), model, x, y)

    @parametrize("backend", BACKENDS)
    def test_var_positional_and_positional_only(self, backend):
        a, b = torch.randn(3, 4), torch.randn(3, 4)
        f = _runnable("sum_all", _sum_all, _linear(), a, b, backend=backend)
        model = _linear()
        torch.testing.assert_close(f(model, b, a), _sum_all(model, b, a))
        with self.assertRaisesRegex(PrecompileError, r"^expected 3 positional arguments \(as captured\), got 2"):
            f(model, a)
        with self.assertRaisesRegex(PrecompileError, r"got an unexpected keyword argument 'xs'"):
            f(model, a, b, xs=a)
        g = _runnable("positional_only", _positional_only, _linear(), a, backend=backend)
        torch.testing.assert_close(g(model, a), model(a))
        with self.assertRaisesRegex(PrecompileError, r"fn\(model, x, /\): got an unexpected keyword argument 'x'"):
            g(model, x=a)

    def test_fn_without_a_signature_takes_positional_calls(self):
        f = precompile.load(*precompile(torch.relu, torch.randn(3), backend="eager"))
        self.assertEqual(f.convention.signature, ())
        x = torch.randn(3)
        torch.testing.assert_close(f(x), torch.relu(x))
        with self.assertRaisesRegex(PrecompileError, r"keyword arguments are not supported \(got \['input'\]\)"):
            f(input=x)


# ---------------------------------------------------------------------------
# Dict inputs in another key order
# ---------------------------------------------------------------------------


def _by_key(model, batch):
    loss = F.mse_loss(model(batch["x"]), batch["y"])
    loss.backward()
    return loss.detach()


def _iterates(model, batch):
    return model(torch.cat(list(batch.values())))


def _weighted(model, x, w):
    return model(x) * w


def _unpacks(model, batch):
    return _weighted(model, **batch)


def _returns_batch(model, batch):
    batch["out"] = model(batch["x"])
    return batch


def _nested(model, items):
    return [model(item["x"]) * item["w"] for item in items]


class TestDictOrder(_RefusalAssertions):
    @parametrize("backend", BACKENDS)
    def test_same_keys_in_another_order_map_by_key(self, backend):
        x, y = torch.randn(3, 4), torch.randn(3, 2)
        f = _runnable("by_key", _by_key, _linear(), {"x": x, "y": y}, backend=backend)
        self.assertEqual(f.convention.ordered_dicts, ())
        model, ref = _linear(), _linear()
        torch.testing.assert_close(f(model, {"y": y, "x": x}), _by_key(ref, {"y": y, "x": x}))
        torch.testing.assert_close(model.weight.grad, ref.weight.grad)
        self.assertRefused(
            r"^args\[1\]: a dict with keys \['y', 'target'\], but it had keys \['x', 'y'\] at capture",
            lambda: f(model, {"y": y, "target": x}),
            model,
            x,
            y,
        )
        self.assertRefused(r"^args\[1\]: a dict with keys \['x'\]", lambda: f(model, {"x": x}), model, x)

    @parametrize("backend", BACKENDS)
    def test_nested_dicts_map_by_key(self, backend):
        x, w = torch.randn(3, 4), torch.randn(3, 2)
        f = _runnable("nested", _nested, _linear(), [{"x": x, "w": w}, {"x": x[:2], "w": w[:2]}], backend=backend)
        model = _linear()
        items = [{"w": w, "x": x}, {"x": x[1:], "w": w[1:]}]
        torch.testing.assert_close(f(model, items), _nested(model, items))
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]\[0\]: a dict with keys \['w'\]"):
            f(model, [{"w": w}, items[1]])

    @parametrize("backend", BACKENDS)
    def test_unpacking_observes_the_order(self, backend):
        # ``**batch`` reads the keys in order (a **kwargs callee would see it): refused, not guessed.
        x, w = torch.randn(3, 4), torch.randn(3, 2)
        f = _runnable("unpacks", _unpacks, _linear(), {"x": x, "w": w}, backend=backend)
        self.assertEqual(f.convention.ordered_dicts, ("args[1]",))
        model = _linear()
        torch.testing.assert_close(f(model, {"x": x, "w": w}), _unpacks(model, {"x": x, "w": w}))
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]: its keys come in the order \['w', 'x'\].*\*\* or a for loop"):
            f(model, {"w": w, "x": x})

    @parametrize("backend", BACKENDS)
    def test_an_input_dict_returned_keeps_its_order(self, backend):
        x, w = torch.randn(3, 4), torch.randn(3)
        f = _runnable("returns_batch", _returns_batch, _linear(), {"x": x, "w": w}, backend=backend)
        self.assertEqual(f.convention.ordered_dicts, ("args[1]",))  # returning it shows its order
        model = _linear()
        out = f(model, {"x": x, "w": w})
        self.assertIs(type(out), dict)
        self.assertEqual(list(out), ["x", "w", "out"])
        torch.testing.assert_close(out, _returns_batch(model, {"x": x, "w": w}))
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]: its keys come in the order \['w', 'x'\]"):
            f(model, {"w": w, "x": x})

    @parametrize("backend", BACKENDS)
    def test_order_fn_observed_is_kept(self, backend):
        a, b = torch.randn(1, 4), torch.randn(2, 4)
        f = _runnable("iterates", _iterates, _linear(), {"a": a, "b": b}, backend=backend)
        self.assertEqual(f.convention.ordered_dicts, ("args[1]",))
        model = _linear()
        batch = {"a": torch.randn(1, 4), "b": torch.randn(2, 4)}
        torch.testing.assert_close(f(model, batch), _iterates(model, batch))
        # Eager would concatenate b before a: another result, so refused.
        with self.assertRaisesRegex(
            PrecompileError, r"^args\[1\]: its keys come in the order \['b', 'a'\], but were \['a', 'b'\] at capture, and fn observed"
        ):
            f(model, {"b": b, "a": a})


# ---------------------------------------------------------------------------
# namedtuples and pytree nodes recorded by import path
# ---------------------------------------------------------------------------


Pair = collections.namedtuple("Pair", "first second")


class Scaled:
    """A pytree node registered without serialized_type_name or keys; its context is a literal."""

    def __init__(self, tensor, factor):
        self.tensor, self.factor = tensor, factor


pytree.register_pytree_node(Scaled, lambda s: ([s.tensor], s.factor), lambda leaves, factor: Scaled(leaves[0], factor))


class Tag:
    """A context that is not a literal but has a stable repr; __eq__ says False to other types."""

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Tag) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"Tag({self.name!r})"


class Tagged:
    def __init__(self, tensor, name):
        self.tensor, self.name = tensor, name


pytree.register_pytree_node(Tagged, lambda t: ([t.tensor], Tag(t.name)), lambda leaves, tag: Tagged(leaves[0], tag.name))


def _pair_step(model, pair):
    return Pair(model(pair.first), pair.second * 2)


def _custom_nodes(model, scaled, tagged):
    return model(scaled.tensor) * scaled.factor + len(tagged.name) * model(tagged.tensor)


class TestNamedStructures(_RefusalAssertions):
    @parametrize("backend", BACKENDS)
    def test_namedtuple_input_and_output(self, backend):
        x, y = torch.randn(3, 4), torch.randn(3)
        f = _runnable("pair", _pair_step, _linear(), Pair(x, y), backend=backend)
        model = _linear()
        pair = Pair(torch.randn(3, 4), torch.randn(3))
        out = f(model, pair)
        self.assertIs(type(out), Pair)
        torch.testing.assert_close(out, _pair_step(model, pair))
        with self.assertRaisesRegex(PrecompileError, (
            r"^args\[1\]: input structure differs from the captured one: args\[1\] is a builtins\.tuple, but was a \S*Pair "
            r"at capture; expected TreeSpec\(namedtuple, <class '\S*Pair'>"
        )):
            f(model, (x, y))

    @parametrize("backend", BACKENDS)
    def test_nodes_without_keys_or_a_json_context(self, backend):
        x = torch.randn(3, 4)
        f = _runnable("custom", _custom_nodes, _linear(), Scaled(x, 3), Tagged(x.clone(), "ab"), backend=backend)
        model = _linear()
        z = torch.randn(3, 4)
        torch.testing.assert_close(f(model, Scaled(z, 3), Tagged(x, "ab")), _custom_nodes(model, Scaled(z, 3), Tagged(x, "ab")))
        # The contexts are part of the structure, compared at each call: another factor or tag is refused.
        with self.assertRaisesRegex(PrecompileError, (
            r"^args\[1\]: input structure differs from the captured one: args\[1\] \(Scaled\) has 4 in its context, but 3 at "
            r"capture; expected TreeSpec\(Scaled, 3, \[\*\]\), got TreeSpec\(Scaled, 4"
        )):
            f(model, Scaled(z, 4), Tagged(x, "ab"))
        with self.assertRaisesRegex(PrecompileError, r"^args\[2\]: input structure differs.*Tag\('abc'\)"):
            f(model, Scaled(z, 3), Tagged(x, "abc"))
        # A leaf's error is named by position where the node has no keys.
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]\[0\]: expected shape \(3, 4\)"):
            f(model, Scaled(z[:2], 3), Tagged(x, "ab"))
        # TreeSpec's == takes 3.0 for 3 (and True for 1); fn computes with the context's type too.
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]: a \S*Scaled node's context is 3\.0, but was 3 at capture"):
            f(model, Scaled(z, 3.0), Tagged(x, "ab"))

    @parametrize("backend", BACKENDS)
    def test_sizes_come_back_as_sizes(self, backend):
        """torch's pytree rebuilds a torch.Size as a plain tuple; fn returned a Size."""

        def shapes(m, x):
            y = m(x)
            return y.shape, {"sizes": [x.size(), y]}

        f = precompile.load(*precompile(shapes, _linear(), torch.randn(3, 4), backend=backend))
        x = torch.randn(3, 4)
        ours, theirs = f(_linear(), x), shapes(_linear(), x)
        self.assertIs(type(ours[0]), torch.Size)
        self.assertIs(type(ours[1]["sizes"][0]), torch.Size)
        self.assertEqual(ours[0].numel(), theirs[0].numel())
        torch.testing.assert_close(ours, theirs)

    def test_what_load_cannot_import_or_compare_is_refused_at_capture(self):
        x = torch.randn(3, 4)
        local_pair = collections.namedtuple("LocalPair", "a b")
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\]: its pytree structure holds the class \S+\.LocalPair, which cannot be imported.*define it at module level"):
            precompile(lambda m, p: m(p.a), _linear(), local_pair(x, x), backend="eager")
        with self.assertRaisesRegex(PrecompileError, r"^fn's output: its pytree structure holds a \S+\.Tagged whose context Tag\('o'\) is not a Python literal or a class, so load could not rebuild it"):
            precompile(lambda m, x: Tagged(m(x), "o"), _linear(), x, backend="eager")

    def test_load_refuses_a_class_it_cannot_import(self):
        python_code, _ = precompile(_pair_step, _linear(), Pair(torch.randn(3, 4), torch.randn(3)), backend="eager")
        self.assertIn(f"'{__name__}:Pair'", python_code)
        edited = python_code.replace(f"'{__name__}:Pair'", f"'{__name__}:Missing'")
        with self.assertRaisesRegex(PrecompileError, rf"holds the class {__name__}\.Missing, which this process cannot import"):
            precompile.load(edited, b"")


# ---------------------------------------------------------------------------
# OneCycleLR: momentum / betas[0] are graph inputs like lr
# ---------------------------------------------------------------------------


OPTIMIZERS = {
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "sgd_momentum_foreach": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=True),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=1e-2),
    "adamw_foreach": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True),
}


def _one_cycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=8)


def _cycled(group):
    return group["momentum"] if "momentum" in group else group["betas"][0]


class TestOneCycleLR(_RefusalAssertions):
    def _step(self, name, backend):
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        model = small_mlp()
        return _runnable(f"onecycle_{name}", train_step, model, OPTIMIZERS[name](model), x, y, backend=backend)

    @parametrize("backend", BACKENDS)
    @parametrize("name", list(OPTIMIZERS))
    def test_one_cycle_matches_eager(self, backend, name):
        step = self._step(name, backend)
        self.assertEqual(step.convention.optimizers[0].lifted, ("momentum",) if name.startswith("sgd") else ("betas[0]",))
        model, ref = small_mlp(), small_mlp()
        opt, ref_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](ref)
        schedule, ref_schedule = _one_cycle(opt), _one_cycle(ref_opt)
        cycled = [_cycled(opt.param_groups[0])]
        torch.manual_seed(1)
        for _ in range(4):
            x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
            torch.testing.assert_close(step(model, opt, x, y), train_step(ref, ref_opt, x, y), **TOLERANCE)
            schedule.step()
            ref_schedule.step()
            cycled.append(_cycled(opt.param_groups[0]))
        self.assertGreater(len(set(cycled)), 2)  # the scheduler changed it between calls
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, **TOLERANCE)
            self.assertEqual(sorted(opt.state[p]), sorted(ref_opt.state[q]))
            for key in opt.state[p]:
                torch.testing.assert_close(opt.state[p][key], ref_opt.state[q][key], **TOLERANCE)

    @parametrize("backend", BACKENDS)
    def test_zero_momentum_is_refused_before_any_write(self, backend):
        step = self._step("sgd_momentum", backend)
        model = small_mlp()
        opt = OPTIMIZERS["sgd_momentum"](model)
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        step(model, opt, x, y)
        buffers = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
        opt.param_groups[0]["momentum"] = 0.0  # eager would leave the buffers alone
        self.assertRefused(
            r"args\[1\] \(optimizer\) param_groups\[0\]\['momentum'\] is 0, but was not at capture",
            lambda: step(model, opt, x, y),
            model,
            x,
            *[opt.state[p]["momentum_buffer"] for p in model.parameters()],
        )
        for p, buffer in zip(model.parameters(), buffers):
            self.assertTrue(opt.state[p]["momentum_buffer"].equal(buffer))

    def test_nesterov_momentum_stays_baked(self):
        # Nesterov SGD passes momentum as add's alpha=, which must be a number.
        make = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True)  # noqa: E731
        model = small_mlp()
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        step = precompile.load(*precompile(train_step, model, make(model), x, y, backend="eager"))
        self.assertEqual(step.convention.optimizers[0].lifted, ())
        opt = make(model)
        _one_cycle(opt)
        self.assertRefused(
            r"param_groups\[0\]\['momentum'\]: expected 0.9 \(baked at capture\), got 0.95.*only 'lr' may change",
            lambda: step(model, opt, x, y),
            model,
            x,
        )


instantiate_parametrized_tests(TestKeywordArguments)
instantiate_parametrized_tests(TestDictOrder)
instantiate_parametrized_tests(TestNamedStructures)
instantiate_parametrized_tests(TestOneCycleLR)


if __name__ == "__main__":
    run_tests()
