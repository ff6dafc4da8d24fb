# Owner(s): ["module: dynamo"]
"""The whole training iteration in one artifact: optimizers as arguments.

Proves Note [precompile programming model] invariant 11: after every call the
parameters, ``.grad`` and optimizer state (``step`` included) equal eager's
after the same eager iteration, on both backends, with an LR scheduler, with
and without zero_grad inside fn, across state_dict checkpoints; options the
trace cannot reproduce are refused with a PrecompileError.  Artifacts are
built once per test process (``_artifact``); models stay tiny.
"""

import copy
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)

import torch_precompile

from torch_precompile import PrecompileError
from _precompile_testing import small_mlp


precompile = torch_precompile.precompile
BACKENDS = ("eager", "inductor")
# Adam/AdamW trace the capturable formulation (float32 bias corrections) and
# foreach SGD multiplies then adds (eager fuses alpha into the add): float noise
# against eager.  Single-tensor SGD on backend='eager' is bit-exact.
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}
BIT_EXACT_ON_EAGER = ("sgd", "sgd_nesterov")

_ARTIFACTS: dict = {}
_global_optimizer = None  # test_optimizer_argument_reached_around_fn_is_refused


def _groups(model):
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}]


OPTIMIZERS = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
    "sgd_momentum_foreach": lambda m: torch.optim.SGD(
        m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2, foreach=True
    ),
    "sgd_nesterov": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=1e-2),
    "adam_foreach_amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True, foreach=True),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    "adamw_foreach_groups": lambda m: torch.optim.AdamW(_groups(m), lr=1e-2, foreach=True),
}


def train_step_no_zero_grad(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    return train_step_no_zero_grad(model, opt, x, y)


def train_step_zero_grad_last(model, opt, x, y):
    loss = train_step_no_zero_grad(model, opt, x, y)
    opt.zero_grad(set_to_none=True)
    return loss


def _data(seed=1, n=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(n)]


def _artifact(key, fn, config, backend):
    """Captured from a fresh model and optimizer; built once per process."""
    if (key, config, backend) not in _ARTIFACTS:
        model = small_mlp()
        opt = OPTIMIZERS[config](model)
        x, y = _data()[0]
        _ARTIFACTS[(key, config, backend)] = precompile(fn, model, opt, x, y, backend=backend)
    return precompile.load(*_ARTIFACTS[(key, config, backend)])


def _pair(config):
    """Two identical (model, optimizer, scheduler) triples: artifact side, eager side."""
    triples = []
    for _ in range(2):
        model = small_mlp()
        opt = OPTIMIZERS[config](model)
        triples.append((model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)))
    return triples


class OptimizerTestCase(TestCase):
    def assert_same_training_state(self, model, opt, ref_model, ref_opt, exact=False):
        tolerance = {"atol": 0, "rtol": 0} if exact else TOLERANCE
        for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
            self.assertEqual(p, q, **tolerance, msg=f"parameter {name}")
            self.assertEqual(p.grad, q.grad, **tolerance, msg=f"grad of {name}")
        state, ref_state = opt.state_dict(), ref_opt.state_dict()
        self.assertEqual(state["param_groups"], ref_state["param_groups"])
        self.assertEqual(sorted(state["state"]), sorted(ref_state["state"]))
        for index, entry in state["state"].items():
            self.assertEqual(sorted(entry), sorted(ref_state["state"][index]))
            for key, value in entry.items():
                self.assertEqual(value, ref_state["state"][index][key], **tolerance, msg=f"state[{index}][{key!r}]")

    def assert_refused_unchanged(self, message, step, model, opt, *inputs):
        """step(model, opt, *inputs) refused with ``message``; model and optimizer bit-identical afterwards."""
        before = copy.deepcopy((model.state_dict(), opt.state_dict()))
        with self.assertRaisesRegex(PrecompileError, message):
            step(model, opt, *inputs)
        self.assertEqual((model.state_dict(), opt.state_dict()), before, atol=0, rtol=0)


class TestOptimizerSemantics(OptimizerTestCase):
    @parametrize("backend", BACKENDS)
    @parametrize("config", list(OPTIMIZERS))
    def test_five_iterations_with_scheduler_match_eager(self, backend, config):
        step = _artifact("zero_grad", train_step, config, backend)
        (model, opt, sched), (ref_model, ref_opt, ref_sched) = _pair(config)
        for x, y in _data(n=5):
            loss = step(model, opt, x, y)
            ref_loss = train_step(ref_model, ref_opt, x, y)
            sched.step()
            ref_sched.step()
            self.assertEqual(loss, ref_loss, **TOLERANCE)
            self.assert_same_training_state(
                model, opt, ref_model, ref_opt, exact=config in BIT_EXACT_ON_EAGER and backend == "eager"
            )

    @parametrize("backend", BACKENDS)
    @parametrize("config", ("sgd_momentum_foreach", "adamw"))
    def test_initial_lr_of_a_scheduler_at_capture_is_not_checked(self, backend, config):
        # An LR scheduler made before capture adds initial_lr, which the step never reads: a call
        # without it, or with another value, is eager's.  What the step reads stays checked.
        model = small_mlp()
        opt = OPTIMIZERS[config](model)
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        x, y = _data()[0]
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend=backend))
        for initial_lr in (None, 0.5):
            model, ref_model = small_mlp(), small_mlp()
            opt, ref_opt = OPTIMIZERS[config](model), OPTIMIZERS[config](ref_model)
            if initial_lr is not None:
                opt.param_groups[0]["initial_lr"] = ref_opt.param_groups[0]["initial_lr"] = initial_lr
            for x, y in _data(n=3):
                self.assertEqual(step(model, opt, x, y), train_step(ref_model, ref_opt, x, y), **TOLERANCE)
                self.assert_same_training_state(model, opt, ref_model, ref_opt)
        opt.param_groups[0]["weight_decay"] = 0.5
        self.assert_refused_unchanged(
            r"args\[1\] \(optimizer\) param_groups\[0\]\['weight_decay'\]: expected 0.01 \(baked at capture\), got 0.5",
            step, model, opt, x, y,
        )

    @parametrize("backend", BACKENDS)
    def test_without_zero_grad_inside_fn(self, backend):
        step = _artifact("no_zero_grad", train_step_no_zero_grad, "adamw", backend)
        (model, opt, _), (ref_model, ref_opt, _) = _pair("adamw")
        for i, (x, y) in enumerate(_data(n=5)):
            if i % 2 == 0:  # odd calls accumulate onto the previous call's grads, like eager
                opt.zero_grad()
                ref_opt.zero_grad()
            step(model, opt, x, y)
            train_step_no_zero_grad(ref_model, ref_opt, x, y)
            self.assert_same_training_state(model, opt, ref_model, ref_opt)

    @parametrize("backend", BACKENDS)
    def test_zero_grad_after_the_step_inside_fn(self, backend):
        step = _artifact("zero_grad_last", train_step_zero_grad_last, "sgd_momentum_foreach", backend)
        (model, opt, _), (ref_model, ref_opt, _) = _pair("sgd_momentum_foreach")
        for x, y in _data(n=3):
            step(model, opt, x, y)
            train_step_zero_grad_last(ref_model, ref_opt, x, y)
            self.assert_same_training_state(model, opt, ref_model, ref_opt)
            self.assertTrue(all(p.grad is None for p in model.parameters()))

    @parametrize("backend", BACKENDS)
    def test_resume_from_checkpoint_and_state_dict_round_trip(self, backend):
        step = _artifact("zero_grad", train_step, "adamw", backend)
        data = _data(n=6)
        # Resume: an eager checkpoint loaded into the runtime optimizer.
        (ref_model, ref_opt, _), _ = _pair("adamw")
        for x, y in data[:3]:
            train_step(ref_model, ref_opt, x, y)
        model = copy.deepcopy(ref_model)
        opt = OPTIMIZERS["adamw"](model)
        opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # as if saved and loaded
        for x, y in data[3:5]:
            step(model, opt, x, y)
            train_step(ref_model, ref_opt, x, y)
            self.assert_same_training_state(model, opt, ref_model, ref_opt)
        # The artifact's state_dict continues identically in a fresh eager optimizer.
        eager_model = copy.deepcopy(model)
        eager_opt = OPTIMIZERS["adamw"](eager_model)
        eager_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        x, y = data[5]
        step(model, opt, x, y)
        train_step(eager_model, eager_opt, x, y)
        self.assert_same_training_state(model, opt, eager_model, eager_opt)

    def test_capture_with_existing_state_leaves_caller_untouched(self):
        model = small_mlp()
        opt = OPTIMIZERS["adam"](model)
        x, y = _data()[0]
        train_step(model, opt, x, y)  # state exists at capture
        ref_model, ref_state = copy.deepcopy(model), copy.deepcopy(opt.state_dict())
        for p, q in zip(model.parameters(), ref_model.parameters()):
            q.grad = p.grad.clone()  # deepcopy drops .grad
        pair = precompile(train_step, model, opt, x, y, backend="eager")
        for p, q in zip(model.parameters(), ref_model.parameters()):
            self.assertEqual(p, q, atol=0, rtol=0)
            self.assertEqual(p.grad, q.grad, atol=0, rtol=0)
        self.assertEqual(opt.state_dict(), ref_state, atol=0, rtol=0)
        self.assertTrue(all(p is q for p, q in zip(opt.param_groups[0]["params"], model.parameters())))
        self.assertFalse(torch.compiler.is_compiling())
        ref_opt = OPTIMIZERS["adam"](ref_model)
        ref_opt.load_state_dict(ref_state)
        step = precompile.load(*pair)
        step(model, opt, x, y)
        train_step(ref_model, ref_opt, x, y)
        self.assert_same_training_state(model, opt, ref_model, ref_opt)

    def test_optimizer_restored_when_fn_raises(self):
        def fails_after_step(model, opt, x, y):
            train_step(model, opt, x, y)
            raise ValueError("boom")

        model = small_mlp()
        opt = OPTIMIZERS["sgd_nesterov"](model)
        groups, state = opt.param_groups[0].copy(), opt.state
        with self.assertRaisesRegex(ValueError, "boom"):
            precompile(fails_after_step, model, opt, *_data()[0], backend="eager")
        self.assertIs(opt.state, state)
        self.assertEqual(len(opt.state), 0)
        self.assertEqual(opt.param_groups[0].keys(), groups.keys())
        self.assertTrue(all(opt.param_groups[0][k] is groups[k] for k in groups))
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        self.assertFalse(torch.compiler.is_compiling())

    def test_parameter_without_gradient_gets_no_state(self):
        def step_first_layer(model, opt, x):
            opt.zero_grad()
            model[0](x).sum().backward()
            opt.step()

        model = small_mlp()
        opt = OPTIMIZERS["adamw"](model)
        x, _ = _data()[0]
        ref_model = copy.deepcopy(model)
        ref_opt = OPTIMIZERS["adamw"](ref_model)
        step = precompile.load(*precompile(step_first_layer, model, opt, x, backend="eager"))
        for _ in range(2):
            step(model, opt, x)
            step_first_layer(ref_model, ref_opt, x)
        self.assertEqual(len(opt.state), 2)
        self.assert_same_training_state(model, opt, ref_model, ref_opt)

    @staticmethod
    def first_layer_step(zero_grad):
        """model[2] gets no gradient; what AdamW does with it depends on whether its .grad is None."""

        def step(model, opt, x):
            if zero_grad == "kept":
                opt.zero_grad(set_to_none=False)
            model[0](x).sum().backward()
            opt.step()
            if zero_grad == "after_step":
                opt.zero_grad()

        return step

    def three_steps_beside_eager(self, zero_grad, grads=False):
        """The first-layer step captured and run 3 times beside eager's (``grads``: every
        .grad a zeros tensor, not None, from the start); the artifact side's step, model, opt, x."""
        fn = self.first_layer_step(zero_grad)
        model, ref_model = small_mlp(), small_mlp()
        if grads:
            for p in (*model.parameters(), *ref_model.parameters()):
                p.grad = torch.zeros_like(p)
        opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref_model)
        x, _ = _data()[0]
        step = precompile.load(*precompile(fn, model, opt, x, backend="eager"))
        for _ in range(3):
            step(model, opt, x)
            fn(ref_model, ref_opt, x)
        self.assert_same_training_state(model, opt, ref_model, ref_opt)
        return step, model, opt, x

    @parametrize("zero_grad", ("never", "after_step", "kept"))
    def test_parameter_backward_skips_is_stepped_as_its_grad_says(self, zero_grad):
        # Eager's AdamW decays every parameter it steps: one whose .grad is None it skips.
        step, model, opt, x = self.three_steps_beside_eager(zero_grad)
        self.assertIsNone(model[2].weight.grad)
        self.assertEqual(len(opt.state), 2)
        self.assertIn("grad          args[0].2.weight.grad: None, as at capture", map(str, step.checks))
        model[2].weight.grad = torch.zeros_like(model[2].weight)
        self.assert_refused_unchanged(r"args\[0\]\.2\.weight\.grad is a tensor, which was None at capture", step, model, opt, x)

    def test_parameter_backward_skips_keeps_its_captured_grad(self):
        step, model, opt, x = self.three_steps_beside_eager("kept", grads=True)
        self.assertEqual(len(opt.state), 4)
        model[2].bias.grad = None
        self.assert_refused_unchanged(r"args\[0\]\.2\.bias\.grad is None, which was a tensor at capture", step, model, opt, x)

    def test_frozen_parameter_keeps_no_grad(self):
        # Eager's step uses a .grad left on a parameter that no longer requires grad.
        fn = self.first_layer_step("never")
        model = small_mlp()
        model[2].requires_grad_(False)
        opt = OPTIMIZERS["sgd"](model)
        x, _ = _data()[0]
        model[2].weight.grad = torch.ones_like(model[2].weight)
        with self.assertRaisesRegex(PrecompileError, r"args\[0\]\.2\.weight does not require grad but has a \.grad"):
            precompile(fn, model, opt, x, backend="eager")
        model[2].weight.grad = None
        ref_model = copy.deepcopy(model)
        ref_opt = OPTIMIZERS["sgd"](ref_model)
        step = precompile.load(*precompile(fn, model, opt, x, backend="eager"))
        step(model, opt, x)
        fn(ref_model, ref_opt, x)
        self.assert_same_training_state(model, opt, ref_model, ref_opt, exact=True)
        model[2].weight.grad = torch.ones_like(model[2].weight)
        self.assert_refused_unchanged(r"args\[0\]\.2\.weight\.grad is a tensor, which was None at capture", step, model, opt, x)

    @parametrize("backend", BACKENDS)
    def test_adam_step_at_lr_zero_is_eagers(self, backend):
        # The trace steps Adam/AdamW in torch's capturable formulation, which divides by lr: at
        # lr 0 (the first step of a warmup from 0) an element whose gradient has been 0 (an
        # embedding row no batch used) would become 0/0 = NaN, where eager's step leaves the
        # parameter as it is.  A NaN gradient makes eager's parameter NaN at lr 0 too.
        def step_fn(model, opt, x, y):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        torch.manual_seed(0)
        x, y = torch.tensor([[1, 2, 3]]), torch.randn(1, 3, 2)  # rows 0 and 4..9 get no gradient
        configs = {
            "Adam": lambda params: torch.optim.Adam(params, lr=1e-3),
            "AdamW_amsgrad": lambda params: torch.optim.AdamW(params, lr=1e-3, amsgrad=True, weight_decay=0.1),
        }
        for name, make in configs.items():
            with self.subTest(name):
                model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
                eager_model = copy.deepcopy(model)
                opt, eager_opt = make(model.parameters()), make(eager_model.parameters())
                step = precompile.load(*precompile(step_fn, model, opt, x, y, backend=backend))
                warmups = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: s / 10) for o in (opt, eager_opt)]
                before = [p.clone() for p in model.parameters()]
                for call in range(3):
                    self.assertEqual(opt.param_groups[0]["lr"], call * 1e-4)
                    torch.testing.assert_close(step(model, opt, x, y), step_fn(eager_model, eager_opt, x, y))
                    self.assert_same_training_state(model, opt, eager_model, eager_opt)
                    if call == 0:  # at lr 0 the parameters stay, the moments and step advance
                        for p, old in zip(model.parameters(), before):
                            torch.testing.assert_close(p, old, atol=0, rtol=0)
                        self.assertEqual(opt.state[model[1].weight]["step"], torch.tensor(1.0))
                    for scheduler in warmups:
                        scheduler.step()
                self.assertFalse(any(p.isnan().any() for p in model.parameters()))
                for o in (opt, eager_opt):
                    o.param_groups[0]["lr"] = 0.0
                nan_y = torch.full_like(y, float("nan"))
                step(model, opt, x, nan_y)
                step_fn(eager_model, eager_opt, x, nan_y)
                self.assert_same_training_state(model, opt, eager_model, eager_opt)
                self.assertTrue(model[1].weight.isnan().all())


class TestOptimizerContract(OptimizerTestCase):
    """Refused at capture, or at the call, with the argument, group and key named."""

    def capture(self, opt_fn, fn=train_step, model=None):
        model = model or small_mlp()
        x, y = _data()[0]
        return precompile(fn, model, opt_fn(model), x, y, backend="eager")

    def test_refused_options(self):
        cases = {
            "'fused'": lambda m: torch.optim.Adam(m.parameters(), fused=True),
            "'differentiable'": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, differentiable=True),
            "'capturable'": lambda m: torch.optim.AdamW(m.parameters(), capturable=True),
            "'dampening'": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.1),
            "is a Tensor": lambda m: torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01)),
            "RMSprop is not supported": lambda m: torch.optim.RMSprop(m.parameters()),
            "momentum / amsgrad per group": lambda m: torch.optim.SGD(
                [{"params": m[0].parameters(), "momentum": 0.9}, {"params": m[2].parameters()}], lr=0.1
            ),
        }
        for needle, opt_fn in cases.items():
            with self.subTest(needle), self.assertRaisesRegex(PrecompileError, r"args\[1\] \(optimizer\).*" + needle):
                self.capture(opt_fn)

    def test_a_parameter_twice_in_the_groups_is_refused(self):
        # torch only warns about it; eager's step updates it once per occurrence through one
        # state entry, the artifact would give each occurrence a state input of its own.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with self.assertRaisesRegex(
                PrecompileError, r"param_groups\[0\]\['params'\]\[1\] is param_groups\[0\]\['params'\]\[0\] again"
            ):
                self.capture(lambda m: torch.optim.SGD([m[0].weight, *m.parameters()], lr=0.1, momentum=0.9))

    def test_adam_over_float16_parameters_is_refused(self):
        # The traced capturable step divides sqrt(exp_avg_sq) by lr times the bias corrections in
        # the parameters' dtype: in float16 that overflows at lr 1e-5, and the element never moves.
        for cls in (torch.optim.Adam, torch.optim.AdamW):
            with self.subTest(cls.__name__), self.assertRaisesRegex(
                PrecompileError, rf"param_groups\[0\]\['params'\]\[0\] is float16: precompile traces {cls.__name__}'s capturable"
            ):
                model = small_mlp().half()
                precompile(train_step_no_zero_grad, model, cls(model.parameters(), lr=1e-5), *_data()[0], backend="eager")

    def test_optimizer_over_named_parameters_is_refused_saying_so(self):
        with self.assertRaisesRegex(
            PrecompileError, r"param_groups\[0\] has 'param_names': an optimizer built from named_parameters\(\) is not supported"
        ):
            self.capture(lambda m: torch.optim.SGD(m.named_parameters(), lr=0.1))

    def test_parameters_outside_module_arguments_are_refused(self):
        stray = nn.Parameter(torch.zeros(3))
        with self.assertRaisesRegex(PrecompileError, r"param_groups\[0\]\['params'\]\[4\].*not a parameter"):
            self.capture(lambda m: torch.optim.SGD([*m.parameters(), stray], lr=0.1))

    def test_free_dims_are_refused(self):
        model = small_mlp()
        x, y = _data()[0]
        torch._dynamo.decorators.mark_unbacked(x, 0)
        with self.assertRaisesRegex(PrecompileError, "optimizer argument together with mark_unbacked"):
            precompile(train_step, model, OPTIMIZERS["adamw"](model), x, y, backend="inductor")

    def test_optimizer_or_module_in_a_container_is_refused(self):
        # Only fn's own arguments are lifted; registering the class as a pytree node would not do it.
        model = small_mlp()
        x, y = _data()[0]
        cases = [
            (lambda m, state, x, y: train_step(m, state["opt"], x, y), (model, {"opt": OPTIMIZERS["sgd"](model)}),
             r"^args\[1\]\['opt'\] is an optimizer \(SGD\) inside a container: .*pass it as one"),
            (lambda ms, x, y: F.cross_entropy(ms[0](x), y), ([model],),
             r"^args\[0\]\[0\] is an nn\.Module \(Sequential\) inside a container: .*pass it as one"),
        ]
        for fn, args, message in cases:
            with self.subTest(message), self.assertRaisesRegex(PrecompileError, message):
                precompile(fn, *args, x, y, backend="eager")

    def test_optimizer_argument_reached_around_fn_is_refused(self):
        # At capture the closure's / global's optimizer is the argument, so its step() is traced as
        # the argument's; called with another optimizer, eager fn would step the one it closed over.
        global _global_optimizer
        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["sgd"](model)
        _global_optimizer = opt

        def global_step(model, opt, x, y):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            _global_optimizer.step()

        held = {"opt": opt}

        def closure_step(model, opt, x, y):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            held["opt"].step()

        cases = [
            (global_step, r"^fn's global '_global_optimizer' is the optimizer argument args\[1\]: "),
            (closure_step, r"^fn's closure variable 'held' holds the optimizer argument args\[1\]: "),
        ]
        try:
            for fn, message in cases:
                with self.subTest(message), self.assertRaisesRegex(PrecompileError, message + r".*Reach it through fn's argument"):
                    precompile(fn, model, opt, x, y, backend="eager")
                self.assertIs(type(opt), torch.optim.SGD)
                self.assertEqual(len(opt.state), 0)
        finally:
            _global_optimizer = None

    def test_step_or_zero_grad_set_on_the_optimizer_is_refused(self):
        # fn's opt.step() runs what the instance holds (a wrapper clipping or scaling the grads):
        # the trace would bake the one found at capture, and no call would see another one, or
        # one added later.  torch's LR scheduler wrapper of the class's step stays allowed.
        def halving(opt):
            step = opt.step

            def halved_step(closure=None):
                with torch.no_grad():
                    for group in opt.param_groups:
                        for p in group["params"]:
                            p.grad.mul_(0.5)
                return step(closure)

            return halved_step

        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["sgd"](model)
        opt.step = halving(opt)
        with self.assertRaisesRegex(
            PrecompileError, r"^args\[1\] \(optimizer\): its step\(\) is set on the optimizer itself \(.*halving\.<locals>\.halved_step\), "
        ):
            precompile(train_step, model, opt, x, y, backend="eager")
        del opt.step
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # wraps opt.step on the instance
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend="eager"))
        step(model, opt, x, y)
        for name, method in (("step", halving(opt)), ("zero_grad", lambda set_to_none=True: None)):
            with self.subTest(name):
                kept = opt.__dict__.get(name)
                setattr(opt, name, method)
                self.assert_refused_unchanged(
                    rf"^args\[1\] \(optimizer\): its {name}\(\) is set on the optimizer itself .*"
                    rf"\(del opt\.{name} removes it\); the artifact runs the step traced at capture",
                    step, model, opt, x, y,
                )
                if kept is None:
                    delattr(opt, name)
                else:
                    setattr(opt, name, kept)
        step(model, opt, x, y)

    def test_calls_where_eagers_step_raises_are_refused(self):
        # A beta1 of 1 (eager divides by 1 - beta1 ** step), a plain dict for opt.state
        # without the parameter's entry (eager's _init_group indexes it) and defaults'
        # differentiable (eager's step runs with grad mode on, then writes a leaf): eager raises.
        model = small_mlp()
        x, y = _data()[0]
        step = precompile.load(*precompile(train_step, model, OPTIMIZERS["adam"](model), x, y, backend="eager"))
        edits = {
            r"param_groups\[0\]\['betas'\]\[0\] is 1, where eager's step raises ZeroDivisionError": lambda o: o.param_groups[0].__setitem__("betas", (1.0, 0.999)),
            r"^args\[1\] \(optimizer\)\.state is a dict without an entry for param_groups\[0\]\['params'\]\[0\], where eager's step raises KeyError": lambda o: setattr(o, "state", {}),
            r"^args\[1\] \(optimizer\)\.defaults\['differentiable'\] is True, where eager's step raises RuntimeError.*set it back to False": lambda o: o.defaults.__setitem__("differentiable", True),
        }
        for message, edit in edits.items():
            with self.subTest(message):
                eager_model = copy.deepcopy(model)  # eager raises after backward
                eager_opt = OPTIMIZERS["adam"](eager_model)
                edit(eager_opt)
                with self.assertRaises((ZeroDivisionError, KeyError, RuntimeError)):
                    train_step(eager_model, eager_opt, x, y)
                opt = OPTIMIZERS["adam"](model)
                edit(opt)
                before = copy.deepcopy((model.state_dict(), dict(opt.state), [p.grad for p in model.parameters()]))
                with self.assertRaisesRegex(PrecompileError, message):
                    step(model, opt, x, y)
                self.assertEqual((model.state_dict(), dict(opt.state), [p.grad for p in model.parameters()]), before, atol=0, rtol=0)

    def test_step_hooks_are_refused(self):
        def with_hook(m):
            opt = torch.optim.SGD(m.parameters(), lr=0.1)
            opt.register_step_post_hook(lambda *_: None)
            return opt

        with self.assertRaisesRegex(PrecompileError, "step hooks"):
            self.capture(with_hook)

    def test_step_hooks_added_after_capture_are_refused(self):
        """eager's step() runs the optimizer's own and torch.optim's global step hooks; the graph runs none."""
        model = small_mlp()
        x, y = _data()[0]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend="eager"))
        registrations = (
            (lambda: opt.register_step_pre_hook(lambda *_: None), r"args\[1\] \(optimizer\): it has step hooks"),
            (lambda: opt.register_step_post_hook(lambda *_: None), r"args\[1\] \(optimizer\): it has step hooks"),
            (lambda: register_optimizer_step_pre_hook(lambda *_: None), r"torch.optim has global step hooks"),
            (lambda: register_optimizer_step_post_hook(lambda *_: None), r"torch.optim has global step hooks"),
        )
        for register, message in registrations:
            handle = register()
            try:
                before = copy.deepcopy((model.state_dict(), [p.grad for p in model.parameters()]))
                with self.subTest(message), self.assertRaisesRegex(PrecompileError, message):
                    step(model, opt, x, y)
                after = (model.state_dict(), [p.grad for p in model.parameters()])
                torch.testing.assert_close(after, before)
            finally:
                handle.remove()
        step(model, opt, x, y)

    def test_runtime_optimizer_is_checked(self):
        model = small_mlp()
        x, y = _data()[0]
        step = precompile.load(*precompile(train_step, model, OPTIMIZERS["adamw"](model), x, y, backend="eager"))
        cases = [
            (lambda m: torch.optim.Adam(m.parameters()), r"expected a torch.optim.AdamW"),
            (lambda m: torch.optim.AdamW(_groups(m)), r"expected 1 param groups"),
            (lambda m: torch.optim.AdamW(small_mlp().parameters()), r"param_groups\[0\]\['params'\]"),
            (lambda m: torch.optim.AdamW(m.parameters(), betas=(0.9, 0.99)), r"param_groups\[0\]\['betas'\]\[1\]: expected 0.999"),
            (lambda m: torch.optim.AdamW(m.parameters(), weight_decay=0.5), r"param_groups\[0\]\['weight_decay'\]"),
        ]
        for make, needle in cases:
            with self.subTest(needle), self.assertRaisesRegex(PrecompileError, r"args\[1\] \(optimizer\)"):
                self.assertRaisesRegex(PrecompileError, needle, step, model, make(model), x, y)
                step(model, make(model), x, y)
        for key, needle in (("foreach", r"\['foreach'\]: expected None \(baked at capture\), got missing"),
                            ("lr", r"\['lr'\] is missing, which eager's step would raise KeyError for")):
            opt = OPTIMIZERS["adamw"](model)
            del opt.param_groups[0][key]  # eager's step: KeyError
            before = copy.deepcopy(model.state_dict())
            with self.subTest(key), self.assertRaisesRegex(PrecompileError, needle):
                step(model, opt, x, y)
            self.assertRaises(KeyError, train_step, copy.deepcopy(model), opt, x, y)
            self.assertEqual(model.state_dict(), before, atol=0, rtol=0)
        opt = OPTIMIZERS["adamw"](model)
        train_step(model, opt, x, y)
        opt.state[model[0].weight]["exp_avg"] = opt.state[model[0].weight]["exp_avg"].double()
        with self.assertRaisesRegex(PrecompileError, r"state of param_groups\[0\]\['params'\]\[0\]\['exp_avg'\].*dtype"):
            step(model, opt, x, y)

    def test_lr_of_another_type_is_refused_with_the_fix(self):
        # Eager's step takes these too; the call names the conversion that keeps their value.
        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["sgd"](model)
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend="eager"))
        for lr, kind in ((np.float32(0.05), "numpy.float32"), (torch.tensor(0.05), "torch.Tensor")):
            opt.param_groups[0]["lr"] = lr
            before = copy.deepcopy(model.state_dict())
            with self.subTest(kind), self.assertRaisesRegex(
                PrecompileError,
                rf"^args\[1\] \(optimizer\) param_groups\[0\]\['lr'\]: expected a Python float, got {kind}; "
                r"make it one, .*: opt\.param_groups\[0\]\['lr'\] = float\(opt\.param_groups\[0\]\['lr'\]\)$",
            ):
                step(model, opt, x, y)
            self.assertEqual(model.state_dict(), before, atol=0, rtol=0)
        opt.param_groups[0]["lr"] = float(opt.param_groups[0]["lr"])  # the advised fix
        step(model, opt, x, y)
        # A beta sits in a tuple: the advice replaces the tuple (assigning betas[0] would raise TypeError)
        opt = OPTIMIZERS["adamw"](model)
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend="eager"))
        opt.param_groups[0]["betas"] = (np.float32(0.8), 0.999)
        with self.assertRaisesRegex(
            PrecompileError,
            r"param_groups\[0\]\['betas'\]\[0\]: expected a Python float, got numpy\.float32; make it one, .*: "
            r"opt\.param_groups\[0\]\['betas'\] = tuple\(map\(float, opt\.param_groups\[0\]\['betas'\]\)\)$",
        ):
            step(model, opt, x, y)
        opt.param_groups[0]["betas"] = tuple(map(float, opt.param_groups[0]["betas"]))
        eager_model = copy.deepcopy(model)
        eager_opt = OPTIMIZERS["adamw"](eager_model)
        eager_opt.load_state_dict(opt.state_dict())
        torch.testing.assert_close(step(model, opt, x, y), train_step(eager_model, eager_opt, x, y))
        torch.testing.assert_close(model.state_dict(), eager_model.state_dict())

    def test_scheduler_stepped_inside_fn_is_refused(self):
        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["sgd"](model)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

        def step_and_schedule(model, opt, x, y):
            train_step(model, opt, x, y)
            scheduler.step()

        with self.assertRaisesRegex(PrecompileError, r"^fn steps an LR scheduler at .*scheduler\.step\(\).*outside fn"):
            precompile(step_and_schedule, model, opt, x, y, backend="eager")
        self.assertEqual(opt.param_groups[0]["lr"], 0.1)

    def test_lr_reaches_the_graph_bitwise(self):
        """lr is a graph input re-made when it changes: -0.0 after 0.0 is a change (w - lr * g keeps
        the sign of a zero weight under 0.0 and flips it under -0.0)."""
        def make(lr):
            model = nn.Linear(2, 1, bias=False)
            with torch.no_grad():
                model.weight.copy_(torch.tensor([[-0.0, 1.0]]))
            return model, torch.optim.SGD(model.parameters(), lr=lr, foreach=False)

        def step(model, opt, x):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        x = torch.ones(1, 2)
        f = precompile.load(*precompile(step, *make(0.0), x, backend="eager"))
        for lr in (0.0, -0.0, 0.0):
            (ours, ours_opt), (eager, eager_opt) = make(lr), make(lr)
            f(ours, ours_opt, x)
            step(eager, eager_opt, x)
            self.assertEqual(torch.signbit(ours.weight).tolist(), torch.signbit(eager.weight).tolist(), f"lr={lr}")

    def test_fn_reading_lr_or_a_lifted_hyperparameter_is_refused(self):
        # A Python float in eager's fn; in the trace, the graph input the step reads (a 0-dim
        # float64 tensor): returned, it would be a tensor, loss * lr float64, float(lr) refused
        # as a tensor's value, and grad.mul_(lr) leave the .grad with autograd history.
        uses = [
            ("sgd", "lr", "", lambda opt, loss: opt.param_groups[0]["lr"]),
            ("sgd", "lr", "", lambda opt, loss: loss * opt.param_groups[0]["lr"]),
            ("sgd", "lr", "", lambda opt, loss: -opt.param_groups[0].get("lr")),
            ("adam", "lr", "", lambda opt, loss: float(opt.param_groups[0].setdefault("lr", 0.1))),
            ("adam", "lr", "", lambda opt, loss: [p.grad.mul_(opt.param_groups[0]["lr"]) for p in opt.param_groups[0]["params"]]),
            ("sgd_momentum_foreach", "momentum", "", lambda opt, loss: loss * opt.param_groups[0]["momentum"]),
            ("adamw", "betas", r" \(betas\[0\] of it\)", lambda opt, loss: opt.param_groups[0]["betas"][1]),
        ]
        for name, key, held, use in uses:

            def using_step(model, opt, x, y):
                loss = train_step(model, opt, x, y)
                return loss, use(opt, loss)

            with self.subTest(name=name, key=key):
                self.assert_capture_refused_unchanged(
                    using_step,
                    OPTIMIZERS[name],
                    rf"^fn reads args\[1\]\.param_groups\[0\]\['{key}'\] at .*test_precompile_optimizer\.py:\d+ .*: "
                    rf"the artifact reads it{held} from the optimizer at every call.*read it outside fn and pass it "
                    r"as an argument \(as a tensor, torch\.tensor\(lr, dtype=torch\.float64\), it follows every call",
                )

    def test_shared_state_tensors_are_refused(self):
        # Eager's step updates two state entries sharing one tensor one after the other
        # (a state_dict loaded with shared tensors); the graph updates each as its own.
        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["adam"](model)
        step = precompile.load(*precompile(train_step, model, opt, x, y, backend="eager"))
        step(model, opt, x, y)
        entries = list(opt.state.values())
        for entry in entries[1:]:
            entry["step"] = entries[0]["step"]
        self.assert_refused_unchanged(
            r"state of param_groups\[0\]\['params'\]\[1\]\['step'\] shares memory with .*\['params'\]\[0\]\['step'\]",
            step, model, opt, x, y,
        )
        for entry in entries[1:]:
            entry["step"] = entry["step"].clone()
        step(model, opt, x, y)

    def test_one_optimizer_at_two_positions_or_sharing_state_with_another_is_refused(self):
        # The artifact steps each optimizer argument with its own state inputs: one optimizer
        # passed twice would get its missing state made twice (the second step would not see
        # the first's), and state two optimizers share (a load_state_dict keeps same-dtype
        # tensors) would be read by the second step before the first's update reached it.
        def two_steps(model, first, second, x, y):
            first.zero_grad()
            loss = F.mse_loss(model(x), torch.zeros(6, 4))
            loss.backward()
            first.step()
            second.step()
            return loss.detach()

        x, _ = _data()[0]
        model = small_mlp()
        opt = OPTIMIZERS["sgd_nesterov"](model)
        with self.assertRaisesRegex(PrecompileError, r"^args\[1\] and args\[2\] are the same optimizer"):
            precompile(two_steps, model, opt, opt, x, None, backend="eager")
        self.assertIs(type(opt), torch.optim.SGD)  # capture refused before pointing it at the trace
        self.assertEqual(opt.param_groups[0]["params"], list(model.parameters()))
        step = precompile.load(
            *precompile(two_steps, model, OPTIMIZERS["sgd_nesterov"](model), OPTIMIZERS["sgd_nesterov"](model), x, None, backend="eager")
        )
        self.assert_refused_unchanged(r"^args\[1\] and args\[2\] are the same optimizer", step, model, opt, opt, x, None)
        first, second = OPTIMIZERS["sgd_nesterov"](model), OPTIMIZERS["sgd_nesterov"](model)
        step(model, first, second, x, None)
        second.load_state_dict(first.state_dict())  # shares first's momentum buffers
        before = copy.deepcopy((model.state_dict(), first.state_dict(), second.state_dict()))
        with self.assertRaisesRegex(
            PrecompileError,
            r"^args\[2\] \(optimizer\) state of param_groups\[0\]\['params'\]\[0\]\['momentum_buffer'\] shares "
            r"memory with args\[1\] \(optimizer\) state of param_groups\[0\]\['params'\]\[0\]\['momentum_buffer'\]",
        ):
            step(model, first, second, x, None)
        self.assertEqual((model.state_dict(), first.state_dict(), second.state_dict()), before, atol=0, rtol=0)
        second.load_state_dict(copy.deepcopy(first.state_dict()))
        step(model, first, second, x, None)

    @parametrize("backend", BACKENDS)
    def test_state_sharing_memory_with_a_parameter_or_grad_is_refused(self, backend):
        # The graph updates a state tensor and the parameter (or reads the .grad) as distinct
        # tensors; eager's step would write one through the other.
        model = small_mlp()
        x, y = _data()[0]
        opt = OPTIMIZERS["adam"](model)
        step = precompile.load(*precompile(train_step_no_zero_grad, model, opt, x, y, backend=backend))
        step(model, opt, x, y)
        first = model[0].weight
        cases = (
            ("exp_avg", lambda: first.data, r"\['exp_avg'\] shares memory with args\[0\]\.0\.weight \(parameter\)"),
            ("exp_avg_sq", lambda: first.grad, r"\['exp_avg_sq'\] shares memory with .*\['params'\]\[0\]\.grad"),
        )
        for key, shared, needle in cases:
            with self.subTest(key):
                kept = opt.state[first][key]
                opt.state[first][key] = shared()
                before = copy.deepcopy((model.state_dict(), opt.state_dict(), [p.grad for p in model.parameters()]))
                with self.assertRaisesRegex(
                    PrecompileError, rf"^args\[1\] \(optimizer\) state of param_groups\[0\]\['params'\]\[0\]{needle}; "
                    r"the artifact updates each state tensor as its own: give it a tensor of its own"
                ):
                    step(model, opt, x, y)
                after = (model.state_dict(), opt.state_dict(), [p.grad for p in model.parameters()])
                self.assertEqual(after, before, atol=0, rtol=0)
                opt.state[first][key] = kept
        eager_model = copy.deepcopy(model)
        for p, q in zip(eager_model.parameters(), model.parameters()):
            p.grad = q.grad.clone()  # (a Parameter's deepcopy leaves .grad out)
        eager_opt = OPTIMIZERS["adam"](eager_model)
        eager_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # (a load keeps the state tensors)
        torch.testing.assert_close(step(model, opt, x, y), train_step_no_zero_grad(eager_model, eager_opt, x, y))
        torch.testing.assert_close(model.state_dict(), eager_model.state_dict())

    def test_group_entries_beyond_the_defaults_are_checked(self):
        # fn may read any entry of a param group (here a loss scale kept there): all are baked.
        def scaled_step(model, opt, x, y):
            opt.zero_grad()
            (F.cross_entropy(model(x), y) * opt.param_groups[0]["loss_scale"]).backward()
            opt.step()

        model = small_mlp()
        x, y = _data()[0]
        opt = torch.optim.SGD([{"params": model.parameters(), "loss_scale": 1.0}], lr=0.1)
        step = precompile.load(*precompile(scaled_step, model, opt, x, y, backend="eager"))
        opt.param_groups[0]["loss_scale"] = 4.0
        before = [p.clone() for p in model.parameters()]
        with self.assertRaisesRegex(PrecompileError, r"param_groups\[0\]\['loss_scale'\]: expected 1.0 \(baked at capture\), got 4.0"):
            step(model, opt, x, y)
        self.assertEqual(list(model.parameters()), before, atol=0, rtol=0)

    def test_numpy_group_values_the_step_reads_are_refused_saying_so(self):
        # A numpy float64 is a float: it passed every check until python_code could not write it.
        for opt_fn, entry in (
            (lambda m: torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=np.float64(0.01)), r"\['weight_decay'\]"),
            (lambda m: torch.optim.Adam(m.parameters(), betas=(0.9, np.float64(0.999))), r"\['betas'\]"),
        ):
            with self.subTest(entry):
                self.assert_capture_refused_unchanged(
                    train_step,
                    opt_fn,
                    rf"^args\[1\] \(optimizer\) param_groups\[0\]{entry} holds a numpy.float64 \(.*\), which the "
                    r"artifact bakes and checks at every call as a Python literal: make it a Python float, .*"
                    r"\(float\(value\) for a numpy scalar\)",
                )

    def assert_capture_refused_unchanged(self, fn, opt_fn, message, backend="eager"):
        """precompile(fn) refused with ``message``; model, .grad and optimizer (its group dicts too) as before."""
        model = small_mlp()
        opt = opt_fn(model)
        x, y = _data()[0]
        before = copy.deepcopy((model.state_dict(), opt.state_dict()))
        groups, cls = list(opt.param_groups), type(opt)
        with self.assertRaisesRegex(PrecompileError, message):
            precompile(fn, model, opt, x, y, backend=backend)
        self.assertEqual((model.state_dict(), opt.state_dict()), before, atol=0, rtol=0)
        self.assertTrue(all(g is h for g, h in zip(opt.param_groups, groups, strict=True)))
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        self.assertEqual(len(opt.state), 0)
        self.assertIs(type(opt), cls)

    @parametrize("backend", BACKENDS)
    def test_group_write_inside_fn_is_refused(self, backend):
        # Eager compounds the decay at every call and leaves it in the group; the artifact
        # steps with the group's lr as each call finds it and never writes the group.
        def decaying_step(model, opt, x, y):
            for group in opt.param_groups:
                group["lr"] = group["lr"] * 0.5
            return train_step(model, opt, x, y)

        def warming_step(model, opt, x, y):
            opt.param_groups[0]["lr"] = 0.05
            return train_step(model, opt, x, y)

        model = small_mlp()
        ref_opt = OPTIMIZERS["sgd"](model)
        for lr in (0.05, 0.025):
            decaying_step(model, ref_opt, *_data()[0])
            self.assertEqual(ref_opt.param_groups[0]["lr"], lr)
        self.assert_capture_refused_unchanged(  # the read comes first
            decaying_step,
            OPTIMIZERS["sgd"],
            r"^fn reads args\[1\]\.param_groups\[0\]\['lr'\] at .*test_precompile_optimizer\.py:\d+ "
            r"\(group\[\"lr\"\] = group\[\"lr\"\] \* 0\.5\): .*to change it, step an LR scheduler between calls$",
            backend,
        )
        self.assert_capture_refused_unchanged(
            warming_step,
            OPTIMIZERS["sgd"],
            r"^fn writes args\[1\]\.param_groups\[0\]\['lr'\] at .*test_precompile_optimizer\.py:\d+ "
            r"\(opt\.param_groups\[0\]\[\"lr\"\] = 0\.05\): .*never writes the group.*"
            r"set it outside fn, e\.g\. with an LR scheduler stepped between calls$",
            backend,
        )

    def test_every_kind_of_group_write_inside_fn_is_refused(self):
        writes = {
            r"\['weight_decay'\]": lambda g: g.__setitem__("weight_decay", 0.1),
            r"\['loss_scale'\]": lambda g: g.__setitem__("loss_scale", 2.0),  # a new key
            r"\['maximize'\]": lambda g: g.__delitem__("maximize"),
            r"\['nesterov'\]": lambda g: g.pop("nesterov"),
            r"\['warmup'\]": lambda g: g.setdefault("warmup", 10),
            r" \(\.update\(\)\)": lambda g: g.update(lr=0.2),
            r" \(\|=\)": lambda g: g.__ior__({"lr": 0.2}),
            r" \(\.clear\(\)\)": lambda g: g.clear(),
        }
        for needle, write in writes.items():

            def writing_step(model, opt, x, y):
                write(opt.param_groups[1])
                return train_step(model, opt, x, y)

            with self.subTest(needle):
                self.assert_capture_refused_unchanged(
                    writing_step,
                    lambda m: torch.optim.SGD(_groups(m), lr=0.1),
                    r"^fn writes args\[1\]\.param_groups\[1\]" + needle + r" at .*test_precompile_optimizer\.py:\d+ ",
                )

    def test_group_list_and_closure_writes_inside_fn_are_refused(self):
        def biases_frozen_step(model, opt, x, y):
            opt.param_groups.pop()  # eager steps the weights only, from now on
            return train_step(model, opt, x, y)

        self.assert_capture_refused_unchanged(
            biases_frozen_step,
            lambda m: torch.optim.SGD(_groups(m), lr=0.1),
            r"^fn changes the list args\[1\]\.param_groups \(adds, removes or replaces",
        )
        held = {}  # the caller's group, reached by fn through a closure

        def closure_step(model, opt, x, y):
            held["group"]["lr"] = 0.01
            return train_step(model, opt, x, y)

        def holding_sgd(model):
            opt = OPTIMIZERS["sgd"](model)
            held["group"] = opt.param_groups[0]
            return opt

        self.assert_capture_refused_unchanged(
            closure_step, holding_sgd, r"^fn writes args\[1\]\.param_groups\[0\]\['lr'\] through another reference"
        )

    @staticmethod
    def sgd_with_loss_scale(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.loss_scale = 1.0  # an attribute of the caller's own
        return opt

    @parametrize("backend", BACKENDS)
    def test_optimizer_values_no_call_checks_are_refused(self, backend):
        # Each value changes what eager computes, and a call would not see the change: a key
        # absent at capture (added later), opt.defaults, an attribute of the caller's own.
        def scaled_by(scale):
            def step(model, opt, x, y):
                opt.zero_grad()
                (F.cross_entropy(model(x), y) * scale(opt)).backward()
                opt.step()

            return step

        def eager_weight(fn, change):
            model = small_mlp()
            opt = self.sgd_with_loss_scale(model)
            change(opt)
            fn(model, opt, *_data()[0])
            return model[0].weight

        cases = [
            (
                lambda opt: opt.param_groups[0].get("loss_scale", 1.0),
                lambda opt: opt.param_groups[0].__setitem__("loss_scale", 4.0),
                r"^fn reads args\[1\]\.param_groups\[0\]\['loss_scale'\] at .*test_precompile_optimizer\.py:\d+ .*, "
                r"a key the group does not have: .*put it in the group before precompile",
            ),
            (
                lambda opt: opt.defaults["lr"] * 10,
                lambda opt: opt.defaults.__setitem__("lr", 0.5),
                r"^fn reads args\[1\]\.defaults at .*test_precompile_optimizer\.py:\d+ .*: the artifact would keep "
                r"what fn reads there and not check it at calls",
            ),
            (
                lambda opt: opt.loss_scale,
                lambda opt: setattr(opt, "loss_scale", 4.0),
                r"^fn reads args\[1\]\.loss_scale at .*test_precompile_optimizer\.py:\d+ .*: the artifact would keep "
                r"what fn computes from it and not check it at calls; inside fn, use only the optimizer's param_groups",
            ),
        ]
        for scale, change, needle in cases:
            fn = scaled_by(scale)
            with self.subTest(needle):
                self.assertFalse(torch.equal(eager_weight(fn, lambda opt: None), eager_weight(fn, change)))
                self.assert_capture_refused_unchanged(fn, self.sgd_with_loss_scale, needle, backend)

    @parametrize("backend", BACKENDS)
    def test_fn_branching_on_optimizer_state_is_refused(self, backend):
        # Inside fn opt.state is the trace's, made as eager's first step would make it:
        # the trace would not take eager's first-call branch, even at the first call.
        taken = []

        def first_step_doubled(model, opt, x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if len(opt.state) == 0:
                taken.append(len(taken))
                loss = loss * 2
            loss.backward()
            opt.step()

        model = small_mlp()
        opt = OPTIMIZERS["sgd_momentum_foreach"](model)
        for x, y in _data(n=2):
            first_step_doubled(model, opt, x, y)
        self.assertEqual(taken, [0])
        self.assert_capture_refused_unchanged(
            first_step_doubled,
            OPTIMIZERS["sgd_momentum_foreach"],
            r"^fn reads args\[1\]\.state at .*test_precompile_optimizer\.py:\d+ \(if len\(opt\.state\) == 0:\): "
            r"inside fn it holds the trace's state",
            backend,
        )
        self.assertEqual(taken, [0])

    def test_every_kind_of_unchecked_optimizer_use_is_refused(self):
        uses = {
            r"fn reads args\[1\]\.state_dict at ": lambda opt: opt.state_dict(),
            r"fn reads args\[1\]\.add_param_group at ": lambda opt: opt.add_param_group,
            r"fn sets args\[1\]\.loss_scale at .*the artifact would not repeat the change": lambda opt: setattr(
                opt, "loss_scale", 2.0
            ),
            r"fn reads the keys of args\[1\]\.param_groups\[0\] \(iteration\)": lambda opt: list(opt.param_groups[0]),
            r"fn reads the keys of args\[1\]\.param_groups\[0\] \(len\(\)\)": lambda opt: len(opt.param_groups[0]),
            r"fn reads the keys of args\[1\]\.param_groups\[0\] \(\.keys\(\)\)": lambda opt: dict(opt.param_groups[0]),
            r"fn reads the keys of args\[1\]\.param_groups\[0\] \(\.items\(\)\)": lambda opt: opt.param_groups[0].items(),
            r"fn reads args\[1\]\.param_groups\[0\]\['warmup'\] at .*a key the group does not have": lambda opt: (
                "warmup" in opt.param_groups[0]
            ),
            r"fn reads args\[1\]\.param_groups\[0\]\['capturable'\] at .*: precompile sets it to True while it "
            r"traces the step \(the caller's is False\)": lambda opt: opt.param_groups[0]["capturable"],
        }
        for needle, use in uses.items():

            def using_step(model, opt, x, y):
                use(opt)
                return train_step(model, opt, x, y)

            with self.subTest(needle):
                self.assert_capture_refused_unchanged(using_step, OPTIMIZERS["adam"], "^" + needle)

    def test_refused_call_creates_no_optimizer_state(self):
        # Two models, two optimizers (a GAN's step): the second optimizer is refused after the
        # first one's missing state was made; neither optimizer, parameter nor .grad changes.
        def two_steps(g, d, g_opt, d_opt, x, y):
            for model, opt in ((g, g_opt), (d, d_opt)):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()

        g, d = small_mlp(0), small_mlp(1)
        x, y = _data()[0]
        step = precompile.load(
            *precompile(two_steps, g, d, OPTIMIZERS["adamw"](g), OPTIMIZERS["adamw"](d), x, y, backend="eager")
        )
        # betas[0] is a graph input (OneCycleLR cycles it); betas[1] is baked.
        g_opt, d_opt = OPTIMIZERS["adamw"](g), torch.optim.AdamW(d.parameters(), lr=1e-2, betas=(0.9, 0.99))
        before = [p.clone() for p in (*g.parameters(), *d.parameters())]
        with self.assertRaisesRegex(PrecompileError, r"args\[3\] \(optimizer\) param_groups\[0\]\['betas'\]\[1\]"):
            step(g, d, g_opt, d_opt, x, y)
        self.assertEqual(len(g_opt.state), 0)
        self.assertEqual(len(d_opt.state), 0)
        self.assertFalse(hasattr(g_opt, "_opt_called"))
        for p, b in zip((*g.parameters(), *d.parameters()), before):
            self.assertEqual(p, b)
            self.assertIsNone(p.grad)
        # The same call with the captured betas steps both, creating their state as eager does.
        d_opt = OPTIMIZERS["adamw"](d)
        step(g, d, g_opt, d_opt, x, y)
        self.assertEqual(len(g_opt.state), len(list(g.parameters())))
        self.assertEqual(len(d_opt.state), len(list(d.parameters())))


instantiate_parametrized_tests(TestOptimizerSemantics)
instantiate_parametrized_tests(TestOptimizerContract)

if __name__ == "__main__":
    run_tests()
