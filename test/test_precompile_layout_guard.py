# Owner(s): ["module: dynamo"]
"""The driver's per-call tensor check (Note invariant 3, issue 27's cost).

``runtime.tensor_guard`` arms, after a call the slow path accepted, either a
``LayoutGuard`` (``torch_precompile/csrc/layout_guard.cpp``, built by setup.py
against the installed torch) or, where that is absent or a tensor is not a
plain strided one, Dynamo's ``TensorGuards`` behind the same interface
(``_TensorGuardsGather``).  Every test here runs against both: they must fail
exactly the same edits, including those made in place on the very tensor
object the guard was armed with, which no hook reports.
"""

import subprocess
import sys
import textwrap

import torch
import torch.nn as nn
from torch_precompile import _precompile_runtime as runtime, _precompile_schema as schema
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests, TestCase
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode


def _layout_guard(tensors, sizes, strides):
    return runtime._LayoutGuard(list(tensors), sizes, strides)


def _tensor_guards(tensors, sizes, strides):
    return runtime._TensorGuardsGather(runtime._TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides))


GUARDS = {"layout_guard": _layout_guard, "tensor_guards": _tensor_guards}


def _armed(kind, tensors, free=()):
    """A guard of ``kind`` over ``tensors``, every size and stride pinned but those at (tensor, dim) in ``free``."""
    sizes = [[None if (i, d) in free else s for d, s in enumerate(t.shape)] for i, t in enumerate(tensors)]
    strides = [[None if (i, d) in free else s for d, s in enumerate(t.stride())] for i, t in enumerate(tensors)]
    return GUARDS[kind](tensors, sizes, strides)


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@instantiate_parametrized_tests
class TestLayoutGuard(TestCase):
    @parametrize("kind", list(GUARDS))
    def test_check_compares_type_dtype_device_grad_and_layout(self, kind):
        x = torch.randn(4, 3)
        guard = _armed(kind, [x], free={(0, 0)})
        self.assertTrue(guard.check(x))
        self.assertTrue(guard.check(torch.randn(7, 3)))  # free size (its stride is free too)
        for other in (
            torch.randn(4, 5),  # pinned size
            x.double(),
            x.clone().requires_grad_(True),
            torch.randn(3, 4).t(),  # pinned stride
            x.unsqueeze(0),  # dim
            nn.Parameter(x.clone(), requires_grad=False),  # the Python type
            torch.empty(4, 3, device="meta"),
            x._neg_view(),  # the neg bit: a dispatch key
            1.0,  # a non-tensor where a tensor was captured
        ):
            self.assertFalse(runtime.guard_passes(guard, [other]), other)
        self.assertFalse(runtime.guard_passes(guard, []))
        z = torch.randn(2, dtype=torch.complex64)
        self.assertFalse(runtime.guard_passes(_armed(kind, [z]), [z.conj()]))  # the conj bit

    @parametrize("kind", list(GUARDS))
    def test_in_place_edits_of_the_armed_tensor_fail(self, kind):
        # The same objects as at arming: only a comparison of the metadata itself sees these.
        for edit in (
            lambda p, b: setattr(p, "data", p.data.double()),  # what module.double() does
            lambda p, b: setattr(p, "data", torch.randn(4, 4)),
            lambda p, b: p.requires_grad_(False),
            lambda p, b: p.t_(),
            lambda p, b: b.resize_(3, 2),
            lambda p, b: b.as_strided_((2, 3), (1, 2)),
            lambda p, b: b.unsqueeze_(0),
        ):
            p, b = nn.Parameter(torch.randn(4, 3)), torch.randn(2, 3)
            guard = _armed(kind, [p, b])
            self.assertTrue(guard.check(p, b))
            with torch.no_grad():
                edit(p, b)
            self.assertFalse(guard.check(p, b))

    @parametrize("kind", list(GUARDS))
    def test_gather_looks_up_by_name_then_checks(self, kind):
        model = nn.Linear(3, 2)
        x = torch.randn(5, 3)
        tables, names = [model._parameters, model._parameters], ["weight", "bias"]
        guard = _armed(kind, [model.weight, model.bias, x])
        gathered = guard.gather(tables, names, (x,))
        self.assertEqual(len(gathered), 3)
        for got, want in zip(gathered, [model.weight, model.bias, x]):
            self.assertIs(got, want)
        model._parameters["bias"] = nn.Parameter(torch.randn(2))  # bypassing the registration hooks
        self.assertIs(guard.gather(tables, names, (x,))[1], model._parameters["bias"])  # found by name now
        model._parameters["bias"] = nn.Parameter(torch.randn(2, dtype=torch.float64))
        self.assertIsNone(guard.gather(tables, names, (x,)))
        del model._parameters["bias"]  # what `del model.bias` does
        self.assertIsNone(guard.gather(tables, names, (x,)))
        model.bias = nn.Parameter(torch.randn(2))
        self.assertIsNone(guard.gather(tables, names, (x.double(),)))
        self.assertIsNone(guard.gather(tables, names, ("x",)))
        self.assertIsNone(guard.gather(tables, names, ()))  # fewer tensors than armed
        self.assertEqual(len(guard.gather(tables, names, [x])), 3)  # inputs picked from a flattened list

    @parametrize("kind", list(GUARDS))
    def test_thread_local_dispatch_keys_count(self, kind):
        # Under a dispatch mode every op goes through Python: the graph, captured outside one, would not.
        x = torch.randn(2)
        guard = _armed(kind, [x])
        with _Passthrough():
            self.assertFalse(guard.check(x))
        self.assertTrue(guard.check(x))

    @parametrize("unchanged", ["extension", "python"])
    def test_entries_unchanged_compares_identity_and_lengths(self, unchanged):
        entries_unchanged = runtime._C.entries_unchanged if unchanged == "extension" else runtime._entries_unchanged_in_python
        missing, eps, scales = schema.MISSING, -0.0, [1.0]

        def watched():
            """An owner dict as captured (an absent entry watched too), and the five lists."""
            children = {"a": nn.ReLU()}
            owner = {"eps": eps, "scales": scales, "_modules": children}
            return owner, [[owner] * 3, ["eps", "scales", "absent"], [eps, scales, missing], [children], [1]]

        for edit in (
            lambda owner: owner.update(eps=0.0),  # == the captured -0.0, another value
            lambda owner: owner.update(scales=[1.0]),  # an equal list, another object
            lambda owner: owner.update(absent=None),  # an entry that was absent at capture
            lambda owner: owner["_modules"].update(b=nn.ReLU()),  # a child added past the registration hooks
            lambda owner: owner.pop("eps"),
        ):
            owner, lists = watched()
            self.assertTrue(entries_unchanged(*lists, missing))
            edit(owner)
            self.assertFalse(entries_unchanged(*lists, missing))
        self.assertTrue(entries_unchanged([], [], [], [], [], missing))
        with self.assertRaises(TypeError):  # dict.get of a non-dict
            entries_unchanged([object()], ["eps"], [eps], [], [], missing)

    def test_tensor_guard_uses_the_extension_for_plain_tensors_only(self):
        spec = schema.TensorSpec(shape=(2,), stride=(1,), dtype="float32", device="cpu")
        self.assertIsInstance(runtime.tensor_guard([torch.randn(2)], [spec]), runtime._LayoutGuard)
        # A subclass with __torch_dispatch__: its sizes are Python's; TensorGuards reads them.
        two = TwoTensor(torch.randn(2), torch.randn(2))
        with self.assertRaisesRegex(TypeError, "not a plain strided tensor"):
            runtime._LayoutGuard([two], [[2]], [[1]])
        guard = runtime.tensor_guard([two], [spec])
        self.assertIsInstance(guard, runtime._TensorGuardsGather)
        self.assertTrue(guard.check(two))
        self.assertFalse(guard.check(torch.randn(2)))

    def test_built_for_this_torch(self):
        # .ci/setup and setup.py build it with the package: absent, every call pays ~6x for its checks.
        self.assertIsNotNone(runtime._LayoutGuard, "torch_precompile._C_<torch version> is not built: pip install --no-build-isolation -e .")
        tag = "".join(c if c.isalnum() else "_" for c in torch.__version__)
        self.assertEqual(runtime._LayoutGuard.__module__, f"torch_precompile._C_{tag}")

    def test_under_another_torch_it_does_not_import_and_the_driver_falls_back(self):
        script = textwrap.dedent(f"""
            import importlib, torch
            built_for = torch.version.__version__
            torch.version.__version__ = "9.9.9"  # as if torch had been upgraded under the extension
            import torch_precompile._precompile_runtime as runtime
            assert runtime._LayoutGuard is None
            try:
                importlib.import_module({runtime._LayoutGuard.__module__!r})
            except ImportError as error:
                print(error)
            model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
            import torch_precompile
            f = torch_precompile.load(*torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager"))
            torch.testing.assert_close(f(model, x), model(x))
            assert isinstance(f._guard, runtime._TensorGuardsGather)
        """)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"torch_precompile._C was built against torch {torch.__version__} but torch 9.9.9 is running", result.stdout)
        self.assertIn("pip install --no-build-isolation", result.stdout)

    def test_an_extension_of_an_abi_the_driver_does_not_name_is_not_used(self):
        script = textwrap.dedent(f"""
            import importlib, torch
            extension = importlib.import_module({runtime._LayoutGuard.__module__!r})
            extension.ABI_VERSION = 99  # built from a newer checkout whose signatures moved
            import torch_precompile._precompile_runtime as runtime
            assert 99 not in runtime.DRIVER_ABIS
            assert runtime._LayoutGuard is None
            assert runtime._entries_unchanged is runtime._entries_unchanged_in_python
            model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
            import torch_precompile
            f = torch_precompile.load(*torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager"))
            torch.testing.assert_close(f(model, x), model(x))
            assert isinstance(f._guard, runtime._TensorGuardsGather)
            print("fell back")
        """)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("fell back", result.stdout)
        self.assertIn(getattr(runtime._C, "ABI_VERSION", 1), runtime.DRIVER_ABIS)  # this build's is named


if __name__ == "__main__":
    run_tests()
