# Owner(s): ["oncall: pt2"]
"""How torch-precompile installs onto a stock torch wheel (2.11-2.14).

* ``torch_precompile.precompile`` / ``load`` / ``PrecompileError`` work on
  every version;
* on torch without a precompile of its own (2.11-2.13), ``import torch``
  attaches ``precompile`` / ``PrecompileError`` to ``torch.compiler`` (entry
  point of the group ``torch.backends``), and so does ``import
  torch_precompile._precompile`` when autoload is off; a failing attach never
  breaks ``import torch``;
* on torch 2.14+, which ships its own ``torch/_precompile.py`` and
  ``torch.compiler.precompile``, those stay torch's, untouched;
* every installed file is in the ``torch_precompile`` package (nothing under
  torch's directory), and none collides with a file of the torch distribution;
* a non-editable ``pip install`` + ``pip uninstall`` leaves torch's files
  bit-identical and removes every file of ours;
* the in-tree form (``patches/torch_compiler_init.patch``) applies to torch
  2.13's ``torch/compiler/__init__.py`` and attaches without the entry point.

Tests marked ``slow`` start fresh interpreters or pip (a few seconds each);
they run by default and can be deselected with ``pytest -m "not slow"``.
Run: ``python test/test_install.py`` or ``python -m pytest test/test_install.py``.
"""

import ast
import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

import torch
from torch_precompile._precompile_compat import SUPPORTED_TORCH, TORCH_RELEASE
from torch.testing._internal.common_utils import run_tests, TestCase


try:
    import pytest

    slow = pytest.mark.slow
except ImportError:  # plain `python test/test_install.py` without pytest

    def slow(fn):
        return fn


REPO = Path(__file__).resolve().parents[1]
DIST = "torch-precompile"
PATCH = REPO / "patches" / "torch_compiler_init.patch"
NAMES = ("precompile", "PrecompileError")
# torch 2.14+ ships its own torch/_precompile.py and torch.compiler.precompile.
TORCH_HAS_PRECOMPILE = importlib.util.find_spec("torch._precompile") is not None
OWN_PRECOMPILE = "torch ships its own torch.compiler.precompile (2.14+), which stays torch's"
# torch's files the install must never touch (sha256 checked against RECORD);
# torch's own precompile files where it has them.
GUARDED = ("torch/__init__.py", "torch/compiler/__init__.py", "torch/_precompile.py", "torch/_precompile_driver.py")

# Every file this distribution may install, relative to site-packages.
OURS = re.compile(
    r"""(
        torch_precompile/(__pycache__/)?\w+(\.[\w-]+)?\.pyc?          # the package
      | torch_precompile/_C_\w+\.[\w-]+\.so                           # its tensor check (setup.py)
      | torch_precompile-[^/]+\.dist-info/[^/]+                       # metadata
      | (__pycache__/)?__editable__[._]+torch_precompile[^/]*         # pip install -e
    )$""",
    re.X,
)

# Drop pip's editable finders, so a child sees only what a venv installed.
_NO_EDITABLE = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if not getattr(f, '__module__', '').startswith('__editable__')]\n"
)


def _env(autoload: bool = True, **extra: str) -> dict:
    env = dict(os.environ)
    env.pop("TORCH_LOGS", None)
    env.pop("PYTHONPATH", None)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    env.update(extra)
    return env


def _code(*parts: str) -> str:
    """Join snippets written at different indentations."""
    return "\n".join(textwrap.dedent(part) for part in parts)


def _python(code: str, *, python: str = sys.executable, env: dict | None = None, check: bool = True):
    """Run ``code`` in a fresh interpreter, outside the repo (no cwd imports)."""
    with tempfile.TemporaryDirectory() as cwd:
        result = subprocess.run(
            [python, "-c", textwrap.dedent(code)],
            cwd=cwd,
            env=_env() if env is None else env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    if check and result.returncode != 0:
        raise AssertionError(
            f"child exited {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result


def _last_json(result) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def _torch_record() -> dict:
    """torch's RECORD: relative path -> PackagePath."""
    return {str(f): f for f in importlib.metadata.distribution("torch").files}


def _record_sha256(path: Path) -> str:
    """A file's sha256 in RECORD's encoding (urlsafe base64, no padding)."""
    digest = hashlib.sha256(path.read_bytes()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _guarded_hashes() -> dict:
    record = _torch_record()
    return {name: _record_sha256(Path(record[name].locate())) for name in GUARDED if name in record}


def _ours_distribution():
    """The installed distribution (has a RECORD), not the repo's build-time
    ``torch_precompile.egg-info``, which shadows it when the repo is on sys.path."""
    for dist in importlib.metadata.distributions(name=DIST):
        if dist.read_text("RECORD") is not None:
            return dist
    raise AssertionError(f"{DIST} is not installed: run `python -m pip install -e {REPO}`")


def _attach_report(module: str = "torch_precompile._precompile") -> str:
    """A child's report on torch.compiler's precompile names, attached from ``module``."""
    return ATTACH_REPORT.replace("MODULE", repr(module))


ATTACH_REPORT = """
    import json, sys
    import torch
    loaded_at_import = MODULE in sys.modules
    c = torch.compiler
    star = {}
    exec("from torch.compiler import *", star)
    mod = sys.modules.get(MODULE)
    print(json.dumps({
        "attached": all(hasattr(c, n) for n in %r),
        "in_all": [c.__all__.count(n) for n in %r],
        "star": all(n in star for n in %r),
        "same": mod is not None and c.precompile is mod.precompile and c.PrecompileError is mod.PrecompileError,
        "exception": isinstance(getattr(c, "PrecompileError", None), type)
            and issubclass(c.PrecompileError, Exception),
        "file": getattr(mod, "__file__", None),
        "loaded_at_import": loaded_at_import,
    }))
""" % (NAMES, NAMES, NAMES)


class TestPackage(TestCase):
    """The names that work on every torch version."""

    def test_names(self):
        import torch_precompile
        import torch_precompile._precompile as implementation

        self.assertIs(torch_precompile.precompile, implementation.precompile)
        self.assertEqual(torch_precompile.load, implementation.precompile.load)
        self.assertIs(torch_precompile.PrecompileError, implementation.PrecompileError)
        self.assertTrue(issubclass(torch_precompile.PrecompileError, RuntimeError))
        with self.assertRaisesRegex(AttributeError, "module 'torch_precompile' has no attribute 'no_such_name'"):
            torch_precompile.no_such_name  # noqa: B018

    def test_entry_point_registered(self):
        eps = [ep for ep in importlib.metadata.entry_points(group="torch.backends") if ep.name == "precompile"]
        self.assertEqual(len(eps), 1, eps)
        self.assertEqual(eps[0].value, "torch_precompile:_attach")
        self.assertEqual(eps[0].dist.metadata["Name"], DIST)
        self.assertTrue(callable(eps[0].load()))

    @slow
    def test_torch_precompile_runs_an_mlp(self):
        code = """
            import torch, torch_precompile
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
            x = torch.randn(3, 4)
            f = torch_precompile.load(*torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager"))
            torch.testing.assert_close(f(model, x), model(x))
            try:
                f(model, torch.randn(5, 4))
            except torch_precompile.PrecompileError as error:
                print("refused:", error)
        """
        result = _python(code, env=_env(autoload=True, PYTHONWARNINGS="ignore"))
        self.assertIn("refused: args[1]: expected shape (3, 4)", result.stdout)


@unittest.skipUnless(TORCH_HAS_PRECOMPILE, "torch has no precompile of its own (before 2.14)")
class TestTorchOwnPrecompile(TestCase):
    @slow
    def test_torch_compiler_precompile_stays_torchs(self):
        code = """
            import json, sys
            import torch, torch._precompile
            own = torch.compiler.precompile, torch.compiler.PrecompileError
            import torch_precompile, torch_precompile._precompile
            print(json.dumps({
                "torch_own": torch.compiler.precompile is torch._precompile.precompile,
                "unchanged": (torch.compiler.precompile, torch.compiler.PrecompileError) == own,
                "torch_file": torch._precompile.__file__,
                "ours": torch_precompile.precompile is torch_precompile._precompile.precompile,
                "distinct": torch_precompile.precompile is not own[0] and torch_precompile.PrecompileError is not own[1],
            }))
        """
        report = _last_json(_python(code))
        self.assertTrue(report["torch_own"] and report["unchanged"] and report["ours"] and report["distinct"], report)
        record = _torch_record()
        self.assertEqual(Path(report["torch_file"]).resolve(), Path(record["torch/_precompile.py"].locate()).resolve())
        for name in ("torch/_precompile.py", "torch/_precompile_driver.py"):
            self.assertEqual(_record_sha256(Path(record[name].locate())), record[name].hash.value, name)


@unittest.skipIf(TORCH_HAS_PRECOMPILE, OWN_PRECOMPILE)
class TestAttach(TestCase):
    def assertAttached(self, report: dict) -> None:
        self.assertTrue(report["attached"], report)
        self.assertEqual(report["in_all"], [1, 1], report)
        self.assertTrue(report["star"], report)
        self.assertTrue(report["same"], report)
        self.assertTrue(report["exception"], report)

    def test_attach_in_this_process_is_idempotent(self):
        import torch_precompile._precompile as implementation

        for _ in range(2):
            implementation._attach()
            importlib.import_module("torch_precompile")._attach()
        for name in NAMES:
            self.assertEqual(torch.compiler.__all__.count(name), 1)
        self.assertIs(torch.compiler.precompile, implementation.precompile)

    @slow
    def test_import_torch_attaches(self):
        # TORCH_LOGS=precompile also proves the log alias is registered before
        # torch parses TORCH_LOGS (an unknown name makes `import torch` raise).
        # torch 2.11/2.12 parse it before running entry points: there the alias
        # cannot be used (README names the module instead), so it is not set.
        logs = {"TORCH_LOGS": "precompile"} if TORCH_RELEASE >= (2, 13) else {}
        report = _last_json(_python(_attach_report(), env=_env(autoload=True, **logs)))
        self.assertAttached(report)
        # Lazy: `import torch` does not import the implementation; the first
        # access to torch.compiler.precompile does.
        self.assertFalse(report["loaded_at_import"], report)

    @slow
    def test_autoload_off_then_import_torch_precompile(self):
        code = """
            import sys, torch
            assert not hasattr(torch.compiler, "precompile"), "attached although autoload is off"
            assert "precompile" not in torch.compiler.__all__
            assert "torch_precompile._precompile" not in sys.modules
            import torch_precompile._precompile
        """
        code = _code(code, _attach_report())
        self.assertAttached(_last_json(_python(code, env=_env(autoload=False))))

    @slow
    def test_autoload_off_then_import_shim(self):
        code = """
            import torch
            assert not hasattr(torch.compiler, "precompile")
            import torch_precompile
        """
        code = _code(code, _attach_report())
        self.assertAttached(_last_json(_python(code, env=_env(autoload=False))))

    @slow
    def test_failing_attach_never_breaks_import_torch(self):
        # torch turns an exception in a torch.backends entry point into a
        # RuntimeError that aborts `import torch`; the shim must warn instead,
        # both when attaching and when the lazy import fails at first access.
        code = """
            import sys
            class Broken:
                def find_spec(self, name, path=None, target=None):
                    if name == "torch_precompile._precompile":
                        raise ImportError("simulated breakage")
            sys.meta_path.insert(0, Broken())
            import torch
            x = torch.ones(2) + 1
            print("OK", hasattr(torch.compiler, "precompile"))
        """
        result = _python(code, env=_env(autoload=True, PYTHONWARNINGS="always"))
        self.assertIn("OK False", result.stdout)
        self.assertIn("torch.compiler.precompile is unavailable", result.stderr)
        self.assertIn("simulated breakage", result.stderr)

        code = """
            import torch
            torch.compiler.__all__ = tuple(torch.compiler.__all__)  # attach cannot append now
            import torch_precompile
            print("OK")
        """
        result = _python(code, env=_env(autoload=False, PYTHONWARNINGS="always"))
        self.assertIn("OK", result.stdout)
        self.assertIn("torch.compiler.precompile is unavailable (AttributeError", result.stderr)

    def test_lazy_getattr_only_serves_our_names(self):
        import torch_precompile  # noqa: F401  (attached already in this process)

        with self.assertRaisesRegex(AttributeError, "no_such_name"):
            torch.compiler.no_such_name  # noqa: B018
        self.assertFalse(hasattr(torch.compiler, "no_such_name"))


class TestInstalledFiles(TestCase):
    def test_installed_files_only_add_precompile_modules(self):
        dist = _ours_distribution()
        torch_files = set(_torch_record())
        files = [str(f) for f in dist.files]
        self.assertTrue(files)
        for name in files:
            self.assertRegex(name, OURS, f"{DIST} installs an unexpected file")
            self.assertNotIn(name, torch_files, f"{DIST} overwrites torch's {name}")

    def test_modules_resolve_to_files_outside_torch(self):
        torch_dir = str(Path(torch.__file__).resolve().parent) + os.sep
        for path in sorted((REPO / "torch").glob("_precompile*.py")):
            spec = importlib.util.find_spec(f"torch_precompile.{path.stem}")
            self.assertIsNotNone(spec, f"torch_precompile.{path.stem} is not importable")
            origin = str(Path(spec.origin).resolve())
            self.assertFalse(origin.startswith(torch_dir), f"torch_precompile.{path.stem} resolves into torch: {origin}")

    def test_setup_py_builds_one_package_and_the_entry_point(self):
        setup = _setup_py()
        for path in (REPO / "torch").glob("*.py"):
            self.assertRegex(path.stem, r"^_precompile(_\w+)?$", "torch/ in this repo holds only _precompile*.py")
        self.assertFalse((REPO / "torch" / "__init__.py").exists(), "this repo must never ship torch/__init__.py")
        self.assertEqual(setup["packages"], ["torch_precompile"])
        self.assertEqual(setup["entry_points"], {"torch.backends": ["precompile = torch_precompile:_attach"]})
        # The releases torch/_precompile_compat.py has a path for, no others.
        (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH
        self.assertEqual(setup["install_requires"], [f"torch>={low_major}.{low_minor},<{high_major}.{high_minor + 1}"])


def _setup_py() -> dict:
    """The literal keyword arguments of setup() in setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg not in ("cmdclass", "ext_modules")}


def _make_venv(root: Path) -> Path:
    """A throwaway venv that reuses this interpreter's torch (and pip).

    ``--without-pip``: the pip + setuptools a venv would bundle are older than
    this interpreter's (its setuptools lacks bdist_wheel); with
    ``--system-site-packages`` the venv runs this interpreter's pip, which
    installs into the venv.  When this interpreter is itself a venv, its
    site-packages are added by a .pth file that calls ``site.addsitedir``
    (system site means the base's): as site directories, their own .pth files
    run too, so an editable install there (whose ``torch.backends`` entry point
    the child also sees) stays importable.
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if sys.prefix != sys.base_prefix:
        purelib = _python("import sysconfig; print(sysconfig.get_paths()['purelib'])", python=str(python))
        lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
        (Path(purelib.stdout.strip()) / "_parent_site.pth").write_text("\n".join(lines) + "\n")
    return python


VENV_REPORT = _NO_EDITABLE + """
import importlib.metadata, json, sysconfig
import torch
import torch_precompile, torch_precompile._precompile as ours
from torch_precompile import files
model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
f = torch_precompile.load(*torch_precompile.precompile(lambda m, x: m(x), model, x, backend="eager"))
torch.testing.assert_close(f(model, x), model(x))
dist = importlib.metadata.distribution("torch-precompile")
print(json.dumps({
    "purelib": sysconfig.get_paths()["purelib"],
    "dist_location": str(dist.locate_file("")),
    "files": [str(f) for f in dist.files],
    "shim": torch_precompile.__file__,
    "module": ours.__file__,
    "files_module": files.__file__,  # torch_precompile.files: an alias of _precompile_files
    "torch": torch.__file__,
    "attached": torch.compiler.precompile is ours.precompile and "precompile" in torch.compiler.__all__,
    "layout_guard": torch_precompile._precompile_runtime._LayoutGuard is not None,
}))
"""


class TestPipInstallUninstall(TestCase):
    @slow
    def test_pip_install_and_uninstall_leave_torch_unchanged(self):
        try:  # not find_spec("pip"): setuptools' distutils hack reacts to that
            importlib.metadata.distribution("pip")
        except importlib.metadata.PackageNotFoundError:
            self.skipTest("pip is not available")
        record = _torch_record()
        before = _guarded_hashes()
        for name in before:  # pristine torch to begin with
            self.assertEqual(before[name], record[name].hash.value, f"{name} differs from torch's RECORD")

        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            # Build from a copy, so the repo gets no build/ or egg-info races.
            src = tmp / "src"
            (src / "torch").mkdir(parents=True)
            shutil.copy2(REPO / "setup.py", src)
            shutil.copytree(REPO / "torch_precompile", src / "torch_precompile", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            for path in (REPO / "torch").glob("_precompile*.py"):
                shutil.copy2(path, src / "torch")
            python = str(_make_venv(tmp / "venv"))

            pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
            env = _env(PIP_NO_INDEX="1")
            subprocess.run(
                [*pip, "install", "--no-deps", "--no-build-isolation", str(src)],
                check=True, env=env, capture_output=True, timeout=300,
            )
            report = _last_json(_python(VENV_REPORT, python=python))
            purelib = Path(report["purelib"])
            self.assertEqual(Path(report["dist_location"]).resolve(), purelib.resolve())
            self.assertEqual(report["attached"], not TORCH_HAS_PRECOMPILE, report)
            package = purelib / "torch_precompile"
            self.assertEqual(Path(report["module"]).resolve(), (package / "_precompile.py").resolve())
            self.assertEqual(Path(report["shim"]).resolve(), (package / "__init__.py").resolve())
            self.assertEqual(Path(report["files_module"]).resolve(), (package / "_precompile_files.py").resolve())
            files = report["files"]
            # Built against this torch (a compiler is at hand wherever the tests run) and used by the driver.
            self.assertTrue(report["layout_guard"], "pip install . did not build torch_precompile._C")
            self.assertTrue(any(re.fullmatch(r"torch_precompile/_C_\w+\.[\w-]+\.so", name) for name in files), files)
            for path in (REPO / "torch").glob("_precompile*.py"):
                self.assertIn(f"torch_precompile/{path.name}", files)
            torch_files = set(record)
            for name in files:
                self.assertRegex(name, OURS, "pip install . installed an unexpected file")
                self.assertNotIn(name, torch_files, f"pip install . would overwrite torch's {name}")
                self.assertTrue((purelib / name).exists(), name)
            self.assertEqual(_guarded_hashes(), before, "pip install . changed torch's files")

            subprocess.run([*pip, "uninstall", "-y", DIST], check=True, env=env, capture_output=True, timeout=300)
            for name in files:
                self.assertFalse((purelib / name).exists(), f"pip uninstall left {name}")
            self.assertEqual(list(purelib.glob("torch_precompile*")), [])
            self.assertEqual(_guarded_hashes(), before, "pip uninstall changed torch's files")
            # Stock torch still imports in the venv.
            _python("import torch; assert torch.ones(1).item() == 1", python=python)


@unittest.skipIf(TORCH_HAS_PRECOMPILE, OWN_PRECOMPILE)
class TestInTreePatch(TestCase):
    """patches/torch_compiler_init.patch: the same attach as three lines in torch."""

    def _tree_with_torch_compiler_init(self, root: Path) -> Path:
        source = Path(_torch_record()["torch/compiler/__init__.py"].locate())
        target = root / "torch" / "compiler" / "__init__.py"
        target.parent.mkdir(parents=True)
        shutil.copy2(source, target)
        return target

    def _apply(self, root: Path, check: bool) -> subprocess.CompletedProcess:
        if shutil.which("git"):
            cmd = ["git", "apply", "-v", *(["--check"] if check else []), str(PATCH)]
        elif shutil.which("patch"):
            cmd = ["patch", "-p1", "--forward", *(["--dry-run"] if check else []), "-i", str(PATCH)]
        else:
            self.skipTest("neither git nor patch is installed")
        return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=60)

    def test_patch_is_additive(self):
        lines = PATCH.read_text().splitlines()
        self.assertTrue(any(l.startswith("--- a/torch/compiler/__init__.py") for l in lines))
        self.assertTrue(any(l.startswith("+++ b/torch/compiler/__init__.py") for l in lines))
        removed = [l for l in lines if l.startswith("-") and not l.startswith("---")]
        self.assertEqual(removed, [], "the in-tree patch only adds lines")

    def test_patch_applies_to_torch_2_13(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            target = self._tree_with_torch_compiler_init(root)
            check = self._apply(root, check=True)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
            applied = self._apply(root, check=False)
            self.assertEqual(applied.returncode, 0, applied.stdout + applied.stderr)
            tree = ast.parse(target.read_text())
        all_names = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]
        )
        for name in NAMES:
            self.assertEqual(all_names.count(name), 1)
        imports = [
            n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "torch._precompile"
        ]
        self.assertEqual(len(imports), 1)
        self.assertEqual(sorted(a.name for a in imports[0].names), sorted(NAMES))

    @slow
    def test_patched_torch_compiler_attaches_without_entry_point(self):
        # Serve torch.compiler from the patched file (torch's own package dir
        # for its submodules) and torch._precompile* from this repo's torch/
        # (the files a PyTorch checkout would hold) with autoload off: the
        # import alone must attach.
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            target = self._tree_with_torch_compiler_init(root)
            applied = self._apply(root, check=False)
            self.assertEqual(applied.returncode, 0, applied.stdout + applied.stderr)
            finder = f"""
                import importlib.abc, importlib.util, os, sys
                class PatchedCompiler(importlib.abc.MetaPathFinder):
                    def find_spec(self, name, path=None, target=None):
                        if name == "torch.compiler":
                            return importlib.util.spec_from_file_location(
                                name, {str(target)!r},
                                submodule_search_locations=[os.path.join(path[0], "compiler")])
                        if name.startswith("torch._precompile"):
                            return importlib.util.spec_from_file_location(
                                name, os.path.join({str(REPO / "torch")!r}, name.split(".")[1] + ".py"))
                sys.meta_path.insert(0, PatchedCompiler())
            """
            served = f"assert torch.compiler.__file__ == {str(target)!r}, torch.compiler.__file__"
            code = _code(finder, _attach_report("torch._precompile"), served)
            result = _python(code, env=_env(autoload=False, TORCH_LOGS="precompile"), check=False)
        self.assertEqual(result.returncode, 0, result.stderr)
        report = _last_json(result)
        self.assertTrue(report["attached"] and report["same"] and report["exception"], report)
        self.assertEqual(report["in_all"], [1, 1], report)


if __name__ == "__main__":
    run_tests()
