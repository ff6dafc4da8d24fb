# Owner(s): ["module: dynamo"]
"""Language-model inference as people write it (Note invariants 3, 5 and 10).

Hugging Face caches in and out: any class registered as a pytree node is an
input or output (transformers registers its caches with
``register_cache_pytrees_for_model``, whose flatten turns ``None`` attributes
into context); its tensors are lifted, the rest of its state is its context,
checked at every call.  A cache fn grows (``DynamicCache``: each layer's
tensors rebound) is written back into the caller's object, and a cache fn
returns is the caller's object, as in eager; a ``StaticCache`` is written in
place by the graph.  Free dims whose branches the example sizes decide (a
mask one longer than the cache) become size facts checked at every call.
torch.compile in the same process is unaffected by the package.

Tiny random Llama (2 layers x 32), compared with eager; inductor artifacts
are compiled once per process.
"""

import collections
import copy
import gc
import logging
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import weakref

import transformers
from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._dynamo.decorators import mark_unbacked
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile
from torch_precompile import _precompile_format as _format, _precompile_inspect as inspect_artifact, generation, PrecompileError
from _precompile_testing import Artifacts, load, needs_mark_bounds


logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design
BACKENDS = ("eager", "inductor")
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}
ARTIFACTS = Artifacts()
HERE = os.path.dirname(os.path.abspath(__file__))


def _config():
    return transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )


def _llama():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).eval()
    register_cache_pytrees_for_model(model)
    return model


def _prompt(batch=2, length=6, seed=0, padded=True):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:
        mask[0, : length // 3] = 0  # left padding
    return ids, mask


def _prefill(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask)


class _FlattenedNorm(torch.nn.Module):
    """A final norm, then a projection of every token's state but the first one, in one bmm over the batch
    and prompt flattened (its rows are ``batch * length - 1``)."""

    def __init__(self, norm, features):
        super().__init__()
        self.norm, self.proj = norm, torch.nn.Linear(features, features, bias=False)

    def forward(self, hidden):
        batch, length, features = hidden.shape
        flat = self.norm(hidden).reshape(1, batch * length, features)
        projected = torch.bmm(flat[:, 1:] * 2, self.proj.weight.t()[None])
        return torch.cat([flat[:, :1], projected], 1).reshape(batch, length, features)


def _decode(model, token, positions, cache):
    return model(input_ids=token, position_ids=positions, past_key_values=cache)


def _forward(model, kwargs):
    return model(**kwargs)


def _dynamic_cache(model, ids, mask):
    with torch.no_grad():
        return _prefill(model, ids, mask).past_key_values


def _static_cache(model, ids, mask):
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, past_key_values=cache)
    return cache


def _assert_same_cache(test, got, expected):
    test.assertIs(type(got), type(expected))
    test.assertEqual([type(layer) for layer in got.layers], [type(layer) for layer in expected.layers])
    for ours, theirs in zip(got.layers, expected.layers):
        for name, value in vars(theirs).items():
            if isinstance(value, torch.Tensor):
                torch.testing.assert_close(getattr(ours, name), value, **TOLERANCE)
                test.assertEqual(getattr(ours, name).stride(), value.stride(), msg=name)  # what a decode artifact checks
            else:
                test.assertEqual(getattr(ours, name), value, msg=name)


class TestCacheObjects(TestCase):
    @parametrize("backend", BACKENDS)
    def test_prefill_returns_the_model_output_and_its_cache(self, backend):
        model, (ids, mask) = _llama(), _prompt()
        runnable = load(ARTIFACTS("prefill", _prefill, model, ids, mask, backend=backend))
        for seed in range(2):
            ids, mask = _prompt(seed=seed)
            with torch.no_grad():
                ours, theirs = runnable(model, ids, mask), _prefill(model, ids, mask)
            self.assertIs(type(ours), transformers.modeling_outputs.CausalLMOutputWithPast)
            torch.testing.assert_close(ours.logits, theirs.logits, **TOLERANCE)
            _assert_same_cache(self, ours.past_key_values, theirs.past_key_values)

    @parametrize("backend", BACKENDS)
    def test_static_cache_is_written_in_place_and_returned(self, backend):
        model, (ids, mask) = _llama(), _prompt()
        cache = _static_cache(model, ids, mask)
        token, positions = ids[:, :1].contiguous(), torch.full((2, 1), 6)  # argmax's layout, as the next tokens
        runnable = load(ARTIFACTS("static_decode", _decode, model, token, positions, copy.deepcopy(cache), backend=backend))
        ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
        for step in range(3):
            positions = torch.full((2, 1), 6 + step)
            with torch.no_grad():
                out, expected = runnable(model, token, positions, ours), _decode(model, token, positions, theirs)
            torch.testing.assert_close(out.logits, expected.logits, **TOLERANCE)
            self.assertIs(out.past_key_values, ours)  # eager returns the cache it was given
            _assert_same_cache(self, ours, theirs)
            token = expected.logits[:, -1:].argmax(-1)

    def test_dynamic_cache_grown_by_the_call_is_the_callers(self):
        model, (ids, mask) = _llama(), _prompt()
        cache = _dynamic_cache(model, ids, mask)
        token, positions = ids[:, :1], torch.full((2, 1), 6)
        runnable = load(ARTIFACTS("dynamic_decode", _decode, model, token, positions, copy.deepcopy(cache), backend="eager"))
        ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
        layers = list(ours.layers)
        with torch.no_grad():
            out, expected = runnable(model, token, positions, ours), _decode(model, token, positions, theirs)
        torch.testing.assert_close(out.logits, expected.logits, **TOLERANCE)
        self.assertIs(out.past_key_values, ours)
        self.assertEqual(ours.get_seq_length(), 7)
        self.assertTrue(all(a is b for a, b in zip(ours.layers, layers)))  # updated in place, like eager
        _assert_same_cache(self, ours, theirs)
        # The grown cache no longer fits the static artifact: refused, nothing written.
        with self.assertRaisesRegex(PrecompileError, r"args\[3\]\[0\]: expected shape \(2, 2, 6, 8\), got \(2, 2, 7, 8\)"):
            runnable(model, token, positions, ours)
        self.assertEqual(ours.get_seq_length(), 7)

    @parametrize("backend", BACKENDS)
    @parametrize("name", ["sliding", "hybrid"])
    def test_sliding_window_and_hybrid_caches(self, name, backend):
        torch.manual_seed(0)
        sizes = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, sliding_window=4)
        if name == "sliding":  # every layer a sliding window
            model = transformers.MistralForCausalLM(transformers.MistralConfig(**sizes))
        else:  # sliding and full layers alternate
            model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**sizes, head_dim=8))
        model.eval()
        register_cache_pytrees_for_model(model)
        ids, mask = _prompt(length=8)
        cache = _dynamic_cache(model, ids, mask)
        layer_kinds = {"sliding": ["DynamicSlidingWindowLayer"] * 2, "hybrid": ["DynamicSlidingWindowLayer", "DynamicLayer"]}
        self.assertEqual([type(layer).__name__ for layer in cache.layers], layer_kinds[name])

        def step(model, token, cache):
            return model(input_ids=token, past_key_values=cache)

        token = ids[:, -1:].contiguous()
        runnable = load(torch_precompile.precompile(step, model, token, copy.deepcopy(cache), backend=backend))
        ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
        with torch.no_grad():
            out, expected = runnable(model, token, ours), step(model, token, theirs)
        torch.testing.assert_close(out.logits, expected.logits, **TOLERANCE)
        self.assertIs(out.past_key_values, ours)
        _assert_same_cache(self, ours, theirs)  # the window kept its length, the full layer grew

    @parametrize("backend", BACKENDS)
    def test_encoder_decoder_cache_comes_back_exactly(self, backend):
        torch.manual_seed(0)
        config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                       decoder_start_token_id=0)
        model = transformers.T5ForConditionalGeneration(config).eval()
        register_cache_pytrees_for_model(model)
        ids, mask = _prompt(length=8)

        def fn(model, ids, mask, decoder_ids):
            return model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids)

        args = (ids, mask, ids[:, :4].contiguous())
        runnable = load(torch_precompile.precompile(fn, model, *args, backend=backend))
        with torch.no_grad():
            ours, theirs = runnable(model, *args), fn(model, *args)
        torch.testing.assert_close(ours.logits, theirs.logits, **TOLERANCE)
        cache, expected = ours.past_key_values, theirs.past_key_values
        self.assertIs(type(cache), transformers.EncoderDecoderCache)
        # JSON would turn is_updated's layer indices into str: the structure is recorded exactly.
        self.assertEqual(cache.is_updated, expected.is_updated)
        self.assertEqual(pytree.tree_structure(cache), pytree.tree_structure(expected))
        for part in ("self_attention_cache", "cross_attention_cache"):
            _assert_same_cache(self, getattr(cache, part), getattr(expected, part))

    def test_cache_state_is_checked_at_every_call(self):
        model, (ids, mask) = _llama(), _prompt()
        cache = _static_cache(model, ids, mask)
        token, positions = ids[:, :1].contiguous(), torch.full((2, 1), 6)
        runnable = load(ARTIFACTS("static_decode", _decode, model, token, positions, copy.deepcopy(cache), backend="eager"))
        other = copy.deepcopy(cache)
        other.layers[1].max_cache_len = 32  # context, not a tensor: part of the checked structure
        # Named where it differs: the spec of a cache runs through every attribute of every layer.
        with self.assertRaisesRegex(
            PrecompileError,
            r"^args\[3\]: input structure differs from the captured one: args\[3\] \(StaticCache\) has 32 in its context "
            r"at \['s'\]\['layers'\]\[1\]\['s'\]\['max_cache_len'\], but 16 at capture; expected TreeSpec",
        ):
            runnable(model, token, positions, other)
        other = copy.deepcopy(cache)
        other._is_user_defined = True  # as generate() marks a cache it is given
        with self.assertRaisesRegex(
            PrecompileError, r"args\[3\] \(StaticCache\) has True in its context at \['s'\]\['_is_user_defined'\], but nothing at"
        ):
            runnable(model, token, positions, other)

    def test_unregistered_objects_are_refused_saying_how_to_register(self):
        class Holder:
            def __init__(self, t):
                self.t = t

        with self.assertRaisesRegex(
            PrecompileError,
            r"args\[1\]: unsupported leaf of type Holder; .* register it: "
            r"torch.utils._pytree.register_pytree_node\(",
        ):
            torch_precompile.precompile(lambda m, h: m(h.t), nn.Linear(2, 2), Holder(torch.randn(2)), backend="eager")
        # A transformers cache before register_cache_pytrees_for_model (a fresh process: registration is global).
        script = textwrap.dedent(
            """
            import torch, transformers, torch_precompile
            torch.manual_seed(0)
            config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
            model = transformers.LlamaForCausalLM(config).eval()
            try:
                torch_precompile.precompile(lambda m, i: m(input_ids=i), model, torch.ones(1, 4, dtype=torch.long),
                                            backend="eager")
            except torch_precompile.PrecompileError as error:
                print(error)
            """
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=HERE, timeout=300)
        self.assertIn(
            "fn's output leaf 1: unsupported leaf of type DynamicCache; outputs must be pytrees of tensors, int, "
            "float, bool, str or None. DynamicCache is a transformers cache, not registered as a pytree node: call "
            "transformers.exporters.exporter_dynamo.register_cache_pytrees_for_model(model)",
            result.stdout,
            msg=result.stderr[-2000:],
        )


class NoneInContext:
    """A node whose flatten turns None attributes into context, as transformers' caches do."""

    def __init__(self, a, b=None):
        self.a, self.b = a, b


def _flatten_none_in_context(node):
    children = [v for v in (node.a, node.b) if v is not None]
    return children, (node.b is None)


def _unflatten_none_in_context(children, b_is_none):
    return NoneInContext(children[0], None if b_is_none else children[1])


pytree.register_pytree_node(
    NoneInContext,
    _flatten_none_in_context,
    _unflatten_none_in_context,
    serialized_type_name=f"{__name__}.NoneInContext",
    flatten_with_keys_fn=lambda node: (
        [(pytree.GetAttrKey(k), v) for k, v in (("a", node.a), ("b", node.b)) if v is not None],
        node.b is None,
    ),
)


class DisagreeingKeys:
    def __init__(self, a, b):
        self.a, self.b = a, b


pytree.register_pytree_node(
    DisagreeingKeys,
    lambda node: ([node.a, node.b], None),
    lambda children, _: DisagreeingKeys(*children),
    serialized_type_name=f"{__name__}.DisagreeingKeys",
    flatten_with_keys_fn=lambda node: ([(pytree.GetAttrKey("a"), node.a)], None),
)


class TestInputTrees(TestCase):
    def test_leaf_paths_come_from_the_tree_itself(self):
        model = nn.Linear(4, 4)
        node = NoneInContext(torch.randn(4))
        runnable = load(torch_precompile.precompile(lambda m, n: m(n.a), model, node, backend="eager"))
        torch.testing.assert_close(runnable(model, NoneInContext(torch.ones(4))), model(torch.ones(4)))
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]\.a: expected shape \(4,\), got \(3,\)"):
            runnable(model, NoneInContext(torch.ones(3)))

    def test_non_dense_inputs_keep_their_layout(self):
        torch.manual_seed(0)
        model, wide = nn.Linear(4, 4), torch.randn(3, 6)
        x = wide[:, 1:5]  # strides (6, 1): Inductor must compile for these, not a contiguous copy's
        runnable = load(torch_precompile.precompile(lambda m, x: m(x) * 2, model, x, backend="inductor"))
        with torch.no_grad():
            torch.testing.assert_close(runnable(model, x), model(x) * 2)
            other = torch.randn(3, 6)[:, 2:]
            torch.testing.assert_close(runnable(model, other), model(other) * 2)
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected strides \(6, 1\), got \(4, 1\)"):
            runnable(model, torch.randn(3, 4))
        with self.assertRaisesRegex(
            PrecompileError, r"args\[1\] has elements sharing memory \(strides \(0, 1\) for shape \(3, 4\)"
        ):
            torch_precompile.precompile(lambda m, x: m(x), model, torch.randn(4).expand(3, 4), backend="inductor")

    def test_disagreeing_flattens_are_refused_naming_the_type(self):
        with self.assertRaisesRegex(
            PrecompileError,
            rf"args\[1\] holds a {re.escape(__name__)}.DisagreeingKeys, whose pytree registration flattens it to "
            r"2 leaves without keys but 1 with keys",
        ):
            torch_precompile.precompile(
                lambda m, n: m(n.a + n.b), nn.Linear(4, 4), DisagreeingKeys(torch.randn(4), torch.randn(4)),
                backend="eager",
            )

    @parametrize("backend", BACKENDS)
    def test_input_objects_fn_changes_are_written_back(self, backend):
        model = nn.Linear(4, 4)

        def fn(model, history, state):
            history.append(model(history[-1]))
            state["steps"] = state["steps"] + 1
            state["last"] = history[-1]
            return history[-1].sum()

        x = torch.randn(4)
        runnable = load(torch_precompile.precompile(fn, model, [x], {"steps": 0, "last": x}, backend=backend))
        ours, theirs = ([x], {"steps": 0, "last": x}), ([x], {"steps": 0, "last": x})
        history = ours[0]
        with torch.no_grad():
            torch.testing.assert_close(runnable(model, *ours), fn(model, *theirs))
        self.assertIs(ours[0], history)
        self.assertEqual(len(ours[0]), 2)
        self.assertEqual(ours[1]["steps"], 1)
        torch.testing.assert_close(ours[0][1], theirs[0][1])
        self.assertIs(ours[1]["last"], ours[0][1])
        # The caller's objects now differ from the capture's: refused, nothing written.
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: input structure differs from the captured one"):
            runnable(model, *ours)
        self.assertEqual(len(ours[0]), 2)

    @parametrize("backend", BACKENDS)
    def test_a_container_at_two_places_is_refused_where_fn_changes_inputs(self, backend):
        """fn changes an input object: each argument is rebuilt from its pytree, so one list,
        dict or node object at two places would be two; refused at capture and at a call."""
        model = nn.Linear(4, 4)
        x, shared, inner, box = torch.zeros(2), [torch.zeros(2)], [torch.zeros(2)], _Box(torch.randn(4))
        refused_at_capture = (
            (_bump_first_read_second, (shared, shared), r"args\[1\] is args\[0\] \(one list\)"),
            (_append_and_count, (shared, shared), r"args\[1\] is args\[0\] \(one list\)"),
            (_append_to_first_read_second, ([inner, inner],), r"args\[0\]\[1\] is args\[0\]\[0\] \(one list\)"),
            (_advance_first_read_second, (model, box, box), r"args\[2\] is args\[1\] \(one _Box\)"),
        )
        for fn, example, where in refused_at_capture:
            with self.subTest(fn.__name__), self.assertRaisesRegex(
                PrecompileError, where + r", and fn changes an input object beyond its tensors' values: a change "
                r"through one place would not reach the other as in eager. Pass distinct objects there"
            ):
                torch_precompile.precompile(fn, *example, backend=backend)
        self.assertEqual((len(shared), len(inner)), (1, 1))
        torch.testing.assert_close(shared[0], x)  # capture changed nothing
        # Captured with distinct objects: a caller passing one object twice is refused, nothing changed.
        first = load(ARTIFACTS("bump_first", _bump_first_read_second, [x], [x.clone()], backend=backend))
        nested = load(ARTIFACTS("append_first", _append_to_first_read_second, [[x], [x.clone()]], backend=backend))
        boxes = load(ARTIFACTS("advance_first", _advance_first_read_second, model, _Box(torch.randn(4)),
                               _Box(torch.randn(4)), backend=backend))
        a, b = _Box(torch.randn(4)), _Box(torch.randn(4))
        with torch.no_grad():
            for _ in range(2):  # args[1] as the first call wrote it: still checked against args[2]
                torch.testing.assert_close(boxes(model, a, b), b.t.sum())
        calls = (
            (lambda: first(shared, shared), r"args\[1\] is args\[0\] \(one list\)", shared),
            (lambda: nested([inner, inner]), r"args\[0\]\[1\] is args\[0\]\[0\] \(one list\)", inner),
            (lambda: boxes(model, a, a), r"args\[2\] is args\[1\] \(one _Box\)", a),
        )
        for call, where, argument in calls:
            before = copy.copy(vars(argument) if isinstance(argument, _Box) else argument)
            with self.assertRaisesRegex(PrecompileError, where + r", but they were distinct objects at capture, and fn changes"):
                call()
            after = vars(argument) if isinstance(argument, _Box) else argument
            self.assertEqual(len(after), len(before))
            for key in before if isinstance(before, dict) else range(len(before)):
                self.assertIs(after[key], before[key])
        # fn changing no input object: one list at two places is only read, as in eager.
        read = load(ARTIFACTS("add_firsts", _add_firsts, shared, shared, backend=backend))
        torch.testing.assert_close(read(shared, shared), _add_firsts(shared, shared))

    def test_an_input_that_cannot_be_written_back_is_refused(self):
        def fn(model, pair):
            pair[1].append(model(pair[0]))
            return pair[1][-1]

        # The list inside the tuple is updated in place: honoured.
        x = torch.randn(4)
        model = nn.Linear(4, 4)
        ours = (x, [])
        runnable = load(torch_precompile.precompile(fn, model, (x, []), backend="eager"))
        with torch.no_grad():
            out = runnable(model, ours)
        self.assertEqual(len(ours[1]), 1)
        self.assertIs(ours[1][0], out)

        class Slotted:
            __slots__ = ("t",)

        pytree.register_pytree_node(
            Slotted, lambda s: ([s.t], None), lambda c, _: _slotted(Slotted, c[0]),
            serialized_type_name=f"{__name__}.Slotted",
        )

        def rebinds(model, s):
            s.t = model(s.t)
            return s.t

        with self.assertRaisesRegex(
            PrecompileError, r"fn changes args\[1\] \(a .*Slotted\) in place beyond its tensors' values"
        ):
            torch_precompile.precompile(rebinds, model, _slotted(Slotted, x), backend="eager")


class _Box:
    """A pytree node (its ``steps`` the context) whose flattens are counted."""

    flattens = 0

    def __init__(self, t, steps=0):
        self.t, self.steps = t, steps


def _flatten_box(box):
    _Box.flattens += 1
    order = vars(box).get("order")
    return [box.t], (box.steps, None if order is None else tuple(order.items()))


def _unflatten_box(leaves, context):
    box = _Box(leaves[0], context[0])
    if context[1] is not None:
        box.order = collections.OrderedDict(context[1])
    return box


pytree.register_pytree_node(_Box, _flatten_box, _unflatten_box, serialized_type_name=f"{__name__}._Box")


class _UnregisteredBox(_Box):
    """Not a pytree node: a leaf."""


def _advance(model, box):
    box.t = model(box.t)  # rebinds the tensor, leaves the structure as it was
    return box.t.sum()


def _bump_first_read_second(a, b):
    a[0] = a[0] + 1  # rebinds an element of the caller's list
    return b[0] * 2


def _append_and_count(a, b):
    a.append(a[0] * 2)
    return len(b)


def _append_to_first_read_second(pair):
    pair[0].append(pair[0][0] + 1)
    return pair[1][-1]


def _advance_first_read_second(model, a, b):
    a.t = model(a.t)
    return b.t.sum()


def _add_firsts(a, b):
    return a[0] + b[0]


class TestArgumentsLeftAsWritten(TestCase):
    """An argument fn rebinds tensors of, its structure unchanged: the call writes each new
    tensor where the old one sat, and the next call that finds it as that write left it does
    not flatten it again (Note invariant 5).  Whatever the caller changed in between is seen."""

    def test_an_unchanged_argument_is_read_where_the_last_call_wrote(self):
        model, x = nn.Linear(4, 4), torch.randn(2, 4)
        runnable = load(ARTIFACTS("advance", _advance, model, _Box(x), backend="eager"))
        ours, theirs = _Box(x), _Box(x)

        def call_both():
            with torch.no_grad():
                torch.testing.assert_close(runnable(model, ours), _advance(model, theirs))
            torch.testing.assert_close(ours.t, theirs.t)

        call_both()
        flattens = _Box.flattens
        call_both()
        call_both()
        self.assertEqual(_Box.flattens, flattens)  # found as written: not flattened
        changes = {
            "tensor rebound": lambda box, t: setattr(box, "t", t),
            "__dict__ replaced": lambda box, t: setattr(box, "__dict__", {"t": t, "steps": 0}),
        }
        for what, change in changes.items():
            with self.subTest(what):
                t = torch.randn(2, 4)
                change(ours, t)
                change(theirs, t.clone())
                call_both()
                self.assertEqual(_Box.flattens, flattens + 1)  # changed since: flattened again
                flattens = _Box.flattens
        refused = {  # structures the artifact was not captured with: a context, a class
            "steps changed": lambda box: setattr(box, "steps", 1),
            "class changed": lambda box: setattr(box, "__class__", _UnregisteredBox),
        }
        for what, change in refused.items():
            with self.subTest(what):
                before = ours.t
                change(ours)
                with self.assertRaisesRegex(PrecompileError, r"args\[1\]: input structure differs from the captured one"):
                    runnable(model, ours)
                self.assertIs(ours.t, before)  # refused before anything was written
                ours.__class__, ours.steps = _Box, 0
                call_both()  # watched again from here

    def test_a_reordered_ordered_dict_is_seen(self):
        model, x = nn.Linear(4, 4), torch.randn(2, 4)

        def box():
            box = _Box(x)
            box.order = collections.OrderedDict(a=1, b=2)  # its order is in the box's context
            return box

        runnable = load(ARTIFACTS("advance_ordered", _advance, model, box(), backend="eager"))
        ours = box()
        with torch.no_grad():
            runnable(model, ours)
            runnable(model, ours)
        ours.order.move_to_end("a")  # moves no dict version: an OrderedDict is never taken as unchanged
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: input structure differs from the captured one"):
            runnable(model, ours)

    def test_an_argument_the_caller_dropped_is_not_kept(self):
        model, x = nn.Linear(4, 4), torch.randn(2, 4)
        runnable = load(ARTIFACTS("advance", _advance, model, _Box(x), backend="eager"))
        box = _Box(x)
        with torch.no_grad():
            runnable(model, box)
            runnable(model, box)
        dead_box, dead_tensor = weakref.ref(box), weakref.ref(box.t)
        del box
        gc.collect()
        self.assertIsNone(dead_box())
        self.assertIsNone(dead_tensor())  # the tensors the last call wrote are released too

    @needs_mark_bounds
    def test_a_dynamic_cache_changed_between_decode_steps(self):
        """generate() with the caller changing the cache between steps: the tokens are eager's, and
        the last step's tensors are in the layer objects the cache holds then."""
        model, runnables = _served("dynamic")
        ids, mask = _prompt()
        changes = {
            "layer replaced": lambda cache: cache.layers.__setitem__(0, copy.deepcopy(cache.layers[0])),
            "keys rebound": lambda cache: setattr(cache.layers[1], "keys", cache.layers[1].keys.clone()),
            "layer __dict__ replaced": lambda cache: setattr(cache.layers[1], "__dict__", dict(vars(cache.layers[1]))),
        }
        for what, change in changes.items():
            with self.subTest(what):
                seen = []

                def decode(model, kwargs, cache):
                    seen.append(cache)
                    if len(seen) == 3:
                        change(cache)
                    return runnables["decode"](model, kwargs, cache)

                expected = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
                with generation.serving(model, {"prefill": runnables["prefill"], "decode": decode}):
                    tokens = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
                self.assertEqual(tokens.tolist(), expected.tolist())
                cache = seen[-1]
                self.assertTrue(all(c is cache for c in seen))
                self.assertEqual([layer.keys.shape[2] for layer in cache.layers], [ids.shape[1] + 5] * 2)


def _slotted(cls, t):
    s = cls()
    s.t = t
    return s


def _decode_kwargs(token, cache, mask):
    # In the order generate() passes them: fn's model(**kwargs) observes it.
    return {"input_ids": token, "past_key_values": cache, "attention_mask": mask, "use_cache": True}


class TestSizeFacts(TestCase):
    """Decode with a DynamicCache: the kv length is free, the mask one longer than it."""

    def _decode_artifact(self, model, cache, mask):
        kwargs = _decode_kwargs(torch.ones(2, 1, dtype=torch.long), copy.deepcopy(cache), mask.clone())
        for layer in kwargs["past_key_values"].layers:
            for tensor in (layer.keys, layer.values):
                mark_unbacked(tensor, 2, shape_id="kv", min=1, max=60)
        mark_unbacked(kwargs["attention_mask"], 1, min=2, max=61)
        return ARTIFACTS("free_decode", _forward, model, kwargs, backend="inductor")

    @needs_mark_bounds
    def test_decode_with_free_kv_length(self):
        model, (ids, mask) = _llama(), _prompt()
        cache = _dynamic_cache(model, ids, mask)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        pair = self._decode_artifact(model, cache, mask)
        runnable = load(pair)
        facts = runnable.convention.size_facts
        self.assertTrue(facts and all("masking_utils.py" in fact.where for fact in facts), facts)
        listed = inspect_artifact.describe(*pair)["size_facts"]  # the inspector lists them, named
        self.assertEqual(len(listed), len(facts))
        self.assertRegex(listed[0], r"\(args\[1\]\['attention_mask'\] dim 1\).* at .*masking_utils.py:\d+")
        ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
        token = ids[:, -1:].contiguous()
        for step in range(4):
            with torch.no_grad():
                out = runnable(model, _decode_kwargs(token, ours, mask))
                expected = _forward(model, _decode_kwargs(token, theirs, mask))
            torch.testing.assert_close(out.logits, expected.logits, **TOLERANCE)
            self.assertIs(out.past_key_values, ours)
            _assert_same_cache(self, ours, theirs)
            token = expected.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        # A mask two longer than the cache breaks a fact the graph took from the example: refused.
        too_long = torch.ones(2, ours.get_seq_length() + 2, dtype=torch.long)
        with self.assertRaisesRegex(
            PrecompileError,
            r"the captured graph requires .*\(args\[1\]\['attention_mask'\] dim 1\).*decided by the example "
            r"inputs at .*masking_utils.py:\d+ .*but args\[1\]\['past_key_values'\]\[\d+\] dim 2 is 10, "
            r"args\[1\]\['attention_mask'\] dim 1 is 12",
        ):
            runnable(model, _decode_kwargs(token, ours, too_long))
        self.assertEqual(ours.get_seq_length(), 10)


_COMPILE_COUNT = textwrap.dedent(
    """
    import sys, torch, transformers
    use_package = sys.argv[1] == "1"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 100, (1, 8))
    if use_package:
        import torch_precompile
        pair = torch_precompile.precompile(lambda m, i: m(input_ids=i, use_cache=False).logits, model, ids,
                                           backend="eager")
        torch_precompile.load(*pair)(model, ids)
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        for _ in range(12):
            compiled(input_ids=ids, use_cache=False)
    print("graphs", counter.frame_count, "recompiles", sum(counters["recompiles"].values()))
    """
)


class TestTorchCompileCoexists(TestCase):
    def test_torch_compile_compiles_as_often_with_the_package_used(self):
        runs = [
            subprocess.run([sys.executable, "-c", _COMPILE_COUNT, flag], capture_output=True, text=True, cwd=HERE,
                           timeout=600)
            for flag in ("0", "1")
        ]
        lines = [run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:] for run in runs]
        self.assertEqual(lines[0], "graphs 1 recompiles 0")
        self.assertEqual(lines[1], lines[0])

    def test_a_submodule_replaced_inside_torch_compile_is_seen(self):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        x = torch.randn(3, 4)
        runnable = load(torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager"))
        runnable(model, x)  # the module cache is built and armed

        @torch.compile(backend="eager")
        def replace(model, x):
            model[2] = nn.Linear(4, 2)  # Dynamo replays this as a write into _modules
            return x + 1

        replace(model, x)
        torch.testing.assert_close(runnable(model, x), model(x))


class TestCaptureLeavesTheModel(TestCase):
    def test_hidden_states_hooks_are_removed_when_capture_refuses(self):
        # transformers registers output-capturing forward hooks on the layers and sets a flag at the
        # first call asking for hidden states: a refused capture must not leave them on the model.
        model, (ids, _) = _llama(), _prompt()
        pair = torch_precompile.precompile(lambda m, i: m(input_ids=i).logits, model, ids, backend="eager")
        logits = load(pair)
        # transformers' classes: the artifact carries the driver part naming its hooks' fixes.
        self.assertEqual(_format.driver_parts(_format._read_convention(pair[0])), ("library_hooks",))
        alone = {}
        exec(pair[0], alone)  # the embedded driver, run by the second refusal below
        with self.assertRaisesRegex(PrecompileError, r"fn changes args\[0\]\.model\._output_capturing_hooks_installed"):
            torch_precompile.precompile(lambda m, i: m(input_ids=i, output_hidden_states=True), model, ids, backend="eager")
        self.assertNotIn("_output_capturing_hooks_installed", vars(model.model))
        self.assertEqual(sum(len(sub._forward_hooks) for sub in model.modules()), 0)
        with torch.no_grad():
            torch.testing.assert_close(logits(model, ids), model(input_ids=ids).logits)
        # Hooks the model installed in an eager call are named by the refusal, with the way to take them off,
        # after which the artifact and eager's hidden states work again.
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        with self.assertRaisesRegex(
            PrecompileError,
            r"args\[0\]\.model\.\S+ has a forward hook \(transformers\.utils\.output_capturing\.\S+\), which was not there"
            r".*transformers' output capturing installed it .* Take these hooks off: .*README, 'Hooks transformers installs'",
        ):
            logits(model, ids)
        with self.assertRaisesRegex(PrecompileError, r"transformers' output capturing installed it .* Take these hooks off"):
            alone["forward"](model, ids)
        _take_off_output_capturing(model)
        with torch.no_grad():
            torch.testing.assert_close(logits(model, ids), model(input_ids=ids).logits)
            for mine, eager in zip(model(input_ids=ids, output_hidden_states=True).hidden_states, hidden, strict=True):
                torch.testing.assert_close(mine, eager)

    def test_asking_for_hidden_states_is_refused_naming_a_way_through(self):
        model, (ids, _) = _llama(), _prompt()
        fn = lambda m, i: m(input_ids=i, output_hidden_states=True).hidden_states[-1]  # noqa: E731
        way = r"precompile cannot capture that: take the last hidden state from the base model \(model\.base_model"
        first = r"_output_capturing_hooks_installed \(from missing to True\); transformers sets it .*"
        with self.assertRaisesRegex(PrecompileError, first + way):
            torch_precompile.precompile(fn, model, ids, backend="eager")
        with torch.no_grad():
            last = fn(model, ids)  # the hooks are on the model now
        hooked = r"output_capturing_hook\): .*fn itself asking for them cannot be precompiled: take the last"
        with self.assertRaisesRegex(PrecompileError, hooked):
            torch_precompile.precompile(fn, model, ids, backend="eager")
        _take_off_output_capturing(model)
        base_fn = lambda m, i: m.base_model(input_ids=i).last_hidden_state  # noqa: E731
        base = load(torch_precompile.precompile(base_fn, model, ids, backend="eager"))
        with torch.no_grad():
            torch.testing.assert_close(base(model, ids), last)

    def test_gradient_checkpointing_hook_refusal_names_its_fix(self):
        model, (ids, mask) = _llama(), _prompt()
        model.train()
        reference = copy.deepcopy(model)
        model.gradient_checkpointing_enable()
        reference.gradient_checkpointing_enable()  # keeps transformers' hook

        def step(m, ids, mask):
            loss = m(input_ids=ids, attention_mask=mask, labels=ids).loss
            loss.backward()
            return loss.detach()

        with self.assertRaisesRegex(
            PrecompileError,
            r"make_inputs_require_grads\): .*gradient_checkpointing_enable\(\) registered it .*"
            r"call model\.disable_input_require_grads\(\)",
        ):
            torch_precompile.precompile(step, model, ids, mask, backend="eager")
        model.disable_input_require_grads()
        runnable = load(torch_precompile.precompile(step, model, ids, mask, backend="eager"))
        torch.testing.assert_close(runnable(model, ids, mask), step(reference, ids, mask))
        for mine, eager in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(mine.grad, eager.grad)


def _take_off_output_capturing(model):
    """README's way of taking transformers' output-capturing hooks and flag off a model."""
    for m in model.modules():
        for key, hook in list(m._forward_hooks.items()):
            if hook.__name__ == "output_capturing_hook":
                del m._forward_hooks[key]
        vars(m).pop("_output_capturing_hooks_installed", None)


_GENERATED: dict = {}


def _served(cache_kind: str):
    """(model, runnables) for generate() with a DynamicCache or a StaticCache, saved and loaded once."""
    if cache_kind not in _GENERATED:
        model, (ids, mask) = _llama(), _prompt()
        extra = {"past_key_values": _fresh_static_cache(model)} if cache_kind == "static" else {}
        pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False, **extra)
        with tempfile.TemporaryDirectory() as directory:
            generation.save(pairs, directory)
            self_check = sorted(os.listdir(directory))
            assert self_check == ["decode.cache", "decode.py", "prefill.cache", "prefill.py"], self_check
            _GENERATED[cache_kind] = (model, generation.load(directory, model))
    return _GENERATED[cache_kind]


def _fresh_static_cache(model):
    return transformers.StaticCache(config=model.config, max_cache_len=32)


class TestGenerate(TestCase):
    """generate() with the model's forward served by precompiled prefill and decode artifacts."""

    def _assert_same_tokens(self, model, runnables, ids, mask, cache_kind="dynamic", **options):
        def generate():
            extra = {"past_key_values": _fresh_static_cache(model)} if cache_kind == "static" else {}
            torch.manual_seed(11)
            return model.generate(ids, attention_mask=mask, max_new_tokens=12, **options, **extra)

        expected = generate()
        with generation.serving(model, runnables):
            tokens = generate()
        self.assertEqual(tokens.tolist(), expected.tolist())
        self.assertNotIn("forward", vars(model))  # serving() restored the model

    @needs_mark_bounds
    def test_dynamic_cache_greedy_and_sampling_any_batch_and_prompt(self):
        model, runnables = _served("dynamic")
        sampling = {"do_sample": True, "top_k": 20}
        for batch, length, options in [(2, 6, {}), (3, 11, {}), (1, 4, {}), (4, 5, sampling)]:
            with self.subTest(batch=batch, length=length, **options):
                ids, mask = _prompt(batch, length, seed=batch)
                self._assert_same_tokens(model, runnables, ids, mask, **({"do_sample": False} | options))

    @needs_mark_bounds
    def test_unpadded_requests_on_artifacts_recorded_padded(self):
        # generate() drops an all-ones mask before calling forward: serving() passes it back, as
        # the artifacts recorded on a left-padded batch take it (a batch-1 prompt is unpadded).
        model, runnables = _served("dynamic")
        for batch, length in [(1, 5), (3, 7)]:
            with self.subTest(batch=batch, length=length):
                ids, mask = _prompt(batch, length, seed=batch, padded=False)
                self._assert_same_tokens(model, runnables, ids, mask, do_sample=False)

    def test_artifacts_recorded_without_a_mask(self):
        # Artifacts from before the mask was recorded whatever the padding: unpadded requests are
        # served; a padded one is refused naming what generate() passed and what they were recorded with.
        model, (ids, mask) = _llama(), _prompt(padded=False)
        recorded = generation.record_forward_calls(model, ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
        runnables = {}
        for phase, kwargs in recorded.items():
            del kwargs["attention_mask"]
            cache = kwargs.pop("past_key_values")
            runnables[phase] = load(torch_precompile.precompile(generation._call_forward, model, kwargs, cache, backend="eager"))
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
        with generation.serving(model, runnables):
            self.assertEqual(model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False).tolist(), expected.tolist())
            with self.assertRaisesRegex(
                PrecompileError,
                r"^generation\.serving: generate\(\) passed the prefill call the keyword arguments \['input_ids', "
                r"'position_ids', 'attention_mask', .*\], but the prefill artifact was recorded with \['input_ids', "
                r"'position_ids', 'logits_to_keep', .*\]: generate\(\) passes an attention_mask only for a padded prompt "
                r"\(it drops an all-ones one\); these artifacts were recorded without a mask .* precompile_generate again",
            ):
                model.generate(ids, attention_mask=_prompt()[1], max_new_tokens=2, do_sample=False)

    @needs_mark_bounds
    def test_a_prompt_outside_the_size_facts_is_refused(self):
        # A one-token prompt with the prefill's arguments.
        model, runnables = _served("dynamic")
        ids, mask = _prompt(2, 6)
        kwargs = generation.record_forward_calls(model, ids, attention_mask=mask, max_new_tokens=2, do_sample=False)["prefill"]
        cache = kwargs.pop("past_key_values")
        for name in ("input_ids", "attention_mask", "position_ids"):
            kwargs[name] = kwargs[name][:, -1:].contiguous()
        with self.assertRaisesRegex(
            PrecompileError,
            r"the captured graph requires \(args\[1\]\['(input_ids|attention_mask|position_ids)'\] dim 1\) - 1 > 0, "
            r"decided by the example inputs at .*sdpa_attention.py:\d+ .*q_length > 1",
        ):
            runnables["prefill"](model, kwargs, cache)

    @needs_mark_bounds
    def test_left_padding_with_absolute_positions(self):
        # generate() passes position_ids made from the mask only to a forward whose signature
        # takes them; GPT-2 adds learned absolute position embeddings, so the left-padded row's
        # tokens differed where the recorded and served forward hid the model's signature.
        # Recorded on an unpadded prompt, whose all-ones mask generate() drops: recorded as a
        # mask all the same, so left-padded requests are served too.
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
            pad_token_id=0, initializer_range=0.5,
        )
        model = transformers.GPT2LMHeadModel(config).eval()
        ids, mask = _prompt(padded=False)
        pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
        runnables = {phase: torch_precompile.load(*pair) for phase, pair in pairs.items()}
        for padded in (True, False):
            with self.subTest(padded=padded):
                self._assert_same_tokens(model, runnables, *_prompt(3, 7, padded=padded), do_sample=False)

    def test_static_cache(self):
        model, runnables = _served("static")
        for length in (6, 9):
            with self.subTest(length=length):
                ids, mask = _prompt(2, length, seed=length)
                self._assert_same_tokens(model, runnables, ids, mask, cache_kind="static", do_sample=False)
        # Allocated for batch 2: another batch is refused naming the batch sizes, not computed (the artifact's
        # own refusal named a shape and told to mark_unbacked, which serving's marks are not the caller's to do).
        ids, mask = _prompt(3, 6)
        with generation.serving(model, runnables), self.assertRaisesRegex(
            PrecompileError,
            r"^generation\.serving: generate\(\) passed the prefill call a batch of 3, but the prefill artifact was "
            r"recorded for a batch of 2 \(a StaticCache keeps the batch size it was allocated for\): serve batches of 2, "
            r"or precompile_generate again with a batch of 3$",
        ):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, past_key_values=_fresh_static_cache(model))
        # A generation longer than the cache: eager raises IndexError at the write past its end, where Inductor's
        # kernel would abort the process: refused before that call.
        ids, mask = _prompt()
        with generation.serving(model, runnables), self.assertRaisesRegex(
            PrecompileError,
            r"^generation\.serving: the decode call has a sequence of 33 tokens \(32 in the cache and 1 new\), more than its "
            r"StaticCache holds \(32, its max_cache_len\): give generate\(\) a larger cache, or fewer new tokens",
        ):
            model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, past_key_values=_fresh_static_cache(model))
        # Reused after reset(), as eager serves requests, a StaticCache keeps its tensors where the prefill was
        # recorded with a new one: refused naming that, before the artifact's structure check, nothing changed.
        ids, mask = _prompt()
        cache = _fresh_static_cache(model)
        model.generate(ids, attention_mask=mask, max_new_tokens=2, past_key_values=cache)
        cache.reset()
        before = copy.deepcopy(cache)
        with generation.serving(model, runnables), self.assertRaisesRegex(
            PrecompileError,
            r"^generation\.serving: generate\(\) passed the prefill call a StaticCache used before \(reset\(\) keeps its "
            r"tensors\), but the prefill artifact was recorded with one new \(its tensors not yet allocated\): pass generate\(\) "
            r"a StaticCache as the recorded one",
        ):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, past_key_values=cache)
        _assert_same_cache(self, cache, before)
        # An unpadded prompt's prefill gets no mask, where the recorded one had generate()'s 4-D mask.
        ids, mask = _prompt(2, 6, padded=False)
        with generation.serving(model, runnables), self.assertRaisesRegex(
            PrecompileError,
            r"^generation\.serving: generate\(\) passed the prefill call the keyword arguments \['input_ids', "
            r"'position_ids', 'logits_to_keep', .*\], but the prefill artifact was recorded with \['input_ids', "
            r"'position_ids', 'attention_mask', .*\]: .* with a StaticCache generate\(\) passes the 4-D mask it builds",
        ):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, past_key_values=_fresh_static_cache(model))

    def test_static_cache_masks_by_layer_kind_take_any_prompt_length(self):
        # A model with config.layer_types (as Qwen3 has) gets generate()'s 4-D masks as a dict by layer
        # kind; their prompt dim was left specialized, so a prompt of another length was refused.
        torch.manual_seed(0)
        config = transformers.Qwen3Config(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, head_dim=8,
        )
        model = transformers.Qwen3ForCausalLM(config).eval()
        ids, mask = _prompt()
        cache = transformers.StaticCache(config=config, max_cache_len=32)
        pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False, past_key_values=cache)
        runnables = {phase: torch_precompile.load(*pair) for phase, pair in pairs.items()}
        for length in (6, 9):
            with self.subTest(length=length):
                ids, mask = _prompt(2, length, seed=length)
                self._assert_same_tokens(model, runnables, ids, mask, cache_kind="static", do_sample=False)

    @needs_mark_bounds
    def test_a_static_cache_bounds_the_lengths_by_its_max_cache_len(self):
        # GPT-Neo slices its causal-mask table at cache_length - prompt: bounded by max_position_embeddings
        # (64), past the 32 the cache holds, the slice's start could be negative and the trace refused it.
        torch.manual_seed(0)
        config = transformers.GPTNeoConfig(
            vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
            attention_types=[[["global"], 2]],
        )
        model, (ids, mask) = transformers.GPTNeoForCausalLM(config).eval(), _prompt()
        cache = transformers.StaticCache(config=config, max_cache_len=32)
        pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False, past_key_values=cache)
        runnables = {phase: torch_precompile.load(*pair) for phase, pair in pairs.items()}
        highs = {free[3] for leaf in runnables["prefill"].convention.inputs if leaf.tensor for free in leaf.tensor.free_dims}
        self.assertEqual(highs, {32})  # the prompt's bound: the cache's max_cache_len
        for length in (6, 9):
            with self.subTest(length=length):
                ids, mask = _prompt(2, length, seed=length)
                self._assert_same_tokens(model, runnables, ids, mask, cache_kind="static", do_sample=False)

    @needs_mark_bounds
    def test_a_cache_the_caller_passes_is_served(self):
        # generate() marks a cache it is given (_is_user_defined), which the recorded one it made lacked and
        # only generate() reads: served as recorded, the caller's cache keeps its mark and holds eager's tensors.
        model, runnables = _served("dynamic")
        ids, mask = _prompt()

        def generate():
            cache = transformers.DynamicCache(config=model.config)
            return model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, past_key_values=cache), cache

        expected, theirs = generate()
        with generation.serving(model, runnables):
            tokens, ours = generate()
        self.assertEqual(tokens.tolist(), expected.tolist())
        self.assertIs(ours._is_user_defined, True)
        _assert_same_cache(self, ours, theirs)

    @needs_mark_bounds
    def test_a_refused_call_leaves_the_callers_cache_as_passed(self):
        # serving() makes the cache's tensors contiguous in place for the artifact: put back when it refuses.
        model, runnables = _served("dynamic")
        ids, mask = _prompt()
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, past_key_values=cache)
        cache.crop(-1)  # a rolled-back token: each layer's keys and values are slices
        tensors = [(layer.keys, layer.values) for layer in cache.layers]
        self.assertFalse(tensors[0][0].is_contiguous())
        more = torch.cat([ids[:, :5], ids[:, :3]], 1)  # three new tokens for the decode artifact, made for one
        with generation.serving(model, runnables), self.assertRaisesRegex(
            PrecompileError, r"args\[1\]\['input_ids'\]: expected shape \(\*, 1\), got \(2, 3\)"
        ):
            model.generate(more, attention_mask=torch.ones_like(more), max_new_tokens=2, do_sample=False, past_key_values=cache)
        for layer, (keys, values) in zip(cache.layers, tensors, strict=True):
            self.assertIs(layer.keys, keys)
            self.assertIs(layer.values, values)

    def test_another_kind_of_cache_is_refused_naming_generates_options(self):
        # Refused by serving() before the artifact's structure check, which would name a tree spec.
        model, runnables = _served("dynamic")
        ids, mask = _prompt()
        for options, passed in (({"use_cache": False}, r"None \(no cache\)"), ({"cache_implementation": "static"}, "a StaticCache")):
            with self.subTest(**options), generation.serving(model, runnables), self.assertRaisesRegex(
                PrecompileError,
                rf"^generation\.serving: generate\(\) passed the prefill call {passed} as past_key_values, but the prefill "
                r"artifact was recorded with a DynamicCache: call generate\(\) with the cache options the artifacts were "
                r"recorded with \(use_cache, cache_implementation, or a past_key_values of that class\)",
            ):
                model.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False, **options)

    @needs_mark_bounds
    def test_a_sequence_past_max_length_is_refused_naming_max_length(self):
        # max_length defaults to max_position_embeddings (64), past which eager Llama goes on: refused
        # by serving() naming precompile_generate's option, not by a dim bound of the artifact.
        model, runnables = _served("dynamic")
        for length, phase, cached, new in ((60, "decode", 64, 1), (66, "prefill", 0, 66)):
            ids, mask = _prompt(2, length)
            with self.subTest(phase=phase), generation.serving(model, runnables), self.assertRaisesRegex(
                PrecompileError,
                rf"^generation\.serving: the {phase} call has a sequence of {cached + new} tokens \({cached} in the cache and "
                rf"{new} new\), more than the 64 the artifacts were made for: precompile_generate\(\.\.\., max_length=N\)",
            ):
                model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)

    def test_recording_leaves_the_callers_cache_as_passed(self):
        # precompile_generate records by running generate(), which fills the past_key_values it is given:
        # the caller's cache, reused for the first request, would hold the recorded prompt.
        model, (ids, mask) = _llama(), _prompt()
        for cache in (transformers.DynamicCache(config=model.config), _fresh_static_cache(model)):
            with self.subTest(cache=type(cache).__name__):
                before = copy.deepcopy(cache)
                recorded = generation.record_forward_calls(
                    model, ids, attention_mask=mask, max_new_tokens=2, do_sample=False, past_key_values=cache
                )
                _assert_same_cache(self, cache, before)
                _assert_same_cache(self, recorded["prefill"]["past_key_values"], before)

    def test_recording_calls_none_of_the_callers_token_watchers(self):
        # A streamer's queue would hold the recorded prompt and token, a processor's or criterion's state
        # one step: objects the caller passes again to the served generate().
        model, (ids, mask) = _llama(), _prompt()
        seen = []

        class Watch(transformers.generation.streamers.BaseStreamer):
            def put(self, value):
                seen.append("streamer")

            def end(self):
                seen.append("streamer end")

        class Count(transformers.LogitsProcessor):
            def __call__(self, input_ids, scores):
                seen.append("logits processor")
                return scores

        class Never(transformers.StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                seen.append("stopping criteria")
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        recorded = generation.record_forward_calls(
            model, ids[:1], attention_mask=mask[:1], max_new_tokens=2, do_sample=False, streamer=Watch(),
            logits_processor=transformers.LogitsProcessorList([Count()]),
            stopping_criteria=transformers.StoppingCriteriaList([Never()]),
        )
        self.assertEqual(seen, [])
        self.assertEqual(set(recorded), {"prefill", "decode"})

    def test_precompile_generate_needs_free_dims(self):
        model, (ids, mask) = _llama(), _prompt()
        with self.assertRaisesRegex(PrecompileError, r"precompile_generate\(backend='eager'\): the decode step's cache length"):
            generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, backend="eager")
        with self.assertRaisesRegex(PrecompileError, r"called the model's forward 1 time\(s\).*max_new_tokens >= 2"):
            generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=1)

    def test_caches_with_sliding_window_layers_are_refused_up_front(self):
        # The helper marks the prompt and cache lengths free, which a sliding-window layer does not follow:
        # refused naming the cache, not with a message about marks the user never placed.
        torch.manual_seed(0)
        config = transformers.Gemma2Config(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, head_dim=8, sliding_window=4,
        )
        model, (ids, mask) = transformers.Gemma2ForCausalLM(config).eval(), _prompt()
        for extra, cache, layer in (
            ({}, "DynamicCache", "DynamicSlidingWindowLayer"),
            ({"past_key_values": transformers.StaticCache(config=config, max_cache_len=16)}, "StaticCache",
             "StaticSlidingWindowLayer"),
        ):
            with self.subTest(cache=cache), self.assertRaisesRegex(
                PrecompileError,
                rf"^precompile_generate: generate\(\) uses a {cache} whose layer 0 is a {layer} \(sliding window\), "
                r"which this helper does not support: .* precompile its forward calls with precompile\(\) and no mark_unbacked",
            ):
                generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False, **extra)

    @needs_mark_bounds
    def test_falcon_serves_every_prompt_length_but_the_one_its_lowering_rules_out(self):
        # Falcon's multi-query attention broadcasts one key head: lowering its bmm, Inductor asks whether the
        # free prompt length is 1.  The example's answer (not 1) becomes a size fact of the prefill artifact.
        torch.manual_seed(0)
        config = transformers.FalconConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
        )
        model, (ids, mask) = transformers.FalconForCausalLM(config).eval(), _prompt()
        pairs = generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
        runnables = {phase: torch_precompile.load(*pair) for phase, pair in pairs.items()}
        self.assertTrue(any("lowering of aten.bmm" in fact.where for fact in runnables["prefill"].convention.size_facts))
        for batch, length in ((2, 6), (3, 9), (1, 2)):
            with self.subTest(batch=batch, length=length):
                ids, mask = _prompt(batch, length, seed=length)
                self._assert_same_tokens(model, runnables, ids, mask, do_sample=False)
        ids, mask = _prompt(2, 1)
        with self.assertRaisesRegex(
            PrecompileError,
            r"the captured graph requires \(args\[1\]\['attention_mask'\] dim 1\) - 1 != 0, decided by the example "
            r"inputs for Inductor's lowering of aten\.bmm\.default .*modeling_falcon\.py.*, but args\[1\]\['attention_mask'\] "
            r"dim 1 is 1",
        ):
            with generation.serving(model, runnables):
                model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)

    def test_a_size_inductor_must_decide_is_refused_naming_the_free_sizes(self):
        # A projection over the flattened batch and prompt: Inductor asks whether its rows are 1, which no
        # size fact states.  The marks are the helper's, so the refusal names its free sizes and the way out,
        # where it said "give the mark bounds that decide it".
        model, (ids, mask) = _llama(), _prompt()
        model.model.norm = _FlattenedNorm(model.model.norm, model.config.hidden_size)
        with self.assertRaisesRegex(
            PrecompileError,
            r"^precompile_generate: Inductor needs to decide Eq\(u\d+\*u\d+ - 1, 1\) about the prefill call's free sizes "
            r"\(the batch and the prompt length\) while optimizing this model's graph, .* Call model\.generate\(\) "
            r"eagerly for this model, or precompile its forward calls with precompile\(\) and no mark_unbacked",
        ):
            generation.precompile_generate(model, ids, attention_mask=mask, max_new_tokens=3, do_sample=False)

    def test_example_generates_in_a_fresh_process(self):
        example = os.path.join(os.path.dirname(HERE), "examples", "generate.py")
        result = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=900)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertEqual(result.stdout.count("same as eager"), 3, result.stdout)


instantiate_parametrized_tests(TestCacheObjects)
instantiate_parametrized_tests(TestInputTrees)

if __name__ == "__main__":
    run_tests()
