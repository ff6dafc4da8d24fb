# Owner(s): ["module: dynamo"]
"""torch.compiler.precompile on models written the way model libraries write them.

Every zoo model (see ``_precompile_models.py``: a GPT-2-style decoder LM with a
tied LM head, a BERT-style classifier with an attention mask, a torchvision
ResNet-style net with BatchNorm, LSTM / GRU sequence models, an EmbeddingBag
gather/scatter model and a dropout MLP) is precompiled as an inference
function and as a training step (``loss.backward()`` inside ``fn``) on both
backends, and compared with eager: outputs, every parameter's ``.grad``
(accumulated over several steps, across an optimizer step) and every buffer
(BatchNorm running stats).  Random ops are compared under the same
``torch.manual_seed`` (the inductor backend pins ``fallback_random``).

``TestNoWeightsLeave`` checks Note [precompile programming model] invariant
1 on large parameters: neither ``python_code`` nor ``cache`` contains the
parameter bytes, and neither grows with the parameter size.

Each artifact is compiled once per process (module-level cache): an Inductor
compile costs 5-30 s on a 2-core CI machine.
"""

import base64
import contextlib
import copy
import logging
import os
import sys

import torch
import torch.nn as nn
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _precompile_models import ZOO  # noqa: E402


BACKENDS = ("eager", "inductor")
MODELS = tuple(ZOO)

# load() warns at every call by design; keep the test log readable.
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)


def _snapshot(model: nn.Module) -> dict:
    state = {f"param {n}": p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    state.update({f"grad {n}": p.grad for n, p in model.named_parameters(remove_duplicate=False)})
    state.update({f"buffer {n}": b.detach().clone() for n, b in model.named_buffers(remove_duplicate=False)})
    return state


class _Artifact:
    """One precompiled (python_code, cache) pair plus what capture did to the caller."""

    def __init__(self, name: str, mode: str, backend: str):
        case = ZOO[name]
        self.model = case.make_model()
        if mode == "infer" and not case.infer_train_mode:
            self.model.eval()
        self.inputs = case.make_inputs(0)
        self.fn = case.infer if mode == "infer" else case.train
        before = _snapshot(self.model)
        inputs_before = [t.clone() for t in self.inputs]
        self.error = None
        try:
            self.python_code, self.cache = torch_precompile.precompile(
                self.fn, self.model, *self.inputs, backend=backend
            )
        except Exception as error:  # reported by every test that needs it
            self.error = error
        # Invariant 8: capture leaves the caller's model and inputs untouched.
        self.caller_changed = []
        after = _snapshot(self.model)
        for key, value in before.items():
            other = after[key]
            if (value is None) != (other is None) or (
                value is not None and not torch.equal(value, other)
            ):
                self.caller_changed.append(key)
        for i, (a, b) in enumerate(zip(inputs_before, self.inputs)):
            if not torch.equal(a, b):
                self.caller_changed.append(f"input {i}")


_ARTIFACTS: dict = {}


def artifact(name: str, mode: str, backend: str) -> _Artifact:
    key = (name, mode, backend)
    if key not in _ARTIFACTS:
        _ARTIFACTS[key] = _Artifact(name, mode, backend)
    return _ARTIFACTS[key]


class TestModelZoo(TestCase):
    def _load(self, art: _Artifact):
        if art.error is not None:
            raise art.error
        self.assertEqual(art.caller_changed, [], msg="precompile() modified the caller's model or inputs")
        return torch_precompile.load(art.python_code, art.cache)

    def _assert_same_model(self, ref: nn.Module, got: nn.Module, what: str) -> None:
        ref_params = dict(ref.named_parameters(remove_duplicate=False))
        for name, param in got.named_parameters(remove_duplicate=False):
            expected = ref_params[name]
            torch.testing.assert_close(param, expected, msg=lambda m: f"{what}: parameter {name}: {m}")
            if expected.grad is None:
                self.assertIsNone(param.grad, msg=f"{what}: {name}.grad should be None like eager")
            else:
                self.assertIsNotNone(param.grad, msg=f"{what}: {name}.grad is None, eager has a grad")
                torch.testing.assert_close(
                    param.grad, expected.grad, msg=lambda m: f"{what}: {name}.grad: {m}"
                )
        ref_buffers = dict(ref.named_buffers(remove_duplicate=False))
        for name, buffer in got.named_buffers(remove_duplicate=False):
            torch.testing.assert_close(buffer, ref_buffers[name], msg=lambda m: f"{what}: buffer {name}: {m}")

    @parametrize("backend", BACKENDS)
    @parametrize("name", MODELS)
    def test_inference(self, name, backend):
        case = ZOO[name]
        art = artifact(name, "infer", backend)
        runnable = self._load(art)
        ref_model, model = copy.deepcopy(art.model), copy.deepcopy(art.model)
        # Plain, under no_grad and under inference_mode (how inference is usually called).
        modes = [contextlib.nullcontext, torch.no_grad, torch.inference_mode]
        for seed, mode in enumerate(modes):
            inputs = case.make_inputs(seed)  # same shapes, new values: nothing data-dependent is baked
            torch.manual_seed(1000 + seed)
            expected = case.infer(ref_model, *inputs)
            torch.manual_seed(1000 + seed)
            with mode():
                out = runnable(model, *inputs)
            torch.testing.assert_close(out, expected, msg=lambda m: f"call {seed}: {m}")
            self._assert_same_model(ref_model, model, f"call {seed}")
        if case.seeded:
            # Random ops run at every call, they are not baked.
            torch.manual_seed(1)
            first = runnable(model, *case.make_inputs(0))
            second = runnable(model, *case.make_inputs(0))
            self.assertNotEqual(first, second)

    @parametrize("backend", BACKENDS)
    @parametrize("name", MODELS)
    def test_training_step(self, name, backend):
        case = ZOO[name]
        art = artifact(name, "train", backend)
        runnable = self._load(art)
        ref_model, model = copy.deepcopy(art.model), copy.deepcopy(art.model)
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        # step 0: grads assigned; step 1: accumulated (no zero_grad); then an
        # optimizer step and zero_grad(set_to_none=False): updated weights are
        # read at every call and grads are added onto existing zeros.
        for step in range(3):
            if step == 2:
                for optimizer in (ref_opt, opt):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=False)
            inputs = case.make_inputs(step)
            torch.manual_seed(2000 + step)
            expected = case.train(ref_model, *inputs)
            torch.manual_seed(2000 + step)
            out = runnable(model, *inputs)
            self.assertIsNone(getattr(out, "grad_fn", None))
            torch.testing.assert_close(out, expected, msg=lambda m: f"step {step}: {m}")
            self._assert_same_model(ref_model, model, f"step {step}")

    def test_resnet_train_mode_updates_running_stats(self):
        # The BatchNorm running stats are updated by the artifact at every
        # call (and only then), exactly like eager.
        art = artifact("resnet", "train", "eager")
        runnable = self._load(art)
        model = copy.deepcopy(art.model)
        before = {n: b.clone() for n, b in model.named_buffers()}
        runnable(model, *ZOO["resnet"].make_inputs(0))
        changed = [n for n, b in model.named_buffers() if not torch.equal(b, before[n])]
        self.assertIn("bn1.running_mean", changed)
        self.assertIn("bn1.num_batches_tracked", changed)
        self.assertEqual(model.bn1.num_batches_tracked.item(), before["bn1.num_batches_tracked"].item() + 1)

    def test_gpt_tied_head_receives_one_grad(self):
        # Tied embedding / LM head: one lifted tensor, one accumulated grad.
        art = artifact("gpt", "train", "eager")
        runnable = self._load(art)
        model = copy.deepcopy(art.model)
        self.assertIs(model.lm_head.weight, model.wte.weight)
        runnable(model, *ZOO["gpt"].make_inputs(0))
        self.assertIs(model.lm_head.weight, model.wte.weight)
        ref = copy.deepcopy(art.model)
        ZOO["gpt"].train(ref, *ZOO["gpt"].make_inputs(0))
        torch.testing.assert_close(model.wte.weight.grad, ref.wte.weight.grad)


instantiate_parametrized_tests(TestModelZoo)


# ---------------------------------------------------------------------------
# No weights leave the model (Note invariant 1).
# ---------------------------------------------------------------------------

# A recognizable 16-byte pattern of moderate float32 values (~0.05-0.12).
_WEIGHT_WORDS = (0x3DFACE11, 0x3DC0FFEE, 0x3DBEEF42, 0x3D5EED00)
_BIAS_WORDS = (0x3C0DDBA1, 0x3C5EA5ED, 0x3C1CEB0B, 0x3C0FF1CE)


def _fill_pattern(tensor: torch.Tensor, words: tuple) -> bytes:
    pattern = torch.tensor(words, dtype=torch.int64).to(torch.int32)
    flat = tensor.detach().view(-1).view(torch.int32)
    with torch.no_grad():
        flat.copy_(pattern.repeat(flat.numel() // len(words) + 1)[: flat.numel()])
    return pattern.numpy().tobytes()


class _Wide(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.big = nn.Linear(width, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        return self.head(torch.relu(self.big(x)))


def _wide_model(width: int) -> tuple[nn.Module, list[bytes]]:
    model = _Wide(width)
    patterns = [_fill_pattern(model.big.weight, _WEIGHT_WORDS), _fill_pattern(model.big.bias, _BIAS_WORDS)]
    return model, patterns


def _infer(model, x):
    return model(x)


def _train(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss


def _encodings(pattern: bytes) -> list[bytes]:
    """The pattern as raw bytes and as base64 at every 3-byte alignment."""
    raw = pattern * 6  # 96 bytes
    forms = [pattern * 2]
    for shift in range(3):
        encoded = base64.b64encode(raw[shift:])
        forms.append(encoded[8:72])  # skip the edges, where alignment changes the text
    return forms


class TestNoWeightsLeave(TestCase):
    SMALL, LARGE = 64, 1024

    def _check(self, backend: str, fn) -> None:
        sizes = {}
        for width in (self.SMALL, self.LARGE):
            model, patterns = _wide_model(width)
            x = torch.randn(2, width)
            python_code, cache = torch_precompile.precompile(fn, model, x, backend=backend)
            blobs = {"python_code": python_code.encode(), "cache": bytes(cache)}
            for where, blob in blobs.items():
                for pattern in patterns:
                    for form in _encodings(pattern):
                        self.assertNotIn(form, blob, msg=f"width {width}: {where} contains parameter bytes")
            sizes[width] = {where: len(blob) for where, blob in blobs.items()}
            # ... and the artifact still computes with the live weights.
            runnable = torch_precompile.load(python_code, cache)
            ref, got = copy.deepcopy(model), copy.deepcopy(model)
            torch.testing.assert_close(runnable(got, x), fn(ref, x))
        param_growth = 4 * (self.LARGE**2 - self.SMALL**2)
        self.assertGreater(param_growth, 4_000_000)
        for where in ("python_code", "cache"):
            growth = sizes[self.LARGE][where] - sizes[self.SMALL][where]
            self.assertLess(
                growth,
                1024,
                msg=f"{where} grew by {growth} bytes while the parameters grew by {param_growth} bytes",
            )

    def test_eager_inference(self):
        self._check("eager", _infer)

    def test_eager_training_step(self):
        self._check("eager", _train)

    def test_inductor_inference(self):
        self._check("inductor", _infer)


if __name__ == "__main__":
    run_tests()
