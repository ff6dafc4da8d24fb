# Owner(s): ["module: dynamo"]
"""torch.compiler.precompile on real model code, called the way people call it.

Hugging Face ``transformers`` models (random weights from tiny configs, no hub
access) called with padded attention masks, BART without a mask, GPT-2 and T5
training steps with their default dropout; torchvision-style nets written in
plain torch (PyPI's torchvision wheels are CUDA builds that fail to import
beside the CPU torch wheel: "operator torchvision::nms does not exist"): a
MobileNetV3-style net and a ViT on ``nn.TransformerEncoder``; SDPA with
dropout; ``mark_unbacked`` batch / sequence dims; pytree structures the
artifact cannot record; DTensor.

Each case is compared with eager: outputs, every parameter's ``.grad``,
buffers (BatchNorm running stats), and parameters after 3 SGD and 3 AdamW
steps.  Random ops are compared under the same ``torch.manual_seed``.
Artifacts are compiled once per process (an Inductor compile costs 10-40 s
here); the Hugging Face training steps carry the ``slow`` marker.
"""

import collections
import copy
import logging
import os
import tempfile

import pytest
import transformers

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._dynamo.decorators import mark_unbacked
from torch_precompile import PrecompileError
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile
from _precompile_testing import needs_mark_bounds


BACKENDS = ("eager", "inductor")
# Inductor fuses and reorders reductions; AdamW amplifies tiny grad differences.
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}

# load() warns at every call by design; keep the test log readable.
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


def _bert():
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=16,
    )
    return transformers.BertModel(config)


def _gpt2():
    config = transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=16, bos_token_id=1, eos_token_id=2
    )
    return transformers.GPT2LMHeadModel(config)  # default dropout 0.1, SDPA attention


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
    )
    return transformers.LlamaForCausalLM(config)


def _bart():
    config = transformers.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16,
    )
    return transformers.BartForConditionalGeneration(config)


def _t5():
    config = transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        scale = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(scale))))


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act=nn.Hardswish):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV3 block: expand, depthwise, squeeze-excite, project."""

    def __init__(self, channels: int, expanded: int):
        super().__init__()
        self.block = nn.Sequential(
            _conv_bn(channels, expanded, 1),
            _conv_bn(expanded, expanded, 3, groups=expanded),
            SqueezeExcite(expanded, expanded // 4),
            _conv_bn(expanded, channels, 1, act=None),
        )

    def forward(self, x):
        return x + self.block(x)


class TinyMobileNetV3(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(3, 8, 3, stride=2), InvertedResidual(8, 16), InvertedResidual(8, 24))
        self.classifier = nn.Sequential(nn.Linear(8, 16), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(16, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class GlobalAveragePool(nn.Module):
    # Not nn.Flatten: .flatten() of a free batch dim needs min=1 (see TestFreeDims).
    def forward(self, x):
        return x.mean((2, 3))


class TinyViT(nn.Module):
    """torchvision's vit_b_16 layout: patch conv, class token, pre-norm nn.TransformerEncoder."""

    def __init__(self, patch: int = 4, image: int = 16, dim: int = 32, classes: int = 4):
        super().__init__()
        self.patchify = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        tokens = self.patchify(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.class_token.expand(x.shape[0], -1, -1), tokens], dim=1) + self.position
        return self.head(self.encoder(tokens)[:, 0])


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, dropout: float = 0.2):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


# ---------------------------------------------------------------------------
# Cases: fn, model, inputs per seed (same shapes, new values)
# ---------------------------------------------------------------------------


def _ids(seed: int, shape=(2, 8)):
    return torch.randint(1, 100, shape, generator=torch.Generator().manual_seed(seed))


def _padding_mask(seed: int):
    """Right padding, a different pattern per seed: the mask is a runtime input."""
    lengths = [(8, 5), (3, 8), (6, 6)][seed % 3]
    return torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])


def _images(seed: int, batch: int = 2):
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def _hidden(seed: int):
    return torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(seed))


def _labels(seed: int, n: int = 2):
    return torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(seed + 7))


def _bert_infer(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


def _causal_lm_infer(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def _bart_infer(model, ids, decoder_ids):
    return model(input_ids=ids, decoder_input_ids=decoder_ids, use_cache=False).logits


def _lm_train(model, ids, mask):
    out = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
    out.loss.backward()
    return out.loss.detach()


def _seq2seq_train(model, ids, labels):
    out = model(input_ids=ids, labels=labels, use_cache=False)
    out.loss.backward()
    return out.loss.detach()


def _classify_train(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def _infer(model, x):
    return model(x)


def _attention_train(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()


Case = collections.namedtuple("Case", "make_model fn make_inputs train")

CASES = {
    "bert": Case(_bert, _bert_infer, lambda s: (_ids(s), _padding_mask(s)), False),
    "gpt2": Case(_gpt2, _causal_lm_infer, lambda s: (_ids(s), _padding_mask(s)), False),
    "llama": Case(_llama, _causal_lm_infer, lambda s: (_ids(s), _padding_mask(s)), False),
    "bart_no_mask": Case(_bart, _bart_infer, lambda s: (_ids(s), _ids(s + 50, (2, 6))), False),
    "gpt2_train": Case(_gpt2, _lm_train, lambda s: (_ids(s), _padding_mask(s)), True),
    "t5_train": Case(_t5, _seq2seq_train, lambda s: (_ids(s), _ids(s + 50, (2, 6))), True),
    # Each layer draws for LayerDrop in training (layerdrop 0: the draw never drops it).
    "bart_train": Case(_bart, _seq2seq_train, lambda s: (_ids(s), _ids(s + 50, (2, 6))), True),
    "mobilenet_eval": Case(TinyMobileNetV3, _infer, lambda s: (_images(s),), False),
    "mobilenet_train": Case(TinyMobileNetV3, _classify_train, lambda s: (_images(s), _labels(s)), True),
    "vit_eval": Case(TinyViT, _infer, lambda s: (_images(s),), False),
    "vit_train": Case(TinyViT, _classify_train, lambda s: (_images(s), _labels(s)), True),
    "sdpa_dropout_train": Case(CausalSelfAttention, _attention_train, lambda s: (_hidden(s),), True),
}

_ARTIFACTS: dict = {}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = CASES[name].make_model()
    return model.train(CASES[name].train)


def _precompiled(key, fn, model, *inputs, backend):
    """(runnable, None) or (None, error); compiled once per process."""
    if key not in _ARTIFACTS:
        try:
            python_code, cache = torch_precompile.precompile(fn, model, *inputs, backend=backend)
            _ARTIFACTS[key] = (torch_precompile.load(python_code, cache), None)
        except Exception as error:  # reported by every test that needs it
            _ARTIFACTS[key] = (None, error)
    runnable, error = _ARTIFACTS[key]
    if error is not None:
        raise error
    return runnable


def _assert_same_state(ref: nn.Module, got: nn.Module, what: str) -> None:
    ref_params = dict(ref.named_parameters())
    for name, param in got.named_parameters():
        expected = ref_params[name]
        torch.testing.assert_close(param, expected, **TOLERANCE, msg=lambda m: f"{what}: {name}: {m}")
        assert (param.grad is None) == (expected.grad is None), f"{what}: {name}.grad presence differs"
        if expected.grad is not None:
            torch.testing.assert_close(param.grad, expected.grad, **TOLERANCE, msg=lambda m: f"{what}: {name}.grad: {m}")
    ref_buffers = dict(ref.named_buffers())
    for name, buffer in got.named_buffers():
        torch.testing.assert_close(buffer, ref_buffers[name], **TOLERANCE, msg=lambda m: f"{what}: buffer {name}: {m}")


class TestRealModels(TestCase):
    def _runnable(self, name: str, backend: str):
        case = CASES[name]
        return _precompiled((name, backend), case.fn, _model(name), *case.make_inputs(0), backend=backend)

    @parametrize("backend", BACKENDS)
    @parametrize("name", ["bert", "gpt2", "llama", "bart_no_mask", "mobilenet_eval", "vit_eval"])
    def test_inference(self, name, backend):
        case, runnable = CASES[name], self._runnable(name, backend)
        model = _model(name)
        with torch.no_grad():
            for seed in range(3):  # seed 0 was captured; 1 and 2 pad differently
                inputs = case.make_inputs(seed)
                torch.testing.assert_close(
                    runnable(model, *inputs), case.fn(model, *inputs), **TOLERANCE, msg=lambda m: f"seed {seed}: {m}"
                )

    @parametrize("backend", BACKENDS)
    @parametrize("name", ["mobilenet_train", "vit_train", "sdpa_dropout_train"])
    def test_training(self, name, backend):
        self._check_training(name, backend)

    @pytest.mark.slow
    @parametrize("backend", BACKENDS)
    @parametrize("name", ["gpt2_train", "t5_train", "bart_train"])
    def test_hf_training(self, name, backend):
        self._check_training(name, backend)

    def _check_training(self, name, backend):
        """3 steps with SGD, then with AdamW: loss, grads, buffers and parameters match eager."""
        case, runnable = CASES[name], self._runnable(name, backend)
        # Attention key biases have a zero gradient in exact arithmetic (softmax
        # ignores a per-query constant): float noise, which AdamW with its default
        # eps=1e-8 normalizes into steps of up to lr, differently on each backend.
        # eps=1e-3 keeps noise steps negligible and real gradients' steps adaptive.
        optimizers = {
            "SGD": lambda params: torch.optim.SGD(params, lr=0.01),
            "AdamW": lambda params: torch.optim.AdamW(params, lr=0.01, eps=1e-3),
        }
        for label, make_optimizer in optimizers.items():
            ref_model, model = _model(name), _model(name)
            ref_opt, opt = make_optimizer(ref_model.parameters()), make_optimizer(model.parameters())
            for step in range(3):
                inputs = case.make_inputs(step)
                torch.manual_seed(100 + step)  # dropout draws the same masks in both
                expected = case.fn(ref_model, *inputs)
                torch.manual_seed(100 + step)
                loss = runnable(model, *inputs)
                what = f"{label} step {step}"
                torch.testing.assert_close(loss, expected, **TOLERANCE, msg=lambda m: f"{what}: {m}")
                _assert_same_state(ref_model, model, what)
                for o in (ref_opt, opt):
                    o.step()
                    o.zero_grad()
            _assert_same_state(ref_model, model, f"{label} after 3 steps")

    @parametrize("backend", BACKENDS)
    def test_model_output_returned_whole(self, backend):
        model = _model("bert").eval()
        ids, mask = CASES["bert"].make_inputs(0)

        def fn(model, ids, mask):
            return model(input_ids=ids, attention_mask=mask)

        runnable = _precompiled(("bert_output", backend), fn, model, ids, mask, backend=backend)
        ours, theirs = runnable(model, ids, mask), fn(model, ids, mask)
        self.assertIs(type(ours), type(theirs))
        self.assertEqual(list(ours.keys()), list(theirs.keys()))
        for key in theirs.keys():
            torch.testing.assert_close(ours[key], theirs[key], **TOLERANCE)


class TestNumerics(TestCase):
    """Issue 13 item 4: where the eager backend differed from eager PyTorch, and why."""

    def test_mobilenet_train_first_call_after_capture(self):
        # Seen once: backend="eager" 0.015 apart from eager PyTorch on mobilenet_v3_small,
        # train mode, batch 2.  Measured cause: not BatchNorm over 2 samples, hardswish
        # or the decompositions, but the classifier's Dropout(0.2).  The capture runs
        # fn for real, and before commit 638ffc4 its dropout drew from the caller's
        # global generator, so `manual_seed(s); precompile(...); load(...)(...)` used
        # other masks than `manual_seed(s); fn(...)`.  Measured with the code before
        # that commit: this net (batch 2, 3x16x16) loss 0.0125 apart, grads up to
        # 0.106; a plain-torch copy of torchvision's mobilenet_v3_small (batch 2,
        # 3x224x224) logits 0.016 apart -- the spread of eager itself under two
        # seeds (0.019).  Capture now restores the caller's RNG: loss, grads and
        # running stats measured bit-identical (difference 0.0, also for
        # mobilenet_v3_small at 32, 64 and 224 pixels and after 3 SGD / AdamW
        # steps); TOLERANCE leaves room for kernels picked by buffer alignment.
        torch.manual_seed(0)
        model = TinyMobileNetV3().train()
        x, y = _images(0), _labels(0)
        ref = copy.deepcopy(model)
        torch.manual_seed(0)
        expected = _classify_train(ref, x, y)
        torch.manual_seed(0)
        runnable = torch_precompile.load(
            *torch_precompile.precompile(_classify_train, copy.deepcopy(model), x, y, backend="eager")
        )
        loss = runnable(model, x, y)
        torch.testing.assert_close(loss, expected, **TOLERANCE)
        _assert_same_state(ref, model, "first call after capture")
        # The check can fail: other dropout masks move the loss far beyond TOLERANCE.
        other = copy.deepcopy(ref)
        torch.manual_seed(1)
        self.assertGreater((_classify_train(other, x, y) - expected).abs().item(), 1e-3)


class TestFreeDims(TestCase):
    """mark_unbacked dims on real nets (backend='inductor')."""

    @needs_mark_bounds
    def test_conv_net_batch_dim(self):
        model = _model("mobilenet_eval")
        x = _images(0)
        mark_unbacked(x, 0, min=1)
        runnable = _precompiled("mobilenet_free_batch", _infer, model, x, backend="inductor")
        with torch.no_grad():
            for batch in (2, 1, 5):
                y = _images(batch, batch)
                torch.testing.assert_close(runnable(model, y), model(y), **TOLERANCE, msg=lambda m: f"batch {batch}: {m}")

    def test_training_with_common_losses_and_no_min(self):
        # .sum() / .mean() backward fill a ones-like of the output's size; a mark
        # without min=1 cannot rule out an empty batch.  (BatchNorm in train
        # mode needs min=1 at capture: it checks for more than one value per channel.)
        def step(model, x):
            out = model(x)
            loss = out.sum() + out.mean() + (out**2).sum()
            loss.backward()
            return loss.detach()

        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), GlobalAveragePool(), nn.Linear(8, 3))
        x = _images(0)
        mark_unbacked(x, 0)
        runnable = _precompiled("conv_losses_free_batch", step, model, x, backend="inductor")
        ref = copy.deepcopy(model)
        for batch in (2, 3):
            y = _images(batch, batch)
            torch.testing.assert_close(runnable(model, y), step(ref, y), **TOLERANCE)
            _assert_same_state(ref, model, f"batch {batch}")

    @needs_mark_bounds
    def test_channels_last_conv_net_batch_dim(self):
        # A free dim pins the input's memory format (its strides vary with the size).
        def step(model, x):
            loss = model(x).square().mean()
            loss.backward()
            return loss.detach()

        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3))
        model = model.to(memory_format=torch.channels_last)
        x = _images(0).contiguous(memory_format=torch.channels_last)
        mark_unbacked(x, 0, min=1)
        runnable = _precompiled("channels_last_free_batch", step, model, x, backend="inductor")
        self.assertEqual(runnable.convention.inputs[0].tensor.memory_format, "channels_last")
        ref = copy.deepcopy(model)
        for batch in (2, 5):
            y = _images(batch, batch).contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(runnable(model, y), step(ref, y), **TOLERANCE)
            _assert_same_state(ref, model, f"batch {batch}")
        with self.assertRaisesRegex(PrecompileError, r"args\[1\]: expected a tensor in channels_last memory format"):
            runnable(model, _images(2, 2))

    @needs_mark_bounds
    def test_transformer_sequence_dim(self):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        x = torch.randn(2, 8, 32)
        mark_unbacked(x, 1, min=1, max=16)
        runnable = _precompiled("encoder_free_seq", _infer, model, x, backend="inductor")
        with torch.no_grad():
            for length in (8, 3, 16):
                y = torch.randn(2, length, 32)
                torch.testing.assert_close(runnable(model, y), model(y), **TOLERANCE)

    @needs_mark_bounds
    def test_shape_id_bounds_combine(self):
        def fn(model, x, y):
            return model(x) + y

        model = nn.Linear(4, 4)
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        mark_unbacked(x, 0, min=2, shape_id="batch")
        mark_unbacked(y, 0, max=8, shape_id="batch")
        runnable = _precompiled("shape_id_bounds", fn, model, x, y, backend="inductor")
        x5, y5 = torch.randn(5, 4), torch.randn(5, 4)
        torch.testing.assert_close(runnable(model, x5, y5), fn(model, x5, y5))
        for batch in (1, 9):
            with self.assertRaisesRegex(PrecompileError, r"outside the bounds \[2, 8\]"):
                runnable(model, torch.randn(batch, 4), torch.randn(batch, 4))

    @needs_mark_bounds
    def test_shape_id_bounds_without_common_size_refused(self):
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        mark_unbacked(x, 0, min=6, shape_id="batch")
        mark_unbacked(y, 0, max=4, shape_id="batch")
        with self.assertRaisesRegex(PrecompileError, r"shape_id 'batch' .* no size in common: min=6 > max=4"):
            torch_precompile.precompile(lambda m, x, y: m(x) + y, nn.Linear(4, 4), x, y)


class _OpaqueContext:
    def __init__(self, a):
        self.a = a


pytree.register_pytree_node(
    _OpaqueContext,
    lambda n: ([n.a], object()),
    lambda children, _: _OpaqueContext(*children),
    serialized_type_name=f"{__name__}._OpaqueContext",
    flatten_with_keys_fn=lambda n: ([(pytree.GetAttrKey("a"), n.a)], object()),
)


class TestStructures(TestCase):
    """Pytree structures the artifact cannot name are refused by argument, with the fix.

    Plain namedtuples and nodes without serialized_type_name or keys are
    recorded by import path (test_precompile_structures.py); what load could
    not import or compare is refused.
    """

    def test_unrecordable_inputs_refused(self):
        x = torch.randn(2, 4)
        local_pair = collections.namedtuple("LocalPair", "a b")
        cases = [
            (local_pair(x, x), r"the class \S+\.LocalPair, which cannot be imported by that name \(\S+ defines no such name; defined inside a function\?\).*define it at module level"),
            (_OpaqueContext(x), r"_OpaqueContext whose context <object object at 0x.*> has no stable repr.*to_dumpable_context"),
        ]
        for value, message in cases:
            with self.subTest(type(value).__name__):
                with self.assertRaisesRegex(PrecompileError, r"^args\[2\]: .*" + message):
                    torch_precompile.precompile(lambda m, t, v: m(t), nn.Linear(4, 4), x, value, backend="eager")

    def test_unrecordable_output_refused(self):
        with self.assertRaisesRegex(PrecompileError, r"^fn's output: .*not a Python literal or a class, so load could not rebuild it"):
            torch_precompile.precompile(lambda m, x: _OpaqueContext(m(x)), nn.Linear(4, 4), torch.randn(2, 4), backend="eager")


class TestTensorSubclasses(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._store = tempfile.NamedTemporaryFile(delete=False)
        dist.init_process_group("gloo", init_method=f"file://{cls._store.name}", rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        os.unlink(cls._store.name)
        super().tearDownClass()

    def _dtensor_case(self):
        from torch.distributed.tensor import distribute_module, distribute_tensor, init_device_mesh, Replicate

        mesh = init_device_mesh("cpu", (1,))
        model = distribute_module(nn.Linear(4, 4), mesh)
        return model, distribute_tensor(torch.randn(2, 4), mesh, [Replicate()])

    def test_dtensor_eager(self):
        model, x = self._dtensor_case()
        python_code, cache = torch_precompile.precompile(_infer, model, x, backend="eager")
        out = torch_precompile.load(python_code, cache)(model, x)
        self.assertEqual(type(out).__name__, "DTensor")
        torch.testing.assert_close(out.full_tensor(), model(x).full_tensor())

    def test_tensor_parallel_on_a_one_rank_mesh(self):
        """parallelize_module's hooks run in the trace; the parameters are lifted as their local shards."""
        from torch.distributed.tensor import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module, RowwiseParallel

        mesh = init_device_mesh("cpu", (1,))
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
        model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(2, 4)
        for backend in ("eager", "inductor"):
            runnable = torch_precompile.load(*torch_precompile.precompile(_infer, model, x, backend=backend))
            torch.testing.assert_close(runnable(model, x), model(x), msg=backend)

    def test_dtensor_inductor_refused(self):
        model, x = self._dtensor_case()
        with self.assertRaisesRegex(PrecompileError, r"parameter 'weight' is a DTensor: .*backend='eager'"):
            torch_precompile.precompile(_infer, model, x, backend="inductor")


instantiate_parametrized_tests(TestRealModels)


if __name__ == "__main__":
    run_tests()
