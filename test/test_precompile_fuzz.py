# Owner(s): ["module: dynamo"]
"""Fuzzing torch.compiler.precompile's load() and the runnable's call checks.

Loading (``TestFuzzLoad``): random and mutated ``python_code`` / ``cache``
(random bytes and text, truncation, bit flips, swapped pairs from other
captures and the other backend, future format versions, valid Python with
bogus calling-convention constants, damaged envelopes, pickles) must make
``load()`` raise ``PrecompileError`` or return a runnable whose results are
correct -- never another exception type, a crash or a hang.

Calling (``TestFuzzCall``): wrong shapes, dtypes, devices, layouts, pytree
structures, values, arities, keyword arguments, non-modules and structurally
different models must raise a ``PrecompileError`` that names the argument
(``args[2]['b'][0]``), raised by the driver's own checks -- never an error
from inside the compiled graph, never a silent result -- and must leave the
model untouched.  Where the contract says a variation is fine (any layout on
backend='eager', an input that requires grad), the result must match eager.

Hypothesis runs derandomized with small ``max_examples`` so CI is
deterministic and fast; every artifact is compiled once per process.
"""

import ast
import contextlib
import copy
import io
import logging
import math
import os
import pickle
import pprint
import signal
import sys
import tempfile
import threading

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

from hypothesis import given, HealthCheck, settings, strategies as st


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _precompile_models import TinyMLP  # noqa: E402


PrecompileError = torch_precompile.PrecompileError
precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")

logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design

# PRECOMPILE_FUZZ_SCALE=10 multiplies every example budget for a deeper local run.
_SCALE = max(1, int(os.environ.get("PRECOMPILE_FUZZ_SCALE", "1")))
FUZZ = settings(
    max_examples=25 * _SCALE,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FUZZ_SMALL = settings(FUZZ, max_examples=12 * _SCALE)


# ---------------------------------------------------------------------------
# Captured functions and their eager references
# ---------------------------------------------------------------------------


def pytree_fn(model, x, extra, scale):
    y = model(x) * scale + extra["a"].sum() + extra["b"][0].mean()
    return {"y": y, "n": extra["b"][1]}


def train_step(model, x, target):
    loss = F.mse_loss(model(x), target)
    loss.backward()
    return loss


def _model() -> nn.Module:
    torch.manual_seed(0)
    return TinyMLP(features=8, hidden=16, out=4)


class _Settings:
    """A config object the fuzzed model reads a field of."""

    def __init__(self):
        self.eps = 0.5


class _ReadingMLP(TinyMLP):
    """TinyMLP that also reads plain Python values: private, class-level, a list element, a config field."""

    shift = 0.25

    def __init__(self):
        super().__init__(features=8, hidden=16, out=4)
        self._gain = 1.5
        self.scales = [1.0, 2.0]
        self.settings = _Settings()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self._gain * self.scales[1] + self.shift + self.settings.eps


def _reading_model() -> nn.Module:
    torch.manual_seed(0)
    return _ReadingMLP()


def _pytree_inputs() -> tuple:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, generator=g)
    extra = {"a": torch.randn(3, generator=g), "b": [torch.randn(2, 2, generator=g), 3]}
    return x, extra, 0.5


def _train_inputs() -> tuple:
    g = torch.Generator().manual_seed(2)
    return torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)


KINDS = {"pytree": (pytree_fn, _pytree_inputs), "train": (train_step, _train_inputs)}

_PAIRS: dict = {}


def pair(kind: str, backend: str, make_model=_model) -> tuple[str, bytes]:
    """(python_code, cache) for a kind/backend (and model), compiled once per process."""
    key = (kind, backend, make_model)
    if key not in _PAIRS:
        fn, inputs = KINDS[kind]
        _PAIRS[key] = precompile(fn, make_model(), *inputs(), backend=backend)
    return _PAIRS[key]


def assert_runs_correctly(runnable, kind: str) -> None:
    """The runnable's results (outputs, grads, buffers) equal eager's."""
    fn, make_inputs = KINDS[kind]
    ref, model = _model(), _model()
    inputs = make_inputs()
    expected = fn(ref, *inputs)
    out = runnable(model, *inputs)
    torch.testing.assert_close(out, expected)
    for (name, p), (_, q) in zip(ref.named_parameters(), model.named_parameters()):
        if p.grad is None:
            assert q.grad is None, name
        else:
            torch.testing.assert_close(q.grad, p.grad, msg=lambda m: f"{name}.grad: {m}")


# ---------------------------------------------------------------------------
# Hang guard and outcome classification
# ---------------------------------------------------------------------------


class _Hang(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` swallows it."""


@contextlib.contextmanager
def deadline(seconds: int = 120):
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise _Hang(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def load_outcome(python_code, cache, kind: str) -> str:
    """'refused' (PrecompileError at load or first call) or 'correct'.

    Any other exception type propagates and fails the test; so does a
    runnable whose results differ from eager's.
    """
    with deadline():
        try:
            runnable = precompile.load(python_code, cache)
        except PrecompileError:
            return "refused"
        try:
            assert_runs_correctly(runnable, kind)
        except PrecompileError:
            return "refused"
    return "correct"


# ---------------------------------------------------------------------------
# Artifact surgery helpers
# ---------------------------------------------------------------------------


def read_envelope(cache: bytes) -> dict:
    return torch_precompile._precompile_format._read_envelope(cache)


def write_envelope(envelope: dict) -> bytes:
    return torch_precompile._precompile_format._pack_envelope(envelope)


def rebind(cache: bytes, python_code: str) -> bytes:
    """The cache re-tagged for an edited python_code (a consistent, forged pair)."""
    envelope = read_envelope(cache)
    envelope["code_hash"] = torch_precompile._precompile_format._text_hashes(python_code)[1]
    return write_envelope(envelope)


def _constant_node(python_code: str, name: str) -> ast.Assign:
    for node in ast.parse(python_code).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            return node
    raise AssertionError(f"{name} not found in python_code")


def read_constant(python_code: str, name: str):
    return ast.literal_eval(_constant_node(python_code, name).value)


def replace_constant(python_code: str, name: str, value) -> str:
    """python_code with the top-level ``name = <literal>`` assignment rewritten."""
    node = _constant_node(python_code, name)
    lines = python_code.splitlines(keepends=True)
    text = f"{name} = {pprint.pformat(value, width=100, sort_dicts=False)}\n"
    return "".join(lines[: node.lineno - 1]) + text + "".join(lines[node.end_lineno :])


def literal_paths(value, path=()) -> list:
    """Every path into a nested dict/list literal (the root excluded)."""
    paths = []
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return paths
    for key, child in items:
        paths.append(path + (key,))
        paths.extend(literal_paths(child, path + (key,)))
    return paths


def _container(root, path):
    for key in path[:-1]:
        root = root[key]
    return root


# Python literals that are not what the calling convention expects.
bogus_literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "bogus", "float99", "cuda:7", "args[0]", "__import__", "torch.float32"])
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


# ---------------------------------------------------------------------------
# Fuzzed loading
# ---------------------------------------------------------------------------


class TestFuzzLoad(TestCase):
    @parametrize("backend", BACKENDS)
    def test_pristine_pair_loads(self, backend):
        for kind in KINDS:
            self.assertEqual(load_outcome(*pair(kind, backend), kind), "correct")

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(blob=st.binary(max_size=2048) | st.binary(max_size=512).map(lambda b: b"PK\x03\x04" + b))
    def test_random_bytes_as_cache(self, backend, blob):
        # The cache only accelerates: bytes that are not one are ignored (warned).
        python_code, _ = pair("pytree", backend)
        with self.assertWarnsRegex(UserWarning, "ignoring the cache"):
            self.assertEqual(load_outcome(python_code, blob, "pytree"), "correct")

    @FUZZ
    @given(text=st.text(max_size=512))
    def test_random_text_as_python_code(self, text):
        _, cache = pair("pytree", "eager")
        self.assertEqual(load_outcome(text, cache, "pytree"), "refused")
        self.assertEqual(load_outcome(text, rebind(cache, text), "pytree"), "refused")

    @FUZZ
    @given(
        version=bogus_literals,
        backend=bogus_literals | st.sampled_from(["eager", "inductor"]),
        convention=bogus_literals,
    )
    def test_valid_python_with_bogus_constants_only(self, version, backend, convention):
        _, cache = pair("pytree", "eager")
        if isinstance(convention, dict):
            convention = {**convention, "format_version": version, "backend": backend}
        code = f"CALLING_CONVENTION = {convention!r}\n"
        self.assertEqual(load_outcome(code, rebind(cache, code), "pytree"), "refused")

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(data=st.data())
    def test_truncated_python_code(self, backend, data):
        python_code, cache = pair("pytree", backend)
        cut = data.draw(st.integers(min_value=0, max_value=len(python_code) - 1))
        truncated = python_code[:cut]
        self.assertEqual(load_outcome(truncated, cache, "pytree"), "refused")  # code_hash differs
        # Re-tagged: cutting only trailing blanks/comments leaves a valid artifact.
        self.assertIn(load_outcome(truncated, rebind(cache, truncated), "pytree"), ("refused", "correct"))

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(data=st.data())
    def test_truncated_cache(self, backend, data):
        python_code, cache = pair("pytree", backend)
        cut = data.draw(st.integers(min_value=0, max_value=len(cache) - 1))
        with self.assertWarnsRegex(UserWarning, "ignoring the cache: cache is damaged"):
            self.assertEqual(load_outcome(python_code, cache[:cut], "pytree"), "correct")

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(data=st.data())
    def test_bit_flips_in_cache(self, backend, data):
        python_code, cache = pair("pytree", backend)
        flips = data.draw(st.lists(st.integers(0, 8 * len(cache) - 1), min_size=1, max_size=8))
        damaged = bytearray(cache)
        for bit in flips:
            damaged[bit // 8] ^= 1 << (bit % 8)
        # A flip in slack bytes of the zip container may be harmless: then
        # the results must be exactly right.
        self.assertIn(load_outcome(python_code, bytes(damaged), "pytree"), ("refused", "correct"))

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(data=st.data())
    def test_bit_flips_in_python_code(self, backend, data):
        python_code, cache = pair("pytree", backend)
        raw = bytearray(python_code.encode())
        flips = data.draw(st.lists(st.integers(0, 8 * len(raw) - 1), min_size=1, max_size=4))
        for bit in flips:
            raw[bit // 8] ^= 1 << (bit % 8)
        edited = raw.decode("utf-8", errors="replace")
        if edited == python_code:
            return
        # The cache is bound to the exact text: an edited artifact is refused.
        self.assertEqual(load_outcome(edited, cache, "pytree"), "refused")

    def test_swapped_pairs(self):
        pairs = {(kind, backend): pair(kind, backend) for kind in KINDS for backend in BACKENDS}
        for (code_key, (python_code, _)), (cache_key, (_, cache)) in (
            (a, b) for a in pairs.items() for b in pairs.items() if a[0] != b[0]
        ):
            with self.subTest(code=code_key, cache=cache_key):
                with deadline():
                    with self.assertRaisesRegex(PrecompileError, "different python_code|backend"):
                        precompile.load(python_code, cache)

    @parametrize("backend", BACKENDS)
    def test_future_format_version(self, backend):
        python_code, cache = pair("pytree", backend)
        version = read_constant(python_code, "CALLING_CONVENTION")["format_version"]
        self.assertIsInstance(version, int)
        # A newer cache envelope (its version is its own) only loses its acceleration.
        envelope = read_envelope(cache)
        cache_version = envelope["version"]
        self.assertIsInstance(cache_version, int)
        envelope["version"] = cache_version + 1
        with self.assertWarnsRegex(UserWarning, f"ignoring the cache: cache has format version {cache_version + 1}"):
            self.assertEqual(load_outcome(python_code, write_envelope(envelope), "pytree"), "correct")
        # A newer python_code (the version is stored once: its calling convention's), with its cache.
        convention = read_constant(python_code, "CALLING_CONVENTION")
        convention["format_version"] = version + 1
        newer = replace_constant(python_code, "CALLING_CONVENTION", convention)
        envelope = read_envelope(rebind(cache, newer))
        envelope["version"] = cache_version + 1
        with self.assertRaisesRegex(PrecompileError, f"format version {version + 1}, newer than"):
            precompile.load(newer, write_envelope(envelope))

    @parametrize("backend", BACKENDS)
    @FUZZ
    @given(data=st.data())
    def test_bogus_calling_convention(self, backend, data):
        """Valid Python whose calling-convention literal is damaged, with a matching cache."""
        kind = data.draw(st.sampled_from(sorted(KINDS)), label="kind")
        python_code, cache = pair(kind, backend)
        convention = read_constant(python_code, "CALLING_CONVENTION")
        # Output `value` leaves are fn's own constant results: editing them is
        # editing the program, not damaging the metadata.
        paths = [p for p in literal_paths(convention) if not (p[0] == "outputs" and p[-1] == "value")]
        path = data.draw(st.sampled_from(paths), label="path")
        container = _container(convention, path)
        action = data.draw(st.sampled_from(["replace", "delete", "add_key"]), label="action")
        if action == "replace":
            replacement = data.draw(bogus_literals, label="value")
            if replacement == container[path[-1]]:
                return
            container[path[-1]] = replacement
        elif action == "delete":
            del container[path[-1]]
        else:
            target = container[path[-1]]
            if not isinstance(target, dict):
                return
            target["unknown_field"] = data.draw(bogus_literals, label="value")
        edited = replace_constant(python_code, "CALLING_CONVENTION", convention)
        self.assertIn(load_outcome(edited, rebind(cache, edited), kind), ("refused", "correct"))

    @parametrize("backend", BACKENDS)
    @FUZZ_SMALL
    @given(data=st.data())
    def test_bogus_version_or_backend(self, backend, data):
        python_code, cache = pair("pytree", backend)
        convention = read_constant(python_code, "CALLING_CONVENTION")
        name = data.draw(st.sampled_from(["format_version", "backend"]), label="name")
        value = data.draw(bogus_literals, label="value")
        if value == convention[name]:
            return
        convention[name] = value
        edited = replace_constant(python_code, "CALLING_CONVENTION", convention)
        self.assertEqual(load_outcome(edited, rebind(cache, edited), "pytree"), "refused")

    @parametrize("backend", BACKENDS)
    @FUZZ_SMALL
    @given(data=st.data())
    def test_damaged_envelope_fields(self, backend, data):
        """A well-formed cache envelope whose fields are wrong or missing."""
        python_code, cache = pair("pytree", backend)
        envelope = read_envelope(cache)
        key = data.draw(st.sampled_from(sorted(envelope)), label="key")
        action = data.draw(st.sampled_from(["replace", "delete", "add_key"]), label="action")
        if action == "replace":
            envelope[key] = data.draw(
                bogus_literals | st.binary(max_size=16) | st.just({"kernels": {"k": b"\x7fELF"}}), label="value"
            )
        elif action == "delete":
            del envelope[key]
        else:
            envelope["unexpected"] = 1
        self.assertIn(load_outcome(python_code, write_envelope(envelope), "pytree"), ("refused", "correct"))

    def test_foreign_build_environment_still_correct(self):
        # Kernels built elsewhere are not loaded; the code is compiled instead.
        python_code, cache = pair("pytree", "inductor")
        envelope = read_envelope(cache)
        envelope["build_env"] = dict(envelope["build_env"], torch="0.0.0+elsewhere")
        self.assertEqual(load_outcome(python_code, write_envelope(envelope), "pytree"), "correct")

    def test_forged_garbage_kernels(self):
        # Garbage where a kernel shared object should be, with a matching
        # payload hash: a clean error (or a correct result), never a crash.
        payload_hash = getattr(torch_precompile._precompile_format, "_payload_hash", None)
        if payload_hash is None:
            self.skipTest("torch_precompile._precompile_format._payload_hash is gone")
        python_code, cache = pair("pytree", "inductor")
        envelope = read_envelope(cache)
        kernels = envelope["artifact"]["kernels"]
        self.assertGreater(len(kernels), 0)
        envelope["artifact"]["kernels"] = {key: b"\x7fELF garbage" for key in kernels}
        envelope["payload_sha256"] = payload_hash(torch_precompile._precompile_format._kernel_digests(envelope["artifact"]["kernels"]))
        with tempfile.TemporaryDirectory() as directory, _env("TORCHINDUCTOR_CACHE_DIR", directory):
            self.assertIn(load_outcome(python_code, write_envelope(envelope), "pytree"), ("refused", "correct"))

    def test_wrong_types(self):
        python_code, cache = pair("pytree", "eager")
        for bad_code in (None, b"", python_code.encode(), 1, [python_code]):
            self.assertEqual(load_outcome(bad_code, cache, "pytree"), "refused")
        for bad_cache in (None, "", 1, [cache], cache.decode("latin-1")):
            self.assertEqual(load_outcome(python_code, bad_cache, "pytree"), "refused")
        for good_cache in (bytearray(cache), memoryview(cache)):
            self.assertEqual(load_outcome(python_code, good_cache, "pytree"), "correct")

    def test_pickles_are_never_executed(self):
        python_code, cache = pair("pytree", "eager")
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "executed")
            payload = _Touch(marker)
            plain = pickle.dumps(payload, protocol=2)
            envelope = read_envelope(cache)
            envelope["artifact"] = payload
            buffer = io.BytesIO()
            torch.save(envelope, buffer)
            for blob in (plain, buffer.getvalue()):
                with self.assertWarnsRegex(UserWarning, "ignoring the cache: cache is damaged"):
                    self.assertEqual(load_outcome(python_code, blob, "pytree"), "correct")
                self.assertFalse(os.path.exists(marker), "load() unpickled an arbitrary object")


class _Touch:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@contextlib.contextmanager
def _env(name: str, value: str):
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


instantiate_parametrized_tests(TestFuzzLoad)


# ---------------------------------------------------------------------------
# Fuzzed calls
# ---------------------------------------------------------------------------

# (path in error messages, getter, setter) for the tensor leaves of pytree_fn's inputs.
TENSOR_LEAVES = {
    "args[1]": (lambda a: a[1], lambda a, v: a.__setitem__(1, v)),
    "args[2]['a']": (lambda a: a[2]["a"], lambda a, v: a[2].__setitem__("a", v)),
    "args[2]['b'][0]": (lambda a: a[2]["b"][0], lambda a, v: a[2]["b"].__setitem__(0, v)),
}
DTYPES = [torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64]


def valid_args(model: nn.Module) -> list:
    x, extra, scale = _pytree_inputs()
    return [model, x, extra, scale]


def _strided_variant(tensor: torch.Tensor, how: str) -> torch.Tensor:
    """Same shape and values, another memory layout."""
    if how == "transposed" and tensor.dim() == 2:
        return tensor.t().contiguous().t()
    if how == "sliced":
        wide = torch.zeros(*tensor.shape[:-1], 2 * tensor.shape[-1], dtype=tensor.dtype)
        wide[..., ::2] = tensor
        return wide[..., ::2]
    if how == "expanded" and tensor.numel() > 1:
        first = tensor.reshape(-1)[:1].reshape([1] * tensor.dim())
        return first.expand(tensor.shape)  # stride 0 (values differ: compared with eager on the same tensor)
    return tensor.t().contiguous().t() if tensor.dim() == 2 else tensor[None].expand(2, *tensor.shape)[0]


def _other_models(model: nn.Module) -> dict:
    """Models that must be refused: (model, path that the error must name)."""
    renamed = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))  # same count, other names
    reshaped = TinyMLP(features=11, hidden=13, out=4)  # same names and count, other shapes
    missing = copy.deepcopy(model)
    missing.fc2.bias = None
    extra_buffer = copy.deepcopy(model)
    extra_buffer.fc1.register_buffer("scale", torch.ones(1))
    extra_param = copy.deepcopy(model)
    extra_param.register_parameter("temperature", nn.Parameter(torch.ones(1)))
    half = copy.deepcopy(model).half()
    meta = copy.deepcopy(model).to("meta")
    return {
        "renamed": (renamed, "args[0]"),
        "reshaped": (reshaped, "args[0].fc1.weight"),
        "missing_param": (missing, "args[0]"),
        "extra_buffer": (extra_buffer, "args[0]"),
        "extra_param": (extra_param, "args[0]"),
        "half": (half, "args[0].fc1.weight"),
        "meta": (meta, "args[0].fc1.weight"),
    }


def _mutation(data, model: nn.Module, backend: str) -> tuple:
    """(args, kwargs, expected) where expected is the substring the error must
    contain, or None if the call is valid and must match eager."""
    args = valid_args(model)
    kind = data.draw(
        st.sampled_from(
            ["shape", "dtype", "device", "layout", "sparse", "requires_grad", "structure",
             "value", "arity", "kwargs", "not_module", "other_model"]
        ),
        label="mutation",
    )
    if kind in ("shape", "dtype", "device", "layout", "sparse", "requires_grad"):
        path = data.draw(st.sampled_from(sorted(TENSOR_LEAVES)), label="leaf")
        get, put = TENSOR_LEAVES[path]
        tensor = get(args)
        if kind == "shape":
            shape = data.draw(st.lists(st.integers(0, 4), max_size=4).filter(lambda s: s != list(tensor.shape)), label="shape")
            put(args, torch.randn(shape))
        elif kind == "dtype":
            put(args, tensor.to(data.draw(st.sampled_from(DTYPES), label="dtype")))
        elif kind == "device":
            put(args, tensor.to("meta"))
        elif kind == "layout":
            how = data.draw(st.sampled_from(["transposed", "sliced", "expanded"]), label="layout")
            variant = _strided_variant(tensor, how)
            put(args, variant)
            if variant.stride() == tensor.stride():
                return args, {}, None
            return args, {}, path
        elif kind == "sparse":
            # Not a strided tensor at all: refused on every backend, by name.
            layouts = ["sparse_coo"] + (["sparse_csr", "mkldnn"] if tensor.dim() == 2 else [])
            layout = data.draw(st.sampled_from(layouts), label="layout")
            put(args, {"sparse_coo": tensor.to_sparse, "sparse_csr": tensor.to_sparse_csr, "mkldnn": tensor.to_mkldnn}[layout]())
        else:
            put(args, tensor.clone().requires_grad_())
            return args, {}, None
        return args, {}, path
    if kind == "structure":
        variant = data.draw(
            st.sampled_from(
                ["drop_key", "add_key", "rename_key", "list_to_tuple", "short_list", "long_list",
                 "dict_to_list", "wrap_x", "x_to_dict", "extra_none", "x_none", "reorder_keys"]
            ),
            label="structure",
        )
        x, extra = args[1], args[2]
        if variant == "reorder_keys":  # fn reads extra by key: mapped by key, honoured
            args[2] = dict(reversed(extra.items()))
            return args, {}, None
        if variant == "drop_key":
            del extra["a"]
        elif variant == "add_key":
            extra["c"] = torch.ones(1)
        elif variant == "rename_key":
            extra["A"] = extra.pop("a")
        elif variant == "list_to_tuple":
            extra["b"] = tuple(extra["b"])
        elif variant == "short_list":
            extra["b"] = extra["b"][:1]
        elif variant == "long_list":
            extra["b"] = extra["b"] + [torch.ones(1)]
        elif variant == "dict_to_list":
            args[2] = [extra["a"], extra["b"]]
        elif variant == "wrap_x":
            args[1] = [x]
        elif variant == "x_to_dict":
            args[1] = {"x": x}
        elif variant == "extra_none":
            args[2] = None
        else:
            args[1] = None
        return args, {}, "args[1]" if variant in ("wrap_x", "x_to_dict", "x_none") else "args[2]"
    if kind == "value":
        where = data.draw(st.sampled_from(["scale", "count"]), label="where")
        if where == "scale":
            args[3] = data.draw(st.sampled_from([0.25, 1, True, None, "0.5", math.nan, 0.5 + 1e-9, -0.5]), label="v")
            return args, {}, "args[3]"
        args[2]["b"][1] = data.draw(st.sampled_from([4, 3.0, True, "3", None, -3]), label="v")
        return args, {}, "args[2]"
    if kind == "arity":
        if data.draw(st.booleans(), label="drop"):
            return args[:-1], {}, "missing a required argument: 'scale'"
        return args + [data.draw(st.sampled_from([None, 0.5, "x"]), label="extra")], {}, "too many positional arguments"
    if kind == "kwargs":
        if data.draw(st.booleans(), label="move"):  # bound like fn's own parameter: honoured
            return args[:-1], {"scale": args[-1]}, None
        return args, {"debug": True}, "unexpected keyword argument 'debug'"
    if kind == "not_module":
        choice = data.draw(
            st.sampled_from(["none", "string", "int", "tensor", "dict", "state_dict", "list", "function"]),
            label="module",
        )
        args[0] = {
            "none": lambda: None,
            "string": lambda: "model",
            "int": lambda: 1,
            "tensor": lambda: torch.randn(2, 8),
            "dict": lambda: {},
            "state_dict": model.state_dict,
            "list": lambda: [model],
            "function": lambda: model.forward,
        }[choice]()
        return args, {}, "args[0]"
    name = data.draw(st.sampled_from(sorted(_other_models(model))), label="model")
    args[0], path = _other_models(model)[name]
    return args, {}, path


def _assert_untouched(test: TestCase, model: nn.Module, snapshot: dict) -> None:
    for name, param in model.named_parameters():
        test.assertIsNone(param.grad, f"a refused call wrote {name}.grad")
        test.assertTrue(torch.equal(param, snapshot[name]), f"a refused call changed {name}")


class TestFuzzCall(TestCase):
    @parametrize("backend", BACKENDS)
    @settings(FUZZ, max_examples=60 * _SCALE)
    @given(data=st.data())
    def test_fuzzed_call(self, backend, data):
        runnable = precompile.load(*pair("pytree", backend))
        model = _model()
        snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
        args, kwargs, expected = _mutation(data, model, backend)
        with deadline():
            if expected is None:
                out = runnable(*args, **kwargs)
                torch.testing.assert_close(out, pytree_fn(*args, **kwargs))
            else:
                with self.assertRaises(PrecompileError) as caught:
                    runnable(*args, **kwargs)
                message = str(caught.exception)
                self.assertIn(expected, message)
                # Raised by the driver's checks, not by the compiled graph.
                self.assertNotIn("compiled graph rejected", message)
                self.assertIsNone(caught.exception.__cause__, message)
        _assert_untouched(self, model, snapshot)
        # A refused call does not poison the runnable.
        torch.testing.assert_close(runnable(*valid_args(model)), pytree_fn(*valid_args(model)))

    @parametrize("backend", BACKENDS)
    @settings(FUZZ, max_examples=30 * _SCALE)
    @given(data=st.data())
    def test_fuzzed_training_call(self, backend, data):
        """Bad calls to a training step are refused before any .grad is written."""
        runnable = precompile.load(*pair("train", backend))
        model = _model()
        snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
        x, target = _train_inputs()
        args = [model, x, target]
        index = data.draw(st.sampled_from([1, 2]), label="which")
        how = data.draw(
            st.sampled_from(["shape", "dtype", "device", "layout", "sparse", "sparse_csr", "mkldnn", "wrap", "number"]),
            label="how",
        )
        tensor = args[index]
        args[index] = {
            "shape": lambda: torch.randn(3, tensor.shape[1]),
            "dtype": lambda: tensor.double(),
            "device": lambda: tensor.to("meta"),
            "layout": lambda: tensor.t().contiguous().t(),
            "sparse": lambda: tensor.to_sparse(),
            "sparse_csr": lambda: tensor.to_sparse_csr(),
            "mkldnn": lambda: tensor.to_mkldnn(),
            "wrap": lambda: (tensor,),
            "number": lambda: 1.0,
        }[how]()
        with deadline():
            with self.assertRaises(PrecompileError) as caught:
                runnable(*args)
        self.assertIn(f"args[{index}]", str(caught.exception))
        _assert_untouched(self, model, snapshot)

    @parametrize("backend", BACKENDS)
    def test_model_changed_between_calls(self, backend):
        """The driver caches per-model lookups; changes to the model after a
        call must still be seen (checked or used), never silently ignored."""
        runnable = precompile.load(*pair("pytree", backend))
        model = _model()
        args = valid_args(model)
        torch.testing.assert_close(runnable(*args), pytree_fn(*args))
        # A submodule replaced by one of the same shape (fine-tuning swaps heads): its weights are used.
        model.fc1 = nn.Linear(8, 16)
        torch.testing.assert_close(runnable(*args), pytree_fn(*args), msg="stale weights of a replaced submodule")
        # A parameter rebound to a new tensor: used.
        model.fc2.weight = nn.Parameter(torch.randn(4, 16))
        torch.testing.assert_close(runnable(*args), pytree_fn(*args))
        # A parameter set to None: refused, naming it.
        model.fc2.bias = None
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]"):
            runnable(*args)
        # A new parameter registered after the first call: structure differs.
        model = _model()
        args = valid_args(model)
        runnable(*args)
        model.fc1.register_parameter("gain", nn.Parameter(torch.ones(16)))
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]"):
            runnable(*args)
        # A submodule replaced by one of another shape: refused.
        model = _model()
        args = valid_args(model)
        runnable(*args)
        model.fc2 = nn.Linear(16, 5)
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.fc2\.weight"):
            runnable(*args)

    @parametrize("backend", BACKENDS)
    @parametrize("kind", ["pytree", "train"])
    @settings(FUZZ, max_examples=12 * _SCALE)
    @given(data=st.data())
    def test_fuzzed_soundness_call(self, backend, kind, data):
        """Module modes, aliasing, requires_grad, module edits and classes, hooks, plain
        values fn reads (private, class-level, list elements, config fields), an existing
        .grad and global state changed after a first call: eager's result, or a
        PrecompileError that leaves everything as it was (Note invariant 11)."""
        self._soundness_call(backend, kind, data, sorted(SOUNDNESS_EDITS) + sorted(SOUNDNESS_CONTEXTS))

    @parametrize("backend", BACKENDS)
    @parametrize("kind", ["pytree", "train"])
    @settings(FUZZ, max_examples=6 * _SCALE)
    @given(data=st.data())
    def test_fuzzed_read_values(self, backend, kind, data):
        """As test_fuzzed_soundness_call, drawing only edits of the plain values fn reads."""
        self._soundness_call(backend, kind, data, sorted(READ_EDITS))

    def _soundness_call(self, backend, kind, data, changes):
        try:
            self._call_after_changes(backend, kind, data, changes)
        finally:
            _ReadingMLP.shift = 0.25  # an edit may change it on the class

    def _call_after_changes(self, backend, kind, data, changes):
        fn, make_inputs = KINDS[kind]
        runnable = precompile.load(*pair(kind, backend, _reading_model))
        model, args = _reading_model(), list(make_inputs())
        runnable(model, *args)  # arms the driver's caches and fast path
        model.zero_grad(set_to_none=True)
        drawn = data.draw(st.lists(st.sampled_from(changes), min_size=1, max_size=2, unique=True), label="changes")
        for change, edit in SOUNDNESS_EDITS.items():  # in the table's order
            if change in drawn:
                edit(model, args)
        with contextlib.ExitStack() as stack:
            for change in drawn:
                if change in SOUNDNESS_CONTEXTS:
                    stack.enter_context(SOUNDNESS_CONTEXTS[change]())
            ref_model, ref_args = copy.deepcopy((model, args))
            for ours, theirs in zip(model.parameters(), ref_model.parameters()):  # deepcopy drops .grad
                theirs.grad = None if ours.grad is None else ours.grad.clone()
            try:
                expected, eager_error = fn(ref_model, *ref_args), None
            except Exception as error:  # eager refuses too: the artifact must
                expected, eager_error = None, error
            before = _everything(model, args)
            with deadline():
                try:
                    out = runnable(model, *args)
                except PrecompileError:
                    self.assertEqual(_everything(model, args), before, atol=0, rtol=0, msg="a refused call changed state")
                    return
        self.assertIsNone(eager_error, f"eager raised {eager_error!r}, the artifact computed")
        torch.testing.assert_close(out, expected)
        self.assertEqual(_everything(model, args), _everything(ref_model, ref_args))


def _set_default_dtype(dtype):
    @contextlib.contextmanager
    def context():
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(default)

    return context


def _replace_bias(model, args):
    model.fc2.bias = nn.Parameter(model.fc2.bias.detach().clone(), requires_grad=False)


def _redefine_fc1(model, args):
    del model.fc1
    model.fc1 = nn.Linear(8, 16)


class _ScaledLinear(nn.Linear):
    """Same parameters as nn.Linear, another forward: a swapped class must be refused."""

    def forward(self, x):
        return super().forward(x) * 2


def _alias_inputs(model, args):
    # detach(): still x's memory, but a leaf (deepcopy, for the eager reference, needs one).
    if isinstance(args[1], dict):  # pytree_fn: extra["a"] becomes a view of x
        args[1]["a"] = args[0].detach().view(-1)[:3]
    else:
        args[1] = args[0].detach()[:, :4]


# Edits of the plain Python values _ReadingMLP.forward reads.
READ_EDITS = {
    "private_attr": lambda model, args: setattr(model, "_gain", 2.5),
    "private_attr_equal": lambda model, args: setattr(model, "_gain", float("1.5")),  # honoured
    "class_attr_on_instance": lambda model, args: setattr(model, "shift", -1.0),
    "class_attr_on_class": lambda model, args: setattr(type(model), "shift", -1.0),
    "list_element": lambda model, args: model.scales.__setitem__(1, 3.0),
    "list_element_equal": lambda model, args: model.scales.__setitem__(1, float("2.0")),  # honoured
    "config_field": lambda model, args: setattr(model.settings, "eps", 0.125),
    "config_replaced": lambda model, args: setattr(model, "settings", _Settings()),  # equal fields: honoured
}
# Edits of the model or the inputs between two calls.
SOUNDNESS_EDITS = {
    "eval": lambda model, args: model.eval(),
    "eval_fc1": lambda model, args: model.fc1.eval(),
    "training_attr": lambda model, args: setattr(model.fc2, "training", False),
    "freeze_weight": lambda model, args: model.fc1.weight.requires_grad_(False),
    "frozen_bias_swapped_in": _replace_bias,
    "alias_inputs": _alias_inputs,
    "neg_view": lambda model, args: args.__setitem__(0, torch._neg_view(args[0])),
    "del_fc2": lambda model, args: delattr(model, "fc2"),
    "del_bias": lambda model, args: delattr(model.fc1, "bias"),
    "redefine_fc1": _redefine_fc1,
    "swap_fc2_class": lambda model, args: setattr(model, "fc2", _ScaledLinear(16, 4)),
    "forward_hook": lambda model, args: model.fc1.register_forward_hook(lambda module, inputs, out: out * 2),
    "grad_hook": lambda model, args: model.fc2.weight.register_hook(lambda grad: grad * 3),
    "existing_grad": lambda model, args: setattr(model.fc1.weight, "grad", torch.ones_like(model.fc1.weight)),
    **READ_EDITS,
    # Last: the views above need a leaf that does not require grad (deepcopy).
    "input_requires_grad": lambda model, args: args[0].requires_grad_(),
}
# Global state the next call runs under.
SOUNDNESS_CONTEXTS = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "default_dtype": _set_default_dtype(torch.float64),
    "anomaly": lambda: torch.autograd.detect_anomaly(check_nan=False),
}


def _everything(model: nn.Module, args: list) -> list:
    """(name, value) of every tensor a call could write, and each .grad, bit-exactly comparable."""
    tensors = [(n, t) for n, t in model.state_dict(keep_vars=True).items()]
    tensors += [(f"args[{i + 1}]{path}", t) for i, arg in enumerate(args) for path, t in _tensor_leaves(arg)]
    return [
        (name, (t.detach().clone(), None if t.grad is None else t.grad.clone()))
        for name, t in tensors
    ]


def _tensor_leaves(arg) -> list:
    leaves, _ = torch.utils._pytree.tree_flatten_with_path(arg)
    return [(torch.utils._pytree.keystr(path), t) for path, t in leaves if isinstance(t, torch.Tensor)]


instantiate_parametrized_tests(TestFuzzCall)


if __name__ == "__main__":
    run_tests()
