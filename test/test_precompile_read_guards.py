# Owner(s): ["module: dynamo"]
"""Guards from what fn read (issue 27, item 1, row 1; Note invariant 11).

Every plain Python value fn reads from its modules -- private or public,
instance or class attribute, a list / tuple / dict and its elements, a dtype,
Size, Enum or numpy scalar, a field of a config object reached through
attributes -- is recorded at capture by its attribute path and checked at
every call: a changed value is refused before any state changes, an equal one
is honoured with eager's result.  Values that cannot be checked are refused
at capture, naming the path.  Artifacts are compiled once per process per
backend; the models stay tiny.
"""

import collections
import copy
import dataclasses
import enum
import gc
import logging
import os
import re
import sys
import types
import weakref

import numpy as np

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
from torch_precompile import PrecompileError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_precompile_soundness import _state  # noqa: E402


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design


class _Mode(str, enum.Enum):  # a str Enum: its repr is no Python literal
    SUM = "sum"
    MEAN = "mean"


class _Rope:
    def __init__(self):
        self.theta = 2.0


class _Table(dict):  # a dict subclass: has a __dict__, holds its items outside it
    pass


class _Row(list):
    pass


class _Config:
    """A config object, as transformers models hold one: fields and nested objects."""

    def __init__(self):
        self.eps = 0.5
        self.rope = _Rope()
        self.unused = "never read"


class _Reader(nn.Module):
    offset = 1.0  # class-level defaults
    bias_scale = 2.0

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self._scale = 2.0
        self.scales = [0.5, 3.0]
        self.pair = (1.0, -1.0)
        self.weights = {"a": 1.5}
        self.out_dtype = torch.float64
        self.shape = torch.Size([2, 6])
        self.config = _Config()
        self.mode = _Mode.SUM
        self.gain = np.float64(1.25)
        self.unread = 7.0

    def forward(self, x):
        y = self.bn(self.lin(x)) * self._scale + self.offset * self.bias_scale
        y = y * self.scales[0] + self.pair[1] * self.weights["a"]
        y = (y + self.config.eps) * self.config.rope.theta * self.gain
        y = y.reshape(self.shape).to(self.out_dtype)
        return y.sum(0) if self.mode == _Mode.SUM else y.mean(0)


def _train_step(model, x):
    loss = model(x).square().sum()
    loss.backward()
    return loss


_RUNNABLES: dict = {}


def _runnable(key, fn, *example_inputs, backend):
    if (key, backend) not in _RUNNABLES:
        _RUNNABLES[key, backend] = precompile.load(*precompile(fn, *example_inputs, backend=backend))
    return _RUNNABLES[key, backend]


def _reader_step(backend):
    return _runnable("reader", _train_step, _Reader(), torch.randn(3, 4), backend=backend)


class TestReadGuards(TestCase):
    def setUp(self):
        super().setUp()
        self.model, self.x = _Reader(), torch.randn(3, 4)

    def tearDown(self):
        _Reader.offset, _Reader.bias_scale = 1.0, 2.0  # class attributes a test changed
        super().tearDown()

    def check_call(self, f):
        """f(model, x) equals eager's on a deep copy: loss, .grad, running stats."""
        ref = copy.deepcopy(self.model)
        for p, q in zip(self.model.parameters(), ref.parameters()):  # deepcopy drops a Parameter's .grad
            q.grad = None if p.grad is None else p.grad.clone()
        got = f(self.model, self.x)
        want = _train_step(ref, self.x)
        torch.testing.assert_close(got, want)
        for (name, a), (_, b) in zip(_state(self.model), _state(ref)):
            # Inductor's fused BatchNorm backward rounds differently; a changed value differs by far more.
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=name)

    def assert_refused(self, regex, f):
        before = _state(self.model, self.x)
        with self.assertRaisesRegex(PrecompileError, regex):
            f(self.model, self.x)
        for (name, old), (_, new) in zip(before, _state(self.model, self.x)):
            if old is None or new is None:
                self.assertIs(old, new, f"a refused call wrote {name}")
            else:
                self.assertTrue(old.equal(new), f"a refused call changed {name}")

    def change_and_restore(self, backend, change, restore, regex):
        """Refused after ``change`` with nothing written; eager's result once ``restore``d."""
        f = _reader_step(backend)
        self.check_call(f)
        change()
        self.assert_refused(regex, f)
        restore()
        self.check_call(f)

    @parametrize("backend", BACKENDS)
    def test_private_attribute(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "_scale", 3.0),
            lambda: setattr(self.model, "_scale", float("2.0")),  # an equal value, another object
            r"args\[0\]\._scale is 3\.0, but was 2\.0 at capture \(fn read it",
        )

    @parametrize("backend", BACKENDS)
    def test_class_default_overridden_on_the_instance(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "offset", 5.0),
            lambda: delattr(self.model, "offset"),
            r"args\[0\]\.offset is 5\.0, but was 1\.0 at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_class_attribute_changed_on_the_class(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(_Reader, "bias_scale", -2.0),
            lambda: setattr(_Reader, "bias_scale", 2.0),
            r"args\[0\]\.bias_scale is -2\.0, but was 2\.0 at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_list_element_changed_in_place(self, backend):
        self.change_and_restore(
            backend,
            lambda: self.model.scales.__setitem__(0, 0.25),
            lambda: self.model.scales.__setitem__(0, 0.5),
            r"args\[0\]\.scales is \[0\.25, 3\.0\], but was \[0\.5, 3\.0\] at capture",
        )
        # An element fn never reads is still part of the recorded value: refused, not ignored.
        self.model.scales.append(1.0)
        self.assert_refused(r"args\[0\]\.scales is \[0\.5, 3\.0, 1\.0\]", _reader_step(backend))

    @parametrize("backend", BACKENDS)
    def test_tuple_and_dict_elements(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "pair", (1.0, -2.0)),
            lambda: setattr(self.model, "pair", (1.0, -1.0)),
            r"args\[0\]\.pair is \(1\.0, -2\.0\), but was \(1\.0, -1\.0\) at capture",
        )
        self.change_and_restore(
            backend,
            lambda: self.model.weights.__setitem__("a", 1),  # another value, and an int
            lambda: self.model.weights.__setitem__("a", 1.5),
            r"args\[0\]\.weights is \{'a': 1\}, but was \{'a': 1\.5\} at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_dtype_and_size_attributes(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "out_dtype", torch.float32),
            lambda: setattr(self.model, "out_dtype", torch.float64),
            r"args\[0\]\.out_dtype is torch\.float32, but was torch\.float64 at capture",
        )
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "shape", torch.Size([6, 2])),
            lambda: setattr(self.model, "shape", torch.Size([2, 6])),
            r"args\[0\]\.shape is torch\.Size\(\[6, 2\]\), but was torch\.Size\(\[2, 6\]\) at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_config_object_fields(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model.config, "eps", 0.25),
            lambda: setattr(self.model.config, "eps", 0.5),
            r"args\[0\]\.config\.eps is 0\.25, but was 0\.5 at capture",
        )
        self.change_and_restore(
            backend,
            lambda: setattr(self.model.config.rope, "theta", 4.0),
            lambda: setattr(self.model.config, "rope", _Rope()),  # another object, equal fields
            r"args\[0\]\.config\.rope\.theta is 4\.0, but was 2\.0 at capture",
        )
        self.model.config.unused = "changed"  # a field fn never read: honoured
        self.check_call(_reader_step(backend))

    def test_class_of_a_config_object_assigned_after_a_call_is_refused(self):
        """A class default read through a plain object is looked up on the object's class at every
        call: ``config.__class__ = Other`` after a warm call, which writes no dict the module cache
        watches, is refused as the first call's walk would refuse it."""

        class Defaults:
            scale = 2.0

        class Larger(Defaults):
            scale = 5.0

        class Scaled(nn.Module):
            factor = 1.0  # a class attribute read through the module: its owner is the model

            def __init__(self):
                super().__init__()
                self.lin, self.config = nn.Linear(4, 4), Defaults()

            def forward(self, x):
                return self.lin(x) * self.config.scale * self.factor

        model, x = Scaled(), torch.randn(3, 4)
        f = torch_precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), model(x))  # warm: the module cache holds model
        model.config.__class__ = Larger
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.config\.scale is 5\.0, but was 2\.0 at capture"):
            f(model, x)
        model.config.__class__ = Defaults
        torch.testing.assert_close(f(model, x), model(x))
        # The cache finds the owners' classes through weak references: it keeps no model alive.
        alive = weakref.ref(model)
        del model
        gc.collect()
        self.assertIsNone(alive())

    @parametrize("backend", BACKENDS)
    def test_str_enum_attribute(self, backend):
        """Captured without a SyntaxError (the Enum is recorded by class and member name)."""
        f = _reader_step(backend)
        self.assertIn(("", "mode", {"enum": (f"{__name__}._Mode", "SUM")}), f.convention.modules[0].attributes)
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "mode", _Mode.MEAN),
            lambda: setattr(self.model, "mode", _Mode("sum")),
            r"args\[0\]\.mode is <_Mode\.MEAN: 'mean'>, but was _Mode\.SUM at capture",
        )
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "mode", "sum"),  # equal under ==, but no _Mode
            lambda: setattr(self.model, "mode", _Mode.SUM),
            r"args\[0\]\.mode is 'sum', but was _Mode\.SUM at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_numpy_scalar_attribute(self, backend):
        self.change_and_restore(
            backend,
            lambda: setattr(self.model, "gain", np.float32(1.25)),  # equal value, other dtype
            lambda: setattr(self.model, "gain", np.float64(1.25)),
            r"args\[0\]\.gain is np\.float32\(1\.25\), but was numpy\.float64\(1\.25\) at capture",
        )

    @parametrize("backend", BACKENDS)
    def test_unread_attribute_is_free(self, backend):
        self.model.unread = -1.0
        self.model.lin.in_features = 5
        self.check_call(_reader_step(backend))

    @parametrize("backend", BACKENDS)
    def test_numpy_and_enum_arguments(self, backend):
        """numpy scalars and Enum members as positional arguments: baked with their types, checked."""

        def scaled(x, s, mode):
            return x * s if mode is _Mode.SUM else x / s

        x = torch.randn(3)
        f = _runnable("numpy_arg", scaled, x, np.float64(2.5), _Mode.SUM, backend=backend)
        torch.testing.assert_close(f(x, np.float64(2.5), _Mode.SUM), scaled(x, np.float64(2.5), _Mode.SUM))
        for s, mode, message in (
            (2.5, _Mode.SUM, r"args\[1\]: expected numpy\.float64\(2\.5\) \(baked into the artifact at capture\), got 2\.5"),
            (np.float64(3.0), _Mode.SUM, r"args\[1\]: expected numpy\.float64\(2\.5\).*got np\.float64\(3\.0\)"),
            (np.float64(2.5), _Mode.MEAN, r"args\[2\]: expected _Mode\.SUM.*got <_Mode\.MEAN: 'mean'>"),
        ):
            with self.assertRaisesRegex(PrecompileError, message):
                f(x, s, mode)

    def test_a_list_alone(self):
        """A model whose only read value is a list (as nn.GRU's _flat_weights_names): written in place, seen."""

        class Listed(nn.Module):
            def __init__(self):
                super().__init__()
                self.scales = [2.0]

            def forward(self, x):
                return x * self.scales[0]

        model, x = Listed(), torch.randn(2)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), x * 2)
        model.scales[0] = 3.0
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.scales is \[3\.0\], but was \[2\.0\]"):
            f(model, x)

    def test_attribute_found_absent(self):
        """``getattr(config, "sliding_window", None)`` and ``getattr(self, "scale", 1.0)``: absence is read too."""

        class Windowed(nn.Module):
            def __init__(self):
                super().__init__()
                self.config = _Config()

            def forward(self, x):
                window = getattr(self.config, "sliding_window", None)
                return (x if window is None else x[:window]) * getattr(self, "scale", 1.0)

        model, x = Windowed(), torch.randn(3)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), model(x))
        for owner, name, value in ((model.config, "sliding_window", 2), (model, "scale", 3.0)):
            setattr(owner, name, value)
            with self.assertRaisesRegex(PrecompileError, rf"args\[0\]\.(config\.)?{name} is {value}, but was missing at capture"):
                f(model, x)
            delattr(owner, name)
            torch.testing.assert_close(f(model, x), model(x))
        del model.config  # eager raises an AttributeError: refused, not computed
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.config\.sliding_window is unreachable"):
            f(model, x)

    def test_name_a_class_getattr_computes_is_read_absent(self):
        """A module whose own ``__getattr__`` computes ``factor``: an instance attribute set later shadows it."""

        class Computed(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 3)
                self.mult = 2.0

            def __getattr__(self, name):
                return self.mult if name == "factor" else super().__getattr__(name)

            def forward(self, x):
                return self.lin(x) * self.factor

        model, x = Computed(), torch.randn(2, 3)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), model(x))
        model.factor = 7.0
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.factor is 7\.0, but was missing at capture"):
            f(model, x)
        del model.factor
        model.mult = 3.0
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.mult is 3\.0, but was 2\.0"):
            f(model, x)

    def test_a_forward_set_on_an_instance_after_capture_is_refused(self):
        """``m.forward = wrapper`` (accelerate's prepare() wraps forward in autocast this way): eager runs
        the wrapper, the graph holds the class's forward; also a helper method the model calls."""

        class Helper(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(3, 2)

            def scale(self, y):
                return y * 2

            def forward(self, x):
                return self.scale(self.lin(x))

        model, x = nn.Sequential(Helper(), nn.ReLU()), torch.randn(4, 3)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        for path, name, replacement in (
            ("0", "forward", lambda x: model[0].lin(x)),
            ("1", "forward", lambda x: x),
            ("0", "scale", lambda y: y * 3),
        ):
            with self.subTest(path=path, name=name):
                setattr(model.get_submodule(path), name, replacement)
                with self.assertRaisesRegex(
                    PrecompileError,
                    rf"^args\[0\]\.{path}\.{name} is set on the instance \(<function .*\), where at capture its class's "
                    r"method ran, which the graph holds: delete that instance attribute to call the artifact",
                ):
                    f(model, x)
                delattr(model.get_submodule(path), name)
                torch.testing.assert_close(f(model, x), model(x))

    def test_a_value_of_another_type_with_the_same_repr_is_named_by_its_type(self):
        class Momentum(float):
            pass

        model, x = nn.BatchNorm1d(4), torch.randn(5, 4)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        model.momentum = Momentum(0.1)
        with self.assertRaisesRegex(PrecompileError, r"^args\[0\]\.momentum is 0\.1 of type .*Momentum, but was 0\.1 at capture"):
            f(model, x)

    def test_enum_or_numpy_output_leaf_is_refused_not_a_syntax_error(self):
        """An output leaf is returned as recorded: only plain int, float, bool, str or None."""
        for leaf, kind in ((_Mode.SUM, "_Mode"), (np.float64(1.0), "float64")):
            with self.assertRaisesRegex(PrecompileError, rf"fn's output leaf 1: unsupported leaf of type {kind}"):
                precompile(lambda x: (x * 2, leaf), torch.randn(2), backend="eager")  # noqa: B023

    def test_transformers_style_config(self):
        """A transformers PretrainedConfig (its own __getattribute__ / __setattr__) read through self.config."""
        try:
            from transformers import PretrainedConfig
        except ImportError:
            self.skipTest("transformers is not installed")

        class Norm(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config

            def forward(self, x):
                return x / (x.square().mean(-1, keepdim=True) + self.config.rms_norm_eps).sqrt()

        model, x = Norm(PretrainedConfig(rms_norm_eps=1e-6, hidden_size=4)), torch.randn(2, 4)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        self.assertIn(("", "config.rms_norm_eps", 1e-6), f.convention.modules[0].attributes)
        self.assertEqual(len(f.convention.modules[0].attributes), 2)  # and forward, guarded absent from the instance
        self.assertIs(type(model.config), PretrainedConfig)  # the read probe is gone
        torch.testing.assert_close(f(model, x), model(x))
        model.config.hidden_size = 8  # never read: honoured
        torch.testing.assert_close(f(model, x), model(x))
        model.config.rms_norm_eps = 1e-2
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.config\.rms_norm_eps is 0\.01, but was 1e-06"):
            f(model, x)

    def test_transformers_attribute_map_alias(self):
        """A name the config's own __getattribute__ maps to another field (GPT-2's n_embd) is read through it."""
        try:
            from transformers import GPT2Config
        except ImportError:
            self.skipTest("transformers is not installed")

        class Scale(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.config = config

            def forward(self, x):
                return x * self.config.hidden_size  # GPT2Config.attribute_map: hidden_size -> n_embd

        model, x = Scale(GPT2Config(n_embd=4, n_layer=1, n_head=1)), torch.randn(2, 4)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), model(x))
        model.config.n_embd = 8
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.config\.hidden_size is 8, but was 4"):
            f(model, x)
        model.config.n_embd = 4
        torch.testing.assert_close(f(model, x), model(x))

    def test_values_that_cannot_be_checked_are_refused_at_capture(self):
        class Odd(nn.Module):
            def __init__(self, table):
                super().__init__()
                self.lin, self.table = nn.Linear(4, 4), table

            def forward(self, x):
                return self.lin(x) * len(self.table)

        for table, kind in (
            ({1, 2}, r"a builtins\.set"),
            (np.ones(2), r"a numpy\.ndarray"),
            ([1.0, _Rope()], r"a list holding a test_precompile_read_guards\._Rope"),
            # Subclasses of builtin values with a __dict__ are no plain objects: their items (their
            # value) are no attribute reads, so a change of them would go unchecked.
            (collections.OrderedDict(a=1.0), r"a collections\.OrderedDict"),
            (_Table(a=1.0), r"a test_precompile_read_guards\._Table"),
            (_Row([1.0]), r"a test_precompile_read_guards\._Row"),
        ):
            model = Odd(table)
            before = _state(model)
            with self.assertRaisesRegex(
                PrecompileError, r"fn reads args\[0\]\.table, " + kind + r", which precompile cannot check at every call"
            ):
                precompile(lambda m, x: m(x), model, torch.randn(2, 4), backend="eager")
            self.assertIs(type(model), Odd)
            for (name, old), (_, new) in zip(before, _state(model)):
                self.assertTrue(old is new is None or old.equal(new), name)

    def test_fn_writing_a_value_it_read_is_refused_at_capture(self):
        class Counter(nn.Module):
            def __init__(self):
                super().__init__()
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                return x * self.calls

        with self.assertRaisesRegex(
            PrecompileError, r"fn changes args\[0\]\.calls \(from 0 to 1\); the artifact would compute with the value it read"
        ):
            precompile(lambda m, x: m(x), Counter(), torch.randn(2), backend="eager")

    def test_a_default_fn_fills_in_is_refused_with_advice_that_works(self):
        class Config:
            problem_type = None

        class Classifier(nn.Module):
            """As transformers' *ForSequenceClassification: the first call with labels picks the loss."""

            def __init__(self):
                super().__init__()
                self.config, self.head = Config(), nn.Linear(4, 3)

            def forward(self, x, labels):
                if self.config.problem_type is None:
                    self.config.problem_type = "single_label_classification" if labels.dtype == torch.long else "regression"
                logits = self.head(x)
                if self.config.problem_type == "regression":
                    return F.mse_loss(logits, labels)
                return F.cross_entropy(logits, labels)

        def step(m, x, labels):
            loss = m(x, labels)
            loss.backward()
            return loss.detach()

        x, labels = torch.randn(2, 4), torch.tensor([0, 2])
        model = Classifier()
        advice = "set it before precompile (args[0].config.problem_type = 'single_label_classification')"
        with self.assertRaisesRegex(PrecompileError, re.escape(advice)):
            precompile(step, model, x, labels, backend="eager")
        fresh, reference = Classifier(), Classifier()
        reference.load_state_dict(fresh.state_dict())
        fresh.config.problem_type = "single_label_classification"  # the advice
        f = precompile.load(*precompile(step, fresh, x, labels, backend="eager"))
        torch.testing.assert_close(f(fresh, x, labels), step(reference, x, labels))
        torch.testing.assert_close(fresh.head.weight.grad, reference.head.weight.grad)
        # The refused capture left the config as it was: the advice is needed, not a second precompile.
        self.assertIsNone(model.config.problem_type)
        with self.assertRaisesRegex(PrecompileError, re.escape(advice)):
            precompile(step, model, x, labels, backend="eager")

    def test_config_writes_fn_makes_without_reading_are_refused_and_undone(self):
        config = types.SimpleNamespace(eps=1e-5, nested=types.SimpleNamespace(scale=2.0))

        class Counting(nn.Module):
            def __init__(self, write):
                super().__init__()
                self.config, self.lin, self.write = config, nn.Linear(4, 4), write

            def forward(self, x):
                self.write(self.config)
                return self.lin(x) * self.config.nested.scale + self.config.eps

        for write, message in (
            (lambda c: setattr(c, "calls", 1), r"sets args\[0\]\.config\.calls to 1"),
            (lambda c: setattr(c.nested, "seen", True), r"sets args\[0\]\.config\.nested\.seen to True"),
            (lambda c: delattr(c, "eps") or setattr(c, "eps", 1e-5), None),  # put back as it was: no change
        ):
            model, x = Counting(write), torch.randn(2, 4)
            if message is None:
                f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
                torch.testing.assert_close(f(model, x), model(x))
                continue
            with self.assertRaisesRegex(PrecompileError, r"^fn changes the modules it receives beyond their tensors' values: it " + message):
                precompile(lambda m, x: m(x), model, x, backend="eager")
            self.assertEqual(vars(config), {"eps": 1e-5, "nested": config.nested})
            self.assertEqual(vars(config.nested), {"scale": 2.0})

    def test_namespaces_and_frozen_dataclasses(self):
        """Config objects of classes that cannot be probed (SimpleNamespace) or set (frozen dataclasses)."""

        @dataclasses.dataclass(frozen=True)
        class Frozen:
            c: float = 4.0

        class Configured(nn.Module):
            def __init__(self):
                super().__init__()
                self.ns, self.frozen = types.SimpleNamespace(a=2.0, unused=0), Frozen()

            def forward(self, x):
                return x * self.ns.a * self.frozen.c

        model, x = Configured(), torch.randn(3)
        f = precompile.load(*precompile(lambda m, x: m(x), model, x, backend="eager"))
        torch.testing.assert_close(f(model, x), model(x))
        for edit, message in (
            (lambda: setattr(model.ns, "a", 5.0), r"args\[0\]\.ns\.a is 5\.0, but was 2\.0"),
            (lambda: setattr(model, "frozen", Frozen(c=1.0)), r"args\[0\]\.frozen\.c is 1\.0, but was 4\.0"),
        ):
            edit()
            with self.assertRaisesRegex(PrecompileError, message):
                f(model, x)
            model.ns.a, model.frozen = 2.0, Frozen()
            torch.testing.assert_close(f(model, x), model(x))

    def test_code_and_submodules_are_not_values(self):
        """Functions, methods, modules and loggers held as attributes are code: read freely, never guarded
        (the methods nn.Module.__call__ reads, ``forward``, are guarded absent from the instance)."""

        class Coded(nn.Module):
            def __init__(self):
                super().__init__()
                self.act = torch.tanh
                self.helpers = [torch.relu, nn.Identity()]
                self.lin = nn.Linear(4, 4)
                self.log = logging.getLogger("test_precompile_read_guards")

            def forward(self, x):
                self.log.debug("shape %s", x.shape)  # fills the logger's level cache: no value fn computes with
                return self.helpers[0](self.act(self.lin(x)))

        f = precompile.load(*precompile(lambda m, x: m(x), Coded(), torch.randn(2, 4), backend="eager"))
        self.assertEqual(f.convention.modules[0].attributes, (("", "forward", {"missing": ()}), ("lin", "forward", {"missing": ()})))


class _Decayed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        for p in self.parameters():
            p.no_wd = p.ndim == 1  # the caller's marks: no weight decay for biases and norms


def _decay_step(m, x):
    """A training step with weight decay groups inside fn, read from the parameters' own attributes."""
    loss = m.norm(m.fc(x)).square().sum()
    loss.backward()
    with torch.no_grad():
        for p in m.parameters():
            decay = 0.0 if getattr(p, "no_wd", False) else 0.1
            scale = getattr(p, "lr_scale", None)  # absent at capture
            p.sub_(0.01 * (scale or 1.0) * (p.grad + decay * p))
    return loss.detach()


def _decayed_copy(m):
    copied = copy.deepcopy(m)
    for p, q in zip(m.parameters(), copied.parameters()):
        vars(q).update(vars(p))  # Parameter's deepcopy leaves its Python attributes and .grad behind
        q.grad = None if p.grad is None else p.grad.clone()
    return copied


class TestTensorAttributes(TestCase):
    """Python attributes fn reads on its tensor arguments (``p.no_wd``), which capture's stand-ins
    lack: read from the caller's tensors, recorded and checked at every call (Note invariant 11)."""

    def check_call(self, f, m, x):
        ref = _decayed_copy(m)
        got = f(m, x)
        torch.testing.assert_close(got, _decay_step(ref, x))
        for (name, a), (_, b) in zip(_state(m), _state(ref)):
            torch.testing.assert_close(a, b, msg=name)

    def assert_refused(self, message, f, m, x):
        before = _state(m, x)
        with self.assertRaisesRegex(PrecompileError, message):
            f(m, x)
        for (name, old), (_, new) in zip(before, _state(m, x)):
            if old is None or new is None:
                self.assertIs(old, new, f"a refused call wrote {name}")
            else:
                self.assertTrue(old.equal(new), f"a refused call changed {name}")

    @parametrize("backend", BACKENDS)
    def test_tensor_attributes_fn_reads_are_honoured(self, backend):
        m, x = _Decayed(), torch.randn(3, 4)
        f = _runnable("decay", _decay_step, _Decayed(), x, backend=backend)
        for _ in range(2):
            self.check_call(f, m, x)
        lines = list(map(str, f.checks))
        self.assertIn("tensor        args[0].fc.weight.no_wd: False (a Python attribute fn read)", lines)
        self.assertIn("tensor        args[0].fc.bias.no_wd: True (a Python attribute fn read)", lines)
        self.assertIn("tensor        args[0].fc.weight.lr_scale: missing (a Python attribute fn read)", lines)

    @parametrize("backend", BACKENDS)
    def test_tensor_attribute_changed_or_deleted_after_capture_is_refused(self, backend):
        m, x = _Decayed(), torch.randn(3, 4)
        f = _runnable("decay", _decay_step, _Decayed(), x, backend=backend)
        weight, bias = m.fc.weight, m.norm.bias
        restore_bias = lambda: setattr(bias, "no_wd", True)  # noqa: E731
        for change, message, restore in (
            (
                lambda: setattr(weight, "no_wd", True),
                "args[0].fc.weight.no_wd is True, was False at capture (fn read it, so the graph follows it); "
                "set it back, or precompile again",
                lambda: setattr(weight, "no_wd", False),
            ),
            (lambda: delattr(bias, "no_wd"), "args[0].norm.bias.no_wd is missing, was True at capture", restore_bias),
            (lambda: setattr(bias, "no_wd", 1), "args[0].norm.bias.no_wd is 1, was True at capture", restore_bias),
        ):
            change()
            self.assert_refused(re.escape(message), f, m, x)
            restore()
            self.check_call(f, m, x)

    @parametrize("backend", BACKENDS)
    def test_tensor_attribute_read_absent_then_set_is_refused(self, backend):
        m, x = _Decayed(), torch.randn(3, 4)
        f = _runnable("decay", _decay_step, _Decayed(), x, backend=backend)
        m.fc.weight.lr_scale = 2.0
        self.assert_refused(re.escape("args[0].fc.weight.lr_scale is 2.0, was missing at capture"), f, m, x)
        del m.fc.weight.lr_scale
        self.check_call(f, m, x)

        def scaled(x):  # on a tensor input too
            return x * getattr(x, "scale", 1.0)

        g = precompile.load(*precompile(scaled, torch.randn(3), backend=backend))
        y = torch.randn(3)
        torch.testing.assert_close(g(y), y)
        y.scale = 3.0
        with self.assertRaisesRegex(PrecompileError, re.escape("args[0].scale is 3.0, was missing at capture")):
            g(y)

    @parametrize("backend", BACKENDS)
    def test_isinstance_parameter_on_an_input_costs_no_refusal(self, backend):
        def fn(m, x):
            y = m(x)
            return y * 2 if isinstance(x, nn.Parameter) or not isinstance(m.weight, nn.Parameter) else y + 1

        m = nn.Linear(4, 4)
        f = precompile.load(*precompile(fn, m, torch.randn(3, 4), backend=backend))
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(f(m, x), fn(m, x))
        x = torch.randn(3, 4)
        x._is_param = True  # as torch's own tracing marks a tensor: eager's isinstance then says True
        with self.assertRaisesRegex(PrecompileError, re.escape("args[1]._is_param is True, was missing at capture")):
            f(m, x)

    def test_fn_setting_or_deleting_a_tensor_attribute_is_refused_at_capture(self):
        def setting(m, x):
            m.weight.seen = True  # eager leaves it on the caller's parameter
            return m(x)

        def deleting(m, x):
            del x.tag  # eager removes it from the caller's tensor; the stand-in never had it
            return m(x)

        m, x = nn.Linear(4, 4), torch.randn(3, 4)
        x.tag = "batch"
        for fn, path in ((setting, "args[0].weight.seen"), (deleting, "args[1].tag")):
            message = f"fn sets or deletes {path}, a Python attribute of a tensor argument: eager's call changes"
            with self.assertRaisesRegex(PrecompileError, re.escape(message)):
                precompile(fn, m, x, backend="eager")
        self.assertFalse(hasattr(m.weight, "seen"))
        self.assertEqual(x.tag, "batch")

    def test_a_tensor_attribute_that_is_no_literal_is_refused_at_capture(self):
        def fn(m, x):
            group = getattr(m.weight, "group", None)
            return m(x) * (2.0 if group is not None else 1.0)

        m = nn.Linear(4, 4)
        for value, kind in ((object(), "object"), (torch.ones(1), "Tensor")):
            m.weight.group = value
            message = f"fn reads args[0].weight.group, a {kind}: a Python attribute of a tensor argument"
            with self.assertRaisesRegex(PrecompileError, re.escape(message)):
                precompile(fn, m, torch.randn(3, 4), backend="eager")


instantiate_parametrized_tests(TestReadGuards)
instantiate_parametrized_tests(TestTensorAttributes)


if __name__ == "__main__":
    run_tests()
