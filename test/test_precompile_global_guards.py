# Owner(s): ["module: dynamo"]
"""Global state and tensor values fn reads while traced (issue 27 rows 2-5, 10, 11).

Each row ends in eager's result with eager's side effects, or in a
``PrecompileError`` before any state changes, on both backends: grad and
inference mode fn queries, reseeding the RNG inside fn, activation
checkpointing around dropout (honoured: the recomputation reuses the
forward's numbers), ``saved_tensors_hooks`` around a call, tensor values
turned into Python (forward and a custom Function's backward; Mixtral and
Qwen2-MoE training steps) and value-dependent sizes (boolean masks,
``nonzero``, DeBERTa-v2's loss).  See Note [precompile programming model],
invariants 11 and 12.  Artifacts are compiled once per process.
"""

import functools
import logging
import re
import unittest

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint
from torch._dynamo.decorators import mark_unbacked
from torch.overrides import TorchFunctionMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.utils._python_dispatch import TorchDispatchMode

import torch_precompile
from torch_precompile import _precompile_compat as compat, PrecompileError

try:
    import transformers
except ImportError:  # installed in the torch 2.13 environment only
    transformers = None
needs_transformers = unittest.skipIf(transformers is None, "transformers is not installed")


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
logging.getLogger("torch_precompile._precompile").setLevel(logging.ERROR)  # load() warns by design
HERE = r"test_precompile_global_guards\.py:\d+"

_RUNNABLES: dict = {}


def _runnable(fn, make_inputs, backend, key=None):
    """Capture and load each (fn or key, backend) once per test process."""
    key = (key or fn, backend)
    if key not in _RUNNABLES:
        _RUNNABLES[key] = precompile.load(*precompile(fn, *make_inputs(), backend=backend))
    return _RUNNABLES[key]


def _snapshot(*objects):
    """Bit-exact copies of what a call could write: tensors, module state and .grad, the global RNG."""
    copies = [torch.get_rng_state()]
    for obj in objects:
        tensors = dict(obj.state_dict(keep_vars=True)) if isinstance(obj, nn.Module) else {"input": obj}
        for name, t in tensors.items():
            copies += [t.detach().clone(), None if t.grad is None else t.grad.clone()]
    return copies


def _linear():
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def _x():
    return torch.randn(3, 4)


def _step(model, x):
    loss = model(x).pow(2).sum()
    loss.backward()
    return loss


# Torch function and dispatch modes around a call


def _mul_by_three(x):
    return x.mul(3)


class _Double(TorchFunctionMode):
    """Doubles what Tensor.mul returns: eager fn's result changes under it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.Tensor.mul else out


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _bn_linear():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))


# Row 2: grad / inference mode queried by fn


def _forward(model, x):
    return model(x)


def _grad_branch(model, x):
    return model(x) * (2.0 if torch.is_grad_enabled() else 3.0)


def _grad_branch_c(model, x):
    return model(x) * (2.0 if torch._C.is_grad_enabled() else 3.0)


def _inference_branch(model, x):
    return model(x) * (3.0 if torch.is_inference_mode_enabled() else 2.0)


def _own_no_grad_query(model, x):
    with torch.no_grad():  # answers False whatever the caller's mode
        scale = 2.0 if torch.is_grad_enabled() else 3.0
    return model(x) * scale


# Row 3: the RNG reseeded or restored inside fn


def _seeds_then_draws(x):
    torch.manual_seed(0)
    return F.dropout(x, 0.5)


def _forks_around_a_draw(x):
    with torch.random.fork_rng():
        return F.dropout(x, 0.5)


def _restores_after_a_draw(x):
    state = torch.get_rng_state()
    y = F.dropout(x, 0.5)
    torch.set_rng_state(state)
    return y


def _seeds_last(x):
    y = F.dropout(x, 0.5)
    torch.manual_seed(0)
    return y


def _own_generator(x):
    generator = torch.Generator().manual_seed(0)
    return x + torch.randn(x.shape, generator=generator)


def _reads_rng_state_and_draws(x):
    with torch.random.fork_rng():  # restores the state it saw: no draw inside
        torch.get_rng_state()
    return F.dropout(x, 0.5) + torch.rand_like(x)


# Row 4: activation checkpointing around random ops


class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool, dropout: bool = True, activation=None, context_fn=checkpoint.noop_context_fn):
        super().__init__()
        torch.manual_seed(0)
        self.inner, self.outer = nn.Linear(4, 4), nn.Linear(4, 4)
        self.reentrant, self.dropout = reentrant, dropout
        self.activation = activation
        self.context_fn = context_fn

    def region(self, h):
        h = self.outer(h)
        if self.activation is not None:
            h = self.activation(h)
        return F.dropout(h, 0.5, training=True) if self.dropout else torch.tanh(h)

    def forward(self, x):
        h = self.inner(x)  # the checkpointed input requires grad (reentrant needs one)
        return checkpoint.checkpoint(self.region, h, use_reentrant=self.reentrant, context_fn=self.context_fn)


def _ckpt_nonreentrant():
    return _Checkpointed(False)


def _ckpt_reentrant():
    return _Checkpointed(True)


def _ckpt_without_randomness():
    return _Checkpointed(False, dropout=False)


def _ckpt_rrelu():
    return _Checkpointed(True, dropout=False, activation=lambda h: F.rrelu(h, training=True))


def _save_matmuls(ctx, op, *args, **kwargs):
    saved = op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return checkpoint.CheckpointPolicy.MUST_SAVE if saved else checkpoint.CheckpointPolicy.PREFER_RECOMPUTE


def _ckpt_selective():
    """Selective activation checkpointing: the matmul saved, dropout (a draw, then in-place ops
    on its mask) recomputed."""
    contexts = functools.partial(checkpoint.create_selective_checkpoint_contexts, _save_matmuls)
    return _Checkpointed(False, activation=torch.relu, context_fn=contexts)


# Row 5: saved-tensor hooks


def _to_bf16(t):
    return t.to(torch.bfloat16)


def _from_bf16(t):
    return t.to(torch.float32)


def _step_packing_in_bf16(model, x):
    with torch.autograd.graph.saved_tensors_hooks(_to_bf16, _from_bf16):
        loss = model(x).pow(2).sum()
    loss.backward()
    return loss


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))


# Row 10: tensor values turned into Python


class _ScaleByOffsets(torch.autograd.Function):
    """transformers' CPU grouped-mm fallback: backward reads ctx.offs.tolist()."""

    @staticmethod
    def forward(ctx, x, offs):
        ctx.offs = offs
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        first = ctx.offs.tolist()[0]
        return grad * first, None


def _backward_tolist(model, x, offs):
    loss = _ScaleByOffsets.apply(model(x), offs).sum()
    loss.backward()
    return loss


def _scales_by_first_sum(model, x):
    y = model(x)
    return y * y.sum(0).tolist()[0]


def _iterates_rows(model, x):
    return torch.stack([row * i for i, row in enumerate(model(x))])


def _moe_step(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss


def _mixtral(experts):
    config = transformers.MixtralConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=16,
    )
    config._experts_implementation = experts
    return transformers.MixtralForCausalLM(config)


def _qwen2_moe(experts):
    config = transformers.Qwen2MoeConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=16,
    )
    config._experts_implementation = experts
    return transformers.Qwen2MoeForCausalLM(config)


# Row 11: sizes that depend on tensor values


def _masked_sum(model, x, keep):
    return model(x)[keep].sum()


def _nonzero_rows(model, x):
    y = model(x)
    return y[(y[:, 0] > 0).nonzero()[:, 0]].sum()


def _labelled_rows(logits, labels):
    """DeBERTa-v2's sequence-classification loss."""
    label_index = (labels >= 0).nonzero()
    labeled = torch.gather(logits, 0, label_index.expand(label_index.size(0), logits.size(1)))
    return F.cross_entropy(labeled, torch.gather(labels, 0, label_index.view(-1)))


def _deberta_step(model, ids, labels):
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss


def _masked_where(model, x, keep):
    return torch.where(keep[:, None], model(x), 0).sum()


def _fp32_region(x, w):
    with torch.autocast("cpu", enabled=False):  # "compute this part in fp32"
        return x.float() @ w.float()


def _bf16_region(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x @ w


def _process_dtype_region(x, w):
    with torch.autocast("cpu"):  # the dtype torch.set_autocast_dtype("cpu", ...) set
        return x @ w


def _autocast_switched_on(x, w):
    torch.set_autocast_enabled("cpu", True)
    y = x @ w
    torch.set_autocast_enabled("cpu", False)
    return y


def _lstm_under_autocast(lstm, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return lstm(x)[0]


def _lstm_in_fp32_region(lstm, x):
    with torch.autocast("cpu", enabled=False):
        return lstm(x.float())[0]


def _fp32_head_step(model, x):
    h = model[0](x)
    with torch.autocast("cpu", enabled=False):
        out = model[1](h.float())
    loss = out.pow(2).mean()
    loss.backward()
    return loss


def _two_linears():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))


class TestGlobalGuards(TestCase):
    def assertRefused(self, regex, call, *touched):
        """``call()`` raises a PrecompileError matching ``regex`` and writes nothing (nor draws)."""
        before = _snapshot(*touched)
        with self.assertRaisesRegex(PrecompileError, regex):
            call()
        for old, new in zip(before, _snapshot(*touched), strict=True):
            self.assertTrue(old is new if old is None or new is None else old.equal(new), "a refused call wrote")

    def assertCaptureRefused(self, regex, fn, *inputs, backend):
        self.assertRefused(regex, lambda: precompile(fn, *inputs, backend=backend), *inputs)

    def assertSameStep(self, f, fn, make_model, *inputs, **grad_tolerance):
        """f and fn from the same seed: same result, .grad (within ``grad_tolerance``) and RNG afterwards."""
        model, ref = make_model(), make_model()
        torch.manual_seed(5)
        out = f(model, *inputs)
        state = torch.get_rng_state()
        torch.manual_seed(5)
        expected = fn(ref, *inputs)
        torch.testing.assert_close(out, expected)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name, **grad_tolerance)
        self.assertTrue(torch.equal(state, torch.get_rng_state()), "the global RNG differs from eager's")

    @parametrize("backend", BACKENDS)
    def test_grad_mode_read_by_fn_is_checked(self, backend):
        """Row 2: a forward that queried grad mode runs only in the mode it was traced in."""
        model, x = _linear(), _x()
        for fn in (_grad_branch, _grad_branch_c):
            f = _runnable(fn, lambda: (_linear(), _x()), backend)
            self.assertRegex(f.convention.grad_mode_read, rf"^ at .*{HERE} \(return model\(x\) \* ")
            torch.testing.assert_close(f(model, x), fn(model, x))
            for context, where in ((torch.no_grad, r"torch\.no_grad\(\)"), (torch.inference_mode, r"torch\.inference_mode\(\)")):
                with context():
                    self.assertRefused(
                        rf"^called under {where}, but fn reads torch\.is_grad_enabled\(\) at .*{HERE} \(return "
                        r"model\(x\).*captured with grad mode enabled: the graph follows that branch",
                        lambda: f(model, x), model, x,
                    )
        f = _runnable(_inference_branch, lambda: (_linear(), _x()), backend)
        self.assertEqual(f.convention.grad_mode_read, "")
        with torch.no_grad():  # not the mode fn read
            torch.testing.assert_close(f(model, x), _inference_branch(model, x))
        with torch.inference_mode():
            self.assertRefused(
                rf"^called under torch\.inference_mode\(\), but fn reads torch\.is_inference_mode_enabled\(\) at .*{HERE}",
                lambda: f(model, x), model, x,
            )
        # Answers that no caller changes (fn's own no_grad) and forwards that never ask: honoured.
        for fn in (_own_no_grad_query, _forward):
            f = _runnable(fn, lambda: (_linear(), _x()), backend)
            self.assertEqual((f.convention.grad_mode_read, f.convention.inference_mode_read), ("", ""))
            with torch.no_grad():
                torch.testing.assert_close(f(model, x), fn(model, x))

    @parametrize("backend", BACKENDS)
    def test_reseeding_the_rng_inside_fn_is_refused_at_capture(self, backend):
        """Row 3: the graph draws from one continuing global generator; fn moving it is refused."""
        x = _x()
        self.assertCaptureRefused(
            rf"^fn draws random numbers \(aten\.bernoulli_\.float\) at .*{HERE} \(return F\.dropout\(x, 0\.5\)\) "
            r"after the cpu RNG was reseeded or restored inside fn \(torch\.manual_seed, set_rng_state, "
            rf"fork_rng; last: torch\.manual_seed\(\) at .*{HERE} \(torch\.manual_seed\(0\)\)\): the artifact "
            r"draws from one continuing global generator",
            _seeds_then_draws, x, backend=backend,
        )
        torch.manual_seed(0)  # the generator is where fn's manual_seed(0) puts it: still seen
        self.assertCaptureRefused(r"^fn draws random numbers \(aten\.bernoulli_\.float\)", _seeds_then_draws, x, backend=backend)
        for fn, last in (
            (_forks_around_a_draw, r"torch\.set_rng_state\(\) at .* \(with torch\.random\.fork_rng\(\):\)"),
            (_restores_after_a_draw, r"torch\.set_rng_state\(\) at .* \(torch\.set_rng_state\(state\)\)"),
            (_seeds_last, r"torch\.manual_seed\(\) at .* \(torch\.manual_seed\(0\)\)"),
        ):
            self.assertCaptureRefused(
                r"^fn leaves the cpu RNG where its random ops would not: it reseeds or restores the generator "
                rf"\(torch\.manual_seed, set_rng_state, fork_rng; last: {last}\) and the artifact's graph",
                fn, x, backend=backend,
            )
        self.assertCaptureRefused(
            rf"^fn draws random numbers \(aten\.randn\.generator\) from its own torch\.Generator at .*{HERE}",
            _own_generator, x, backend=backend,
        )
        # Reading the state, or forking without drawing, changes nothing: honoured like eager.
        f = _runnable(_reads_rng_state_and_draws, lambda: (_x(),), backend)
        torch.manual_seed(3)
        out = f(x)
        state = torch.get_rng_state()
        torch.manual_seed(3)
        torch.testing.assert_close(out, _reads_rng_state_and_draws(x))
        self.assertTrue(torch.equal(state, torch.get_rng_state()))

    @parametrize("backend", BACKENDS)
    def test_checkpointed_dropout_replays_the_forward_mask(self, backend):
        """Row 4: the recomputation reuses the forward's random numbers, as eager's does."""
        x = _x()
        for make_model in (_ckpt_nonreentrant, _ckpt_reentrant, _ckpt_without_randomness):
            f = _runnable(_step, lambda: (make_model(), _x()), backend, key=make_model)
            self.assertSameStep(f, _step, make_model, x)
        # A recomputed op whose numbers depend on tensor values cannot be replayed.
        self.assertCaptureRefused(
            r"^fn draws random numbers \(aten\.rrelu_with_noise\.default\) at .* from an earlier RNG state "
            r"again \(torch\.utils\.checkpoint recomputing a region\)",
            _step, _ckpt_rrelu(), x, backend=backend,
        )

    @parametrize("backend", BACKENDS)
    def test_selective_checkpointing_around_dropout_is_honoured(self, backend):
        """Row 4: selective checkpointing recomputes as in eager, not as under torch.compile,
        whose trace keeps every output and trips on dropout's in-place mask (a RuntimeError)."""
        f = _runnable(_step, lambda: (_ckpt_selective(), _x()), backend, key=_ckpt_selective)
        self.assertSameStep(f, _step, _ckpt_selective, _x())

    @parametrize("backend", BACKENDS)
    def test_saved_tensors_hooks(self, backend):
        """Row 5: hooks around a training step are refused; hooks inside fn are traced."""
        x = _x()
        f = _runnable(_step, lambda: (_mlp(), _x()), backend)
        g = _runnable(_grad_branch, lambda: (_linear(), _x()), backend)
        model = _mlp()
        with torch.autograd.graph.saved_tensors_hooks(_to_bf16, _from_bf16):
            self.assertRefused(
                r"^called inside torch\.autograd\.graph\.saved_tensors_hooks \(pack hook _to_bf16\), but this "
                r"artifact runs autograd in its compiled graph",
                lambda: f(model, x), model, x,
            )
            # A forward computes the same values with or without them: honoured.
            torch.testing.assert_close(g(_linear(), x), _grad_branch(_linear(), x))
            self.assertCaptureRefused(
                r"^precompile\(\) is called inside torch\.autograd\.graph\.saved_tensors_hooks", _step, _mlp(), x,
                backend=backend,
            )
        if backend == "inductor" and not compat.INDUCTOR_KEEPS_ROUNDING_CASTS:
            self.assertCaptureRefused(
                r"^fn rounds a torch\.float32 tensor to torch\.bfloat16 and casts it back \(at .*line \d+, in _step_packing_in_bf16\): "
                r"torch .*'s Inductor drops that rounding",
                _step_packing_in_bf16, _mlp(), x, backend=backend,
            )
            return
        h = _runnable(_step_packing_in_bf16, lambda: (_mlp(), _x()), backend)
        self.assertSameStep(h, _step_packing_in_bf16, _mlp, x)
        plain, packed = _mlp(), _mlp()
        _step(plain, x)
        _step_packing_in_bf16(packed, x)
        self.assertFalse(torch.equal(plain[0].weight.grad, packed[0].weight.grad))  # the hooks matter

    @parametrize("backend", BACKENDS)
    def test_tensor_values_turned_into_python_are_refused(self, backend):
        """Row 10: every conversion of a traced tensor to Python, forward and backward."""
        x = _x()
        conversions = {
            ".tolist()": lambda t: t.tolist()[0][0],
            ".numpy()": lambda t: t.detach().numpy()[0, 0],
            "np.asarray": lambda t: np.asarray(t.detach())[0, 0],
            "DLPack": lambda t: np.from_dlpack(t.detach())[0, 0],
            ".item()": lambda t: t[0, 0].item(),
            "float()": lambda t: float(t[0, 0]),
            "int()": lambda t: int(t[0, 0]),
            "bool()": lambda t: bool(t[0, 0] > 0),
            "__index__": lambda t: [1.0, 2.0][(t[0, 0] > 0).long()],
        }
        for name, convert in conversions.items():
            def fn(model, x):
                y = model(x)
                return y * convert(y)

            how = r"with \.(tolist|numpy|__dlpack__)\(\)" if name in (".tolist()", ".numpy()", "np.asarray", "DLPack") else r"\(`if tensor:`"
            with self.subTest(name):
                model = _linear()
                self.assertCaptureRefused(rf"^fn uses the value of a tensor as a Python value at .*{HERE}.* {how}", fn, model, x, backend=backend)
        model = _linear()
        self.assertCaptureRefused(
            rf"^fn uses the value of a tensor as a Python value at .*{HERE} \(first = ctx\.offs\.tolist\(\)\[0\]\) with \.tolist\(\)",
            _backward_tolist, model, x, torch.tensor([2.0, 1.0]), backend=backend,
        )
        # Iterating gives tensors: traced, nothing baked.
        f = _runnable(_iterates_rows, lambda: (_linear(), _x()), backend)
        other = torch.randn(3, 4)
        torch.testing.assert_close(f(model, other), _iterates_rows(model, other))

    @needs_transformers
    @parametrize("backend", BACKENDS)
    def test_moe_training_steps_are_refused(self, backend):
        """Row 10: Mixtral / Qwen2-MoE route tokens through Python values: refused, never wrong."""
        ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
        refusals = {
            # one_hot's class-value check is in the graph; the experts a batch hits are a nonzero() count
            "eager": r"^fn makes a tensor whose size depends on tensor values \(aten\.nonzero\.default: .* at "
            r".*modeling_{}\.py:\d+ \(expert_hit = .*\.nonzero\(\)\)",
            "grouped_mm": r"^fn uses the value of a tensor as a Python value at .*integrations/moe\.py:\d+ \(for i, end in enumerate\(ctx\.offs\.tolist\(\)\):\) with \.tolist\(\)",
        }
        for make_model, name in ((_mixtral, "mixtral"), (_qwen2_moe, "qwen2_moe")):
            for experts, regex in refusals.items():
                with self.subTest(name, experts=experts):
                    torch.manual_seed(0)
                    self.assertCaptureRefused(regex.format(name), _moe_step, make_model(experts), ids, backend=backend)

    @parametrize("backend", BACKENDS)
    def test_value_dependent_sizes_are_refused(self, backend):
        """Row 11: boolean masks and nonzero give sizes the artifact would bake."""
        model, x = _linear(), _x()
        keep = torch.tensor([True, False, True])
        suffix = r": the artifact would bake the example's size\. Keep sizes fixed: mask instead of selecting \(torch\.where"
        for fn, inputs, op, line in (
            (_masked_sum, (model, x, keep), "aten.index.Tensor", r"return model\(x\)\[keep\]\.sum\(\)"),
            (_nonzero_rows, (model, x), "aten.nonzero.default", r"return y\[\(y\[:, 0\] > 0\)\.nonzero"),
            (_labelled_rows, (torch.randn(2, 3), torch.tensor([0, -1])), "aten.nonzero.default", r"label_index = \(labels >= 0\)"),
        ):
            self.assertCaptureRefused(
                rf"^fn makes a tensor whose size depends on tensor values \({re.escape(op)}: .* at .*{HERE} \({line}.*{suffix}",
                fn, *inputs, backend=backend,
            )
        # The fixed-size way the message suggests works, for any mask.
        f = _runnable(_masked_where, lambda: (_linear(), _x(), keep), backend)
        other = torch.tensor([False, True, True])
        torch.testing.assert_close(f(model, x, other), _masked_where(model, x, other))

    @needs_transformers
    @parametrize("backend", BACKENDS)
    def test_deberta_v2_loss_is_refused(self, backend):
        """Row 11: DeBERTa-v2's classification loss selects the labelled rows with nonzero()."""
        config = transformers.DebertaV2Config(
            vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=16, num_labels=3,
        )
        torch.manual_seed(0)
        self.assertCaptureRefused(
            r"^fn makes a tensor whose size depends on tensor values \(aten\.nonzero\.default: .* at "
            r".*modeling_deberta_v2\.py:\d+ \(label_index = \(labels >= 0\)\.nonzero\(\)\)",
            _deberta_step, transformers.DebertaV2ForSequenceClassification(config),
            torch.randint(0, 100, (2, 8)), torch.tensor([0, 2]), backend=backend,
        )

    def test_symbolic_traces(self):
        """Rows 10 and 11 with a mark_unbacked dim (inductor's symbolic trace): .tolist() is
        .item() per element, an unbacked value computed at every call; value-dependent sizes
        are refused."""
        model, x = _linear(), torch.randn(3, 4)
        mark_unbacked(x, 0)
        self.assertCaptureRefused(
            rf"^fn makes a tensor whose size depends on tensor values \(aten\.nonzero\.default: .* at .*{HERE}",
            _nonzero_rows, model, x, backend="inductor",
        )
        f = precompile.load(*precompile(_scales_by_first_sum, model, x, backend="inductor"))
        for rows in (3, 6):
            other = torch.randn(rows, 4)
            torch.testing.assert_close(f(model, other), _scales_by_first_sum(model, other))


    def test_modes_active_at_a_call_are_refused(self):
        """Torch function and dispatch modes around a call (a default device too): eager fn runs
        every op through them, the graph would not; refused whatever the backend, before any
        state changes, naming the kind of mode and the fix."""
        f = _runnable(_mul_by_three, lambda: (torch.ones(2),), "eager")
        x = torch.ones(2)
        with _Double():
            torch.testing.assert_close(_mul_by_three(x), torch.full((2,), 6.0))  # what eager computes under it
            self.assertRefused(
                r"^called while a torch function mode is active \(_Double, a TorchFunctionMode\): eager fn would "
                r"run every torch call through it, the artifact's graph would bypass it\. Call the artifact "
                r"outside the mode, or call fn eagerly under it",
                lambda: f(x), x,
            )
        device_refused = (
            r"^called with a default device \(meta: inside `with torch\.device\('meta'\):` or after "
            r"torch\.set_default_device\('meta'\)\), a torch function mode .* the artifact's graph would bypass "
            r"it .* Call the artifact outside that context / with torch\.set_default_device\(None\), or call fn "
            r"eagerly there"
        )
        with torch.device("meta"):
            self.assertRefused(device_refused, lambda: f(x), x)
        torch.set_default_device("meta")
        try:
            self.assertRefused(device_refused, lambda: f(x), x)
        finally:
            torch.set_default_device(None)
        with _Passthrough():
            self.assertRefused(
                r"^called while a torch dispatch mode is active \(_Passthrough, a TorchDispatchMode\): eager fn "
                r"would run every operator through it, the artifact's graph would bypass it .*Call the artifact "
                r"outside the mode, or call fn eagerly under it",
                lambda: f(x), x,
            )
        torch.testing.assert_close(f(x), torch.full((2,), 3.0))  # outside them: runs
        # A training step with running stats: nothing written before the refusal.
        g = _runnable(_step, lambda: (_bn_linear(), _x()), "eager")
        model, inputs = _bn_linear(), _x()
        for mode in (_Double, _Passthrough, lambda: torch.device("cpu")):
            with mode():
                self.assertRefused(r"^called (while a torch (function|dispatch) mode is active|with a default device)",
                                   lambda: g(model, inputs), model, inputs)
        g(model, inputs)
        self.assertIn("global        torch function and dispatch modes: none active, default device included "
                      "(the graph would bypass them)", list(map(str, g.checks)))

    @parametrize("backend", BACKENDS)
    def test_graph_captured_under_autocast_is_not_cast_again(self, backend):
        """Captured and called under the caller's autocast, the graph (which holds capture's casts)
        runs with autocast off: fn's fp32 region and its own autocast of another dtype stay as in eager."""
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        for fn, outer in ((_fp32_region, torch.bfloat16), (_bf16_region, torch.float16)):
            with torch.autocast("cpu", dtype=outer):
                f = precompile.load(*precompile(fn, x, w, backend=backend))
                out, expected = f(x, w), fn(x, w)
                self.assertTrue(torch.is_autocast_enabled("cpu"))  # the caller's autocast, as it was
            self.assertEqual(out.dtype, expected.dtype)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
        # A training step: the backward's gradients are fp32 as in eager, written in full.
        with torch.autocast("cpu", dtype=torch.bfloat16):
            f = precompile.load(*precompile(_fp32_head_step, _two_linears(), torch.randn(4, 8), backend=backend))
            # bf16 gradients: Inductor (2.11) may sum a bias gradient in another order than eager.
            bf16_noise = {} if backend == "eager" else {"atol": 1e-4, "rtol": 1.6e-2}
            self.assertSameStep(f, _fp32_head_step, _two_linears, torch.randn(4, 8), **bf16_noise)

    @parametrize("backend", BACKENDS)
    def test_process_autocast_dtype_fn_computes_in_is_checked(self, backend):
        """torch.autocast(device) without a dtype, or fn enabling autocast itself, computes in the
        process's autocast dtype: another one at a call is refused; fn's explicit dtype needs none."""
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        for fn in (_process_dtype_region, _autocast_switched_on):
            f = precompile.load(*precompile(fn, x, w, backend=backend))
            self.assertEqual(f.convention.autocast_dtypes, (("cpu", "bfloat16"),))
            self.assertIn("global        torch.get_autocast_dtype('cpu'): torch.bfloat16 (fn computes in it)",
                          list(map(str, f.checks)))
            out, expected = f(x, w), fn(x, w)
            self.assertEqual(out.dtype, torch.bfloat16)
            torch.testing.assert_close(out, expected, rtol=0, atol=0)
            torch.set_autocast_dtype("cpu", torch.float16)
            try:
                self.assertRefused(
                    r"^torch\.get_autocast_dtype\('cpu'\) is torch\.float16, but it was torch\.bfloat16 at "
                    r"capture.*call torch\.set_autocast_dtype\('cpu', torch\.bfloat16\) first",
                    lambda: f(x, w), x, w,
                )
                g = precompile.load(*precompile(_bf16_region, x, w, backend=backend))
                self.assertEqual(g.convention.autocast_dtypes, ())
                torch.testing.assert_close(g(x, w), _bf16_region(x, w), rtol=0, atol=0)
            finally:
                torch.set_autocast_dtype("cpu", torch.bfloat16)

    @parametrize("backend", BACKENDS)
    def test_lstm_under_cpu_autocast_is_refused(self, backend):
        """Eager runs a CPU LSTM under autocast as MKLDNN's fused layer (a bfloat16 output), which
        the trace (MKLDNN off) cannot record: refused, fn's own autocast or the caller's, leaving
        the caller's autocast as it was; an LSTM in a region with autocast off is honoured."""
        torch.manual_seed(0)
        lstm, x = nn.LSTM(8, 16, batch_first=True), torch.randn(2, 2, 8)
        needle = rf"^fn runs an LSTM \(nn\.LSTM / torch\.lstm\) under torch\.autocast\('cpu'\) at .*{HERE}"
        self.assertCaptureRefused(needle, _lstm_under_autocast, lstm, x, backend=backend)
        with torch.autocast("cpu", dtype=torch.float16):
            self.assertCaptureRefused(needle, lambda lstm, x: lstm(x)[0], lstm, x, backend=backend)
            self.assertTrue(torch.is_autocast_enabled("cpu"))  # the caller's, as it was
            self.assertIs(torch.get_autocast_dtype("cpu"), torch.float16)
            f = precompile.load(*precompile(_lstm_in_fp32_region, lstm, x, backend=backend))
            out, expected = f(lstm, x), _lstm_in_fp32_region(lstm, x)
        self.assertFalse(torch.is_autocast_enabled("cpu"))
        self.assertEqual(out.dtype, expected.dtype)
        torch.testing.assert_close(out, expected)

    def test_fn_leaving_torch_settings_changed_is_refused(self):
        """Eager's call would leave them changed for its caller; no call of the artifact would."""
        changes = {
            r"grad mode changed \(True -> False; restored\)": lambda: torch.set_grad_enabled(False),
            r"the default dtype changed \(torch.float32 -> torch.float64; restored\)": (
                lambda: torch.set_default_dtype(torch.float64)
            ),
            r"deterministic algorithms changed \(\(False, False\) -> \(True, False\); restored\)": (
                lambda: torch.use_deterministic_algorithms(True)
            ),
            r"the cpu autocast dtype changed \(torch.bfloat16 -> torch.float16; restored\)": (
                lambda: torch.set_autocast_dtype("cpu", torch.float16)
            ),
            r"autocast changed \(\(\) -> \(\('cpu', 'bfloat16'\),\); restored\)": (
                lambda: torch.set_autocast_enabled("cpu", True)
            ),
            r"autocast changed \(\(\) -> \(\('cpu', 'float16'\),\); restored\)": (  # entered, never exited
                lambda: torch.autocast("cpu", dtype=torch.float16).__enter__()
            ),
        }
        for needle, change in changes.items():

            def fn(x, change=change):
                change()
                return x * 2

            with self.subTest(needle), self.assertRaisesRegex(PrecompileError, r"^fn leaves " + needle):
                precompile(fn, torch.ones(2), backend="eager")
            self.assertTrue(torch.is_grad_enabled())
            self.assertIs(torch.get_default_dtype(), torch.float32)
            self.assertFalse(torch.are_deterministic_algorithms_enabled())
            # The caller's autocast, as it was: off, its dtype, no block entered.
            self.assertFalse(torch.is_autocast_enabled("cpu"))
            self.assertIs(torch.get_autocast_dtype("cpu"), torch.bfloat16)
            self.assertEqual(torch.autocast_increment_nesting(), 1)
            torch.autocast_decrement_nesting()

    def test_fn_using_the_mkldnn_flag_is_refused(self):
        """The trace runs with MKLDNN off: fn would read False where eager reads the caller's flag,
        and a value fn sets would be hidden by capture's restore."""

        def sets(x):
            torch.backends.mkldnn.enabled = False
            return x * 2

        def reads(x):
            return x * 3 if torch.backends.mkldnn.enabled else x

        enabled = torch.backends.mkldnn.enabled
        for action, fn in (("sets", sets), ("reads", reads)):
            with self.assertRaisesRegex(PrecompileError, rf"^fn {action} torch\.backends\.mkldnn\.enabled at .*{HERE}"):
                precompile(fn, torch.ones(2), backend="eager")
            self.assertEqual(torch.backends.mkldnn.enabled, enabled)

    def test_capture_inside_a_mode_is_refused(self):
        """The trace would bake what a mode around precompile() does (a default device too)."""
        for mode in (_Double, _Passthrough, lambda: torch.device("cpu")):
            with mode(), self.assertRaisesRegex(
                PrecompileError, r"^precompile\(\) is called inside a torch function or dispatch mode"
            ):
                precompile(_mul_by_three, torch.ones(2), backend="eager")


instantiate_parametrized_tests(TestGlobalGuards)


if __name__ == "__main__":
    run_tests()
