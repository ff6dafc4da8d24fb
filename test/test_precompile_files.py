# Owner(s): ["module: dynamo"]
"""Tests for torch_precompile.files (torch/_precompile_files.py): torch 2.15's file-based front-end.

``capture(fn, artifact_path=, cache_path=)`` as a context manager whose one
call is real (eager's result and side effects) and whose pair is written when
the block exits; ``load(artifact_path, cache_path)``; ``PrecompileSummary``.
Most tests use backend='eager' (no compile); the docs example runs the default
inductor backend across two fresh processes.
"""

import ast
import copy
import inspect
import os
import pickle
import re
import subprocess
import sys
import tempfile
import textwrap

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import run_tests, TestCase

import torch_precompile
from torch_precompile import files, PrecompileError
from _precompile_testing import small_mlp


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "source", "torch.compiler_api.md")
_GLOBAL = torch.ones(4)


def _train_step(m, x, y):
    loss = F.mse_loss(m(x), y)
    loss.backward()
    return loss.detach()


def _bn_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def _copy(module):
    """A deep copy with the .grad fields too (deepcopy drops them)."""
    copied = copy.deepcopy(module)
    for p, q in zip(module.parameters(), copied.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    return copied


def _state(module):
    return {
        "state": {k: v.clone() for k, v in module.state_dict().items()},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in module.named_parameters()},
    }


def _run(code, cwd):
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise AssertionError(f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


class _FilesTestCase(TestCase):
    def setUp(self):
        super().setUp()
        directory = tempfile.TemporaryDirectory()
        self.addCleanup(directory.cleanup)
        self.dir = directory.name
        self.code_path = os.path.join(self.dir, "step.py")
        self.cache_path = os.path.join(self.dir, "step.cache")

    def capture(self, fn, **kwargs):
        kwargs.setdefault("backend", "eager")
        return files.capture(fn, artifact_path=self.code_path, cache_path=self.cache_path, **kwargs)

    def assertNothingWritten(self):
        self.assertEqual(os.listdir(self.dir), [])


class TestCapture(_FilesTestCase):
    def test_with_block_call_is_eager_and_writes_the_pair_on_exit(self):
        model, x, y = _bn_model(), torch.randn(5, 8), torch.randn(5, 4)
        _train_step(model, x, y)  # an existing .grad: the real call accumulates onto it once
        reference = _copy(model)
        with self.capture(_train_step) as cap:
            out = cap(model, x, y)
            self.assertNothingWritten()  # written when the block exits
        expected = _train_step(reference, x, y)
        self.assertEqual(out, expected, atol=0, rtol=0)
        self.assertEqual(_state(model), _state(reference), atol=0, rtol=0)  # grads once, running stats once
        self.assertEqual(sorted(os.listdir(self.dir)), ["step.cache", "step.py"])
        with open(self.code_path, encoding="utf-8") as f:
            self.assertIn("CALLING_CONVENTION", f.read())
        # The files are the pair precompile() builds: they load and compute eager's step.
        runnable = files.load(self.code_path, self.cache_path)
        self.assertEqual(runnable(model, x, y), _train_step(reference, x, y))
        self.assertEqual(_state(model), _state(reference))

    def test_call_draws_the_rng_like_eager(self):
        def fn(m, x):
            return F.dropout(m(x), p=0.5)

        model, x = small_mlp(), torch.randn(4, 8)
        torch.manual_seed(7)
        with self.capture(fn) as cap:
            out = cap(model, x)
        torch.manual_seed(7)
        self.assertEqual(out, fn(model, x), atol=0, rtol=0)

    def test_result_keeps_autograd_history_like_eager(self):
        model, x = small_mlp(), torch.randn(4, 8)
        with self.capture(lambda m, x: m(x).sum()) as cap:
            out = cap(model, x)
        out.backward()  # a real eager result: backward outside fn works
        self.assertTrue(all(p.grad is not None for p in model.parameters()))

    def test_save_writes_early_and_a_later_error_keeps_the_files(self):
        model, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        with self.assertRaisesRegex(RuntimeError, "after save"):
            with self.capture(_train_step) as cap:
                cap(model, x, y)
                cap.save()
                self.assertEqual(sorted(os.listdir(self.dir)), ["step.cache", "step.py"])
                raise RuntimeError("after save")
        self.assertEqual(sorted(os.listdir(self.dir)), ["step.cache", "step.py"])
        files.load(self.code_path, self.cache_path)  # a complete pair

    def test_a_write_that_fails_names_the_path_and_save_can_retry(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.assertRaisesRegex(
            PrecompileError, r"cannot write artifact_path .*step\.py.*\(Is a directory\).*call save\(\) again"
        ):
            with self.capture(lambda m, x: m(x)) as cap:
                cap(model, x)
                os.mkdir(self.code_path)  # made after capture() checked the path
        os.rmdir(self.code_path)
        cap.save()
        files.load(self.code_path, self.cache_path)  # a complete pair
        os.remove(self.cache_path)
        os.remove(self.code_path)
        os.rmdir(self.dir)
        with self.assertRaisesRegex(PrecompileError, r"cannot write cache_path .*step\.cache.*\(No such file or directory\)"):
            cap.save()

    def test_raising_block_writes_nothing(self):
        model, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        with self.assertRaisesRegex(ValueError, "user error"):
            with self.capture(_train_step) as cap:
                cap(model, x, y)
                raise ValueError("user error")
        self.assertNothingWritten()

    def test_block_without_a_call_raises(self):
        with self.assertRaisesRegex(PrecompileError, "no successful call.*call cap\\(\\*args\\) once inside the block"):
            with self.capture(_train_step):
                pass
        self.assertNothingWritten()
        with self.assertRaisesRegex(PrecompileError, "nothing to save: call cap"):
            self.capture(_train_step).save()

    def test_second_call_is_refused_and_changes_nothing(self):
        model, x, y = small_mlp(), torch.randn(3, 8), torch.randn(3, 4)
        with self.capture(_train_step) as cap:
            cap(model, x, y)
            before = _state(model)
            with self.assertRaisesRegex(PrecompileError, "already took its call: MakeFxTracer captures exactly one call"):
                cap(model, x, y)
            self.assertEqual(_state(model), before, atol=0, rtol=0)
        self.assertEqual(sorted(os.listdir(self.dir)), ["step.cache", "step.py"])  # the first call's pair

    def test_capture_is_single_use(self):
        model, x = small_mlp(), torch.randn(3, 8)
        cap = self.capture(lambda m, x: m(x))
        with cap:
            cap(model, x)
        with self.assertRaisesRegex(PrecompileError, "single-use: call capture\\(\\) again"):
            with cap:
                pass
        with self.assertRaisesRegex(PrecompileError, "is closed.*single-use"):
            cap(model, x)

    def test_refused_fn_runs_no_real_call(self):
        def reads_a_global(m, x):
            m(x + _GLOBAL[0]).sum().backward()

        model, x = small_mlp(), torch.randn(3, 8)
        with self.assertRaisesRegex(PrecompileError, "neither an argument of fn nor created inside it"):
            with self.capture(reads_a_global) as cap:
                cap(model, x)
        self.assertTrue(all(p.grad is None for p in model.parameters()))  # capture refused before the real call
        self.assertNothingWritten()

    def test_a_raising_call_consumes_the_capture(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.assertRaisesRegex(PrecompileError, "the with block made no successful call"):
            with self.capture(lambda m, x: m(x)) as cap:
                with self.assertRaisesRegex(RuntimeError, "shapes cannot be multiplied"):
                    cap(model, torch.randn(3, 5))  # fn raises (in the trace) as its eager call would
                with self.assertRaisesRegex(PrecompileError, "nothing to save: its call raised"):
                    cap.save()
                with self.assertRaisesRegex(PrecompileError, "already took its call"):
                    cap(model, x)
        self.assertNothingWritten()

    def test_keyword_arguments_are_refused(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.assertRaisesRegex(PrecompileError, r"keyword arguments \['x'\] are not supported.*positionally"):
            with self.capture(lambda m, x: m(x)) as cap:
                cap(model, x=x)

    def test_tracer_accepts_make_fx_only(self):
        model, x = small_mlp(), torch.randn(3, 8)
        for tracer in (files.MakeFxTracer(), "make_fx"):
            with self.capture(lambda m, x: m(x), tracer=tracer) as cap:
                cap(model, x)
        for tracer in ("dynamo", files.MakeFxTracer, None):
            expected = re.escape("tracer must be MakeFxTracer() (or the string 'make_fx')") + ".*got " + re.escape(repr(tracer))
            with self.assertRaisesRegex(PrecompileError, expected):
                self.capture(lambda m, x: m(x), tracer=tracer)

    def test_tracer_forwards_decompositions(self):
        table = {torch.ops.aten.relu.default: lambda x: torch.clamp_min(x, 0)}
        model, x = small_mlp(), torch.randn(3, 8)
        with self.capture(lambda m, x: m(x), tracer=files.MakeFxTracer(decompositions=table)) as cap:
            cap(model, x)
        with open(self.code_path, encoding="utf-8") as f:
            code = f.read()
        self.assertIn("torch.ops.aten.clamp_min.default(", code)
        self.assertNotIn("torch.ops.aten.relu.default(", code)

    def test_bytes_paths(self):
        # They reached tempfile with a str prefix: TypeError after the real call.
        model, x = small_mlp(), torch.randn(3, 8)
        code_path, cache_path = os.fsencode(self.code_path), os.fsencode(self.cache_path)
        with files.capture(lambda m, x: m(x), artifact_path=code_path, cache_path=cache_path, backend="eager") as cap:
            cap(model, x)
        self.assertEqual((cap.artifact_path, cap.cache_path), (self.code_path, self.cache_path))
        with files.load(code_path, cache_path) as runnable:
            self.assertEqual(runnable(model, x), model(x))

    def test_arguments_are_checked_before_any_call(self):
        fn = lambda m, x: m(x)  # noqa: E731
        cases = [
            (dict(fn=3), "fn must be callable, got int"),
            (dict(backend="tvm"), r"backend must be one of \('inductor', 'eager'\), got 'tvm'"),
            (dict(cache_path=self.code_path), "are the same file"),
            (dict(artifact_path=os.path.join(self.dir, "missing", "a.py")), r"artifact_path .*missing.*does not exist"),
            (dict(cache_path=self.dir), r"cache_path '.*' is a directory; give the path of a file to write"),
            (dict(cache_path=None), "cache_path must be a str, bytes or os.PathLike file path, got NoneType"),
            (dict(cache_path=os.fsencode(self.code_path)), "are the same file"),
        ]
        for overrides, message in cases:
            arguments = dict(artifact_path=self.code_path, cache_path=self.cache_path, backend="eager")
            arguments.update(overrides)
            target = arguments.pop("fn", fn)
            with self.subTest(overrides=overrides), self.assertRaisesRegex(PrecompileError, message):
                files.capture(target, **arguments)


class TestLoad(_FilesTestCase):
    def test_load_in_a_fresh_process_matches_eager(self):
        model, x, y = small_mlp(seed=3), torch.randn(3, 8), torch.randn(3, 4)
        torch.save({"model": model, "x": x, "y": y}, os.path.join(self.dir, "inputs.pt"))
        with self.capture(_train_step) as cap:
            cap(model, x, y)
        script = textwrap.dedent(
            """
            import torch
            from torch_precompile import files

            inputs = torch.load("inputs.pt", weights_only=False)
            model = inputs["model"]
            with files.load("step.py", "step.cache") as step:
                loss = step(model, inputs["x"], inputs["y"])
            torch.save({"loss": loss, "grads": [p.grad for p in model.parameters()]}, "out.pt")
            """
        )
        _run(script, cwd=self.dir)
        out = torch.load(os.path.join(self.dir, "out.pt"))
        reference = small_mlp(seed=3)
        self.assertEqual(out["loss"], _train_step(reference, x, y))
        self.assertEqual(out["grads"], [p.grad for p in reference.parameters()])

    def test_files_are_read_as_python_reads_source(self):
        # CRLF line endings and a UTF-8 byte-order mark (an editor's, a text-mode copy's) are undone.
        model, x = small_mlp(), torch.randn(3, 8)
        with self.capture(lambda m, x: m(x)) as cap:
            cap(model, x)
        with open(self.code_path, encoding="utf-8") as f:
            code = f.read()
        with open(self.code_path, "w", encoding="utf-8-sig", newline="\r\n") as f:
            f.write(code)
        with files.load(self.code_path, self.cache_path) as runnable:
            self.assertEqual(runnable(model, x), model(x))
        self.assertEqual(files.PrecompileSummary.from_files(self.code_path, self.cache_path).backend, "eager")

    def test_unload_and_context_manager(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.capture(lambda m, x: m(x)) as cap:
            cap(model, x)
        runnable = files.load(self.code_path, self.cache_path)
        self.assertIsInstance(runnable, files.PrecompiledRunnable)
        self.assertEqual(runnable(model, x), model(x))
        runnable.unload()
        with self.assertRaisesRegex(PrecompileError, "unload\\(\\) was called; load the files again"):
            runnable(model, x)
        with files.load(self.code_path, self.cache_path) as runnable:
            self.assertEqual(runnable(model, x), model(x))
        with self.assertRaisesRegex(PrecompileError, "unload\\(\\) was called"):
            runnable(model, x)

    def test_copies_share_the_loaded_artifact_and_pickling_is_refused(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.capture(lambda m, x: m(x)) as cap:
            cap(model, x)
        runnable = files.load(self.code_path, self.cache_path)
        twin = copy.deepcopy(runnable)
        twin.unload()  # each copy has its own unload()
        self.assertEqual(runnable(model, x), model(x))
        with self.assertRaisesRegex(PrecompileError, r"cannot be pickled.*save its \(python_code, cache\) pair"):
            pickle.dumps(runnable)

    def test_unreadable_files_name_the_argument(self):
        model, x = small_mlp(), torch.randn(3, 8)
        with self.capture(lambda m, x: m(x)) as cap:
            cap(model, x)
        with self.assertRaisesRegex(PrecompileError, "cannot read cache_path .*nope"):
            files.load(self.code_path, os.path.join(self.dir, "nope"))
        with self.assertRaisesRegex(PrecompileError, "artifact_path .* is not UTF-8 text.*swap"):
            files.load(self.cache_path, self.code_path)

    def test_summary(self):
        model, x, y = _bn_model(), torch.randn(5, 8), torch.randn(5, 4)
        with self.capture(_train_step) as cap:
            cap(model, x, y)
        summary = files.PrecompileSummary.from_files(self.code_path, self.cache_path)
        self.assertEqual(summary, cap.summary())
        self.assertEqual(summary.backend, "eager")
        self.assertEqual(
            summary.arguments,
            (
                "args[0]: nn.Module with 6 parameters, 3 buffers",
                "args[1]: Tensor(5, 8) float32 cpu",
                "args[2]: Tensor(5, 4) float32 cpu",
            ),
        )
        self.assertEqual(
            (summary.parameters, summary.buffers, summary.inputs, summary.outputs, summary.grad_parameters, summary.kernels),
            (6, 3, 2, 1, 6, 0),
        )
        # The driver's own list, one line per check (as f.checks and the inspector give it).
        with open(self.code_path) as code, open(self.cache_path, "rb") as cache:
            runnable = torch_precompile.load(code.read(), cache.read())
        self.assertEqual(summary.checks, tuple(map(str, runnable.checks)))
        self.assertIn("binding       the call: fn(m, x, y) bound as Python binds it, 3 arguments", summary.checks)
        self.assertIn("global        torch.is_grad_enabled(): True (the graph runs autograd)", summary.checks)
        self.assertIn("tensor        args[1]: Tensor(5, 8) float32 cpu, strides (8, 1), requires_grad=False", summary.checks)
        self.assertTrue(any(check.startswith("alias ") and "(the graph writes it)" in check for check in summary.checks))
        self.assertTrue(summary.report["pair"]["belongs_together"])
        self.assertIn("checked at every call:", str(summary))


class TestPackage(TestCase):
    def test_files_is_one_module_under_both_names(self):
        import torch_precompile._precompile_files as implementation
        from torch_precompile.files import capture

        self.assertIs(torch_precompile.files, implementation)
        self.assertIs(capture, implementation.capture)
        self.assertIs(files.PrecompileError, torch_precompile.PrecompileError)
        self.assertEqual(
            sorted(files.__all__),
            sorted(["Capture", "capture", "load", "MakeFxTracer", "PrecompiledRunnable", "PrecompileError", "PrecompileSummary"]),
        )

    def test_import_torch_precompile_does_not_import_files(self):
        code = "import sys, torch_precompile; print(any('files' in m for m in sys.modules if 'precompile' in m))"
        self.assertEqual(_run(code, cwd=REPO).strip(), "False")

    def test_documented_signatures(self):
        with open(DOC, encoding="utf-8") as f:
            text = f.read()
        for name, function in (("capture", files.capture), ("load", files.load)):
            (line,) = re.findall(rf"^\.\. py:function:: torch_precompile\.files\.{name}\((.*)\)$", text, flags=re.M)
            documented = ast.parse(f"def f({line}): pass").body[0].args
            args = documented.posonlyargs + documented.args + documented.kwonlyargs
            defaults = dict(zip([a.arg for a in documented.kwonlyargs], documented.kw_defaults))
            actual = inspect.signature(function).parameters
            self.assertEqual([a.arg for a in args], list(actual))
            positional_only = [name for name, p in actual.items() if p.kind == p.POSITIONAL_ONLY]
            self.assertEqual([a.arg for a in documented.posonlyargs], positional_only)
            for parameter in actual.values():
                documented_default = defaults.get(parameter.name)
                shown = None if documented_default is None else ast.unparse(documented_default)
                expected = None if parameter.default is parameter.empty else repr(parameter.default)
                self.assertEqual(shown, expected, parameter.name)


class TestDocsExample(TestCase):
    def test_the_docs_example_runs_in_two_processes(self):
        """The page's example (default inductor backend): process A captures, a fresh process B loads."""
        with open(DOC, encoding="utf-8") as f:
            text = f.read()
        section = text[text.index("## torch_precompile.files") :]
        example = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
        self.assertIn("from torch_precompile import files as precompile   # torch 2.15: from torch.compiler import precompile", example)
        setup, rest = example.split("# process A")
        process_a, process_b = rest.split("# process B")
        check = textwrap.dedent(
            """
            torch.manual_seed(0)
            reference = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            expected = train_step(reference, x)
            torch.testing.assert_close(loss, expected)
            for p, r in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, r.grad)
            print("ok")
            """
        )
        with tempfile.TemporaryDirectory() as directory:
            _run(setup + "# process A" + process_a + check, cwd=directory)
            self.assertEqual(sorted(os.listdir(directory)), ["step.cache", "step.py"])
            self.assertEqual(_run(setup + "# process B" + process_b + check, cwd=directory).strip(), "ok")



if __name__ == "__main__":
    run_tests()
