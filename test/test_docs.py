# Owner(s): ["module: docs"]
"""docs/source/torch.compiler_api.md agrees with what torch 2.13 + torch-precompile expose.

* every name in the autosummary block exists on ``torch.compiler``, and every
  public name of stock torch 2.13's ``torch.compiler.__all__`` is listed;
* the documented ``precompile(...)`` and ``precompile.load(...)`` signatures
  match the implementation (parameter names, kinds and defaults);
* documented behavior that is cheap to check holds (argument errors,
  mark_unbacked is inductor-only, load's warning, shape specialization).

Run: ``python test/test_docs.py`` or ``python -m pytest test/test_docs.py``.
"""

import ast
import inspect
import re
from pathlib import Path

import torch
import torch_precompile._precompile  # attaches even with TORCH_DEVICE_BACKEND_AUTOLOAD=0
from torch.testing._internal.common_utils import run_tests, TestCase


REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "source" / "torch.compiler_api.md"

# Public names of torch.compiler that the page documents elsewhere or not at all.
NOT_IN_AUTOSUMMARY = {"config", "precompile", "PrecompileError"}


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _autosummary_names(text: str) -> list:
    """Entries of every ``.. autosummary::`` block (options and blank lines skipped)."""
    names = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != ".. autosummary::":
            continue
        for entry in lines[i + 1 :]:
            stripped = entry.strip()
            if stripped.startswith("```") or (stripped and not entry.startswith((" ", "\t"))):
                break
            if stripped and not stripped.startswith(":"):
                names.append(stripped)
    return names


def _documented_signature(text: str, directive: str, name: str) -> inspect.Signature:
    """Parse ``.. py:<directive>:: <name>(...)`` into an inspect.Signature."""
    pattern = rf"^\s*\.\. py:{directive}:: {re.escape(name)}\((.*)\)\s*$"
    matches = re.findall(pattern, text, flags=re.M)
    if len(matches) != 1:
        raise AssertionError(f"expected one `.. py:{directive}:: {name}(...)` line, found {len(matches)}")
    func = ast.parse(f"def f({matches[0]}): pass").body[0]
    args = func.args
    kind = inspect.Parameter
    params = []
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [
        ast.literal_eval(d) for d in args.defaults
    ]
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        k = kind.POSITIONAL_ONLY if i < len(args.posonlyargs) else kind.POSITIONAL_OR_KEYWORD
        params.append(kind(arg.arg, k, default=default))
    if args.vararg:
        params.append(kind(args.vararg.arg, kind.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        params.append(kind(arg.arg, kind.KEYWORD_ONLY, default=value))
    if args.kwarg:
        params.append(kind(args.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params)


def _shape(sig: inspect.Signature) -> list:
    """(name, kind, default) per parameter; annotations are not documented."""
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


class TestCompilerApiPage(TestCase):
    def test_autosummary_names_exist_on_torch_compiler(self):
        names = _autosummary_names(_doc())
        self.assertGreater(len(names), 20)
        self.assertEqual(len(names), len(set(names)), "duplicate autosummary entries")
        missing = [n for n in names if not hasattr(torch.compiler, n)]
        self.assertEqual(missing, [], "documented but absent from torch.compiler in this torch")
        for name in names:
            self.assertIn(name, torch.compiler.__all__)

    def test_autosummary_lists_every_public_name(self):
        names = set(_autosummary_names(_doc()))
        undocumented = sorted(set(torch.compiler.__all__) - names - NOT_IN_AUTOSUMMARY)
        self.assertEqual(undocumented, [], "public torch.compiler names missing from the page")
        # precompile is a callable instance: documented by hand, not autosummary.
        self.assertNotIn("precompile", names)

    def test_precompile_signature_matches(self):
        documented = _documented_signature(_doc(), "function", "precompile")
        actual = inspect.signature(type(torch_precompile.precompile).__call__)
        params = list(actual.parameters.values())
        self.assertEqual(params[0].name, "self")
        actual = actual.replace(parameters=params[1:])
        self.assertEqual(_shape(documented), _shape(actual))

    def test_load_signature_matches(self):
        documented = _documented_signature(_doc(), "method", "precompile.load")
        actual = inspect.signature(torch_precompile.load)  # bound: no self
        self.assertEqual(_shape(documented), _shape(actual))

    def test_documented_exception_exists(self):
        text = _doc()
        self.assertIn(".. autoexception:: torch_precompile.PrecompileError", text)
        self.assertTrue(issubclass(torch_precompile.PrecompileError, Exception))
        self.assertIs(torch_precompile.PrecompileError, torch_precompile._precompile.PrecompileError)

    def test_documented_argument_errors(self):
        model, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
        fn = lambda m, x: m(x)  # noqa: E731
        with self.assertRaises(NotImplementedError):
            torch_precompile.precompile(fn, model, x, tracer="dynamo")
        with self.assertRaises(ValueError):
            torch_precompile.precompile(fn, model, x, tracer="bogus")
        with self.assertRaises(ValueError):
            torch_precompile.precompile(fn, model, x, backend="bogus")

    def test_documented_mark_unbacked_is_inductor_only(self):
        from torch._dynamo.decorators import mark_unbacked

        self.assertIn('inductor backend only; ``backend="eager"`` raises ``NotImplementedError``', _doc())
        model, x = torch.nn.Linear(4, 3), torch.randn(5, 4)
        mark_unbacked(x, 0)
        with self.assertRaises(NotImplementedError):
            torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager")

    def test_documented_load_warns_and_specializes_shapes(self):
        model, x = torch.nn.Linear(4, 3), torch.randn(5, 4)
        python_code, cache = torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager")
        with self.assertLogs("torch_precompile._precompile", level="WARNING"):  # logs at every load
            f = torch_precompile.load(python_code, cache)
        torch.testing.assert_close(f(model, x), model(x))
        with self.assertRaisesRegex(torch_precompile.PrecompileError, r"expected shape \(5, 4\)"):
            f(model, torch.randn(7, 4))
        torch.testing.assert_close(f(model, x=x), model(x))  # keywords bind like fn's parameters
        with self.assertRaisesRegex(torch_precompile.PrecompileError, "unexpected keyword argument 'y'"):
            f(model, y=x)


class TestReadmeAndCi(TestCase):
    def test_ci_runs_exactly_the_readme_test_command(self):
        head = (REPO / "README.md").read_text(encoding="utf-8").splitlines()[:8]
        commands = [line.strip() for line in head if line.startswith("    ") and line.strip()]
        self.assertEqual(len(commands), 2, "README starts with two commands")
        setup_and_demo, test_command = commands
        self.assertIn("python3 -m venv .venv && . .venv/bin/activate && bash .ci/setup", setup_and_demo)
        run = [
            line.strip()
            for line in (REPO / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        self.assertIn("set -euo pipefail", run)
        self.assertIn("rm -rf .venv", run)  # a fresh venv, not the machine's Python
        self.assertIn(setup_and_demo, run, ".ci/run must run the README's first command verbatim")
        self.assertIn(test_command, run, ".ci/run must run the README's test command")
        # ... in the README's environment, before the legs on the other supported torch releases.
        self.assertLess(run.index(setup_and_demo), run.index(test_command))
        self.assertNotIn("--system-site-packages", (REPO / ".ci" / "run").read_text())
        setup = (REPO / ".ci" / "setup").read_text()
        self.assertIn("set -euo pipefail", setup)
        self.assertRegex(setup, r"pip install torch==2\.13\.0\b")  # pinned: never a CUDA download by accident
        self.assertIn("pip install --no-build-isolation -e .", setup)  # builds torch_precompile._C against that torch


if __name__ == "__main__":
    run_tests()
