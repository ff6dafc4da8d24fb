# Owner(s): ["module: dynamo"]
"""Tests for ``python -m torch_precompile inspect`` (torch/_precompile_inspect.py).

The inspector runs as users run it, in a subprocess.  The two artifacts (an
eager and an inductor one of the same tiny training step) are built once per
test process and written to a shared directory.
"""

import ast
import contextlib
import gzip
import io
import json
import os
import pprint
import subprocess
import sys
import tempfile
import textwrap

import torch
import torch.nn as nn
from torch.testing._internal.common_utils import run_tests, TestCase

import torch_precompile
import torch_precompile._precompile_files as files_module
import torch_precompile._precompile_format as format_module
import torch_precompile._precompile_runtime as runtime
import torch_precompile._precompile_schema as schema
from torch_precompile._precompile_inspect import describe, format_report, main, NO_CACHE, OWN_DRIVER, report
from torch_precompile import precompile, PrecompileError


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERROR_PREFIX = "torch_precompile inspect: error: "
V, CV = format_module.CONVENTION_VERSION, format_module.CACHE_VERSION


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model[0].bias.requires_grad_(False)  # frozen: receives no gradient
    return model


def _step(model, x, extra):
    loss = ((model(x) - extra["target"]) ** 2).mean() * extra["scale"]
    loss.backward()
    return {"loss": loss, "tag": "train"}


def _example():
    return _model(), torch.randn(5, 4), {"target": torch.randn(5, 3), "scale": 0.5}


_DIR = None
_FILES: dict = {}


def _files(backend):
    """(code_file, cache_file) of the step precompiled with ``backend``; built once."""
    global _DIR
    if backend not in _FILES:
        if _DIR is None:
            _DIR = tempfile.TemporaryDirectory()
        python_code, cache = torch_precompile.precompile(_step, *_example(), backend=backend)
        _FILES[backend] = (
            _write(f"{backend}.py", python_code.encode()),
            _write(f"{backend}.cache", cache),
        )
    return _FILES[backend]


def _write(name, data):
    path = os.path.join(_DIR.name, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _edit_convention(name, code_file, edit):
    """Write a copy of code_file whose CALLING_CONVENTION literal went through ``edit``."""
    code = _read(code_file).decode()
    lines = code.splitlines(keepends=True)
    (node,) = [
        n for n in ast.parse(code).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "CALLING_CONVENTION"
    ]  # fmt: skip
    literal = ast.literal_eval(node.value)
    edit(literal)
    new = f"CALLING_CONVENTION = {pprint.pformat(literal, sort_dicts=False)}\n"
    return _write(name, "".join(lines[: node.lineno - 1] + [new] + lines[node.end_lineno :]).encode())


def _inspect(*args):
    """The inspector as users run it: a fresh `python -m torch_precompile inspect`."""
    return subprocess.run(
        [sys.executable, "-m", "torch_precompile", "inspect", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _main(*args):
    """The same command in this process (no interpreter start-up): main(argv)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        returncode = main(["inspect", *args])
    return subprocess.CompletedProcess(args, returncode, stdout.getvalue(), stderr.getvalue())


class InspectTestCase(TestCase):
    def inspect_json(self, code_file, cache_file, returncode=0, run=_main):
        result = run(code_file, cache_file, "--json")
        self.assertEqual(result.returncode, returncode, result.stderr)
        self.assertEqual(result.stderr, "")
        return json.loads(result.stdout)

    def assertOneLineError(self, result, *fragments):
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertNotIn("Traceback", result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith(ERROR_PREFIX), lines[0])
        for fragment in fragments:
            self.assertIn(fragment, lines[0])


class TestInspectReport(InspectTestCase):
    def check_common(self, report, backend):
        supported = {
            "python_code": [format_module.MIN_CONVENTION_VERSION, V],
            "cache": [format_module.MIN_CACHE_VERSION, CV],
        }
        self.assertEqual(report["format_version"], {"python_code": V, "cache": CV, "supported": supported})
        self.assertEqual(report["backend"], {"python_code": backend, "cache": backend})
        self.assertEqual(
            report["pair"],
            {
                "belongs_together": True,
                "problem": None,
                "backend_matches": True,
                "code_hash_matches": True,
            },
        )
        env = report["build_environment"]
        self.assertEqual(env["host"], format_module._build_environment())
        self.assertEqual(env["cache"], env["host"])
        self.assertTrue(env["matches_host"])
        self.assertEqual(env["differs"], [])
        self.assertEqual(report["arity"], 3)
        self.assertEqual(report["call"], "forward(args[0]: nn.Module, args[1], args[2])")
        self.assertEqual(report["modules"], [{"position": 0, "parameters": 4, "buffers": 3}])
        # Linear(4, 3) + BatchNorm1d(3): 12 + 3 + 3 + 3 float32; running stats + int64 counter.
        parameters, buffers = dict(report["parameters"]), dict(report["buffers"])
        named = {kind: summary.pop("tensors") for kind, summary in (("parameters", parameters), ("buffers", buffers))}
        self.assertEqual(
            parameters,
            {"count": 4, "elements": 21, "bytes": 21 * 4, "dtypes": {"float32": 4}, "devices": {"cpu": 4}},
        )
        self.assertEqual(
            buffers,
            {"count": 3, "elements": 7, "bytes": 6 * 4 + 8, "dtypes": {"float32": 2, "int64": 1}, "devices": {"cpu": 3}},
        )
        # --json lists every parameter and buffer by name.
        self.assertEqual(
            [(t["name"], t["shape"], t["dtype"], t["device"], t["bytes"]) for t in named["parameters"]],
            [
                ("args[0].0.weight", [3, 4], "float32", "cpu", 48),
                ("args[0].0.bias", [3], "float32", "cpu", 12),
                ("args[0].1.weight", [3], "float32", "cpu", 12),
                ("args[0].1.bias", [3], "float32", "cpu", 12),
            ],
        )
        self.assertEqual(
            [(t["name"], t["shape"], t["dtype"], t["device"], t["bytes"]) for t in named["buffers"]],
            [
                ("args[0].1.running_mean", [3], "float32", "cpu", 12),
                ("args[0].1.running_var", [3], "float32", "cpu", 12),
                ("args[0].1.num_batches_tracked", [], "int64", "cpu", 8),
            ],
        )
        # Both backends specialize on layout.
        self.assertEqual(named["parameters"][0]["stride"], [4, 1])
        self.assertEqual(report["tied"], [])
        inputs = {entry["path"]: entry for entry in report["inputs"]}
        self.assertEqual(list(inputs), ["args[1]", "args[2]['target']", "args[2]['scale']"])
        self.assertEqual(inputs["args[1]"]["kind"], "tensor")
        self.assertEqual(inputs["args[1]"]["shape"], [5, 4])
        self.assertEqual(inputs["args[1]"]["dtype"], "float32")
        self.assertEqual(inputs["args[1]"]["device"], "cpu")
        self.assertEqual(inputs["args[1]"]["free_dims"], [])
        self.assertIsNone(inputs["args[1]"]["memory_format"])
        self.assertEqual(inputs["args[1]"]["bytes"], 80)
        self.assertEqual(inputs["args[2]['target']"]["shape"], [5, 3])
        self.assertEqual(inputs["args[2]['scale']"], {"path": "args[2]['scale']", "kind": "value", "value": "0.5"})
        self.assertEqual(
            report["outputs"],
            [
                {
                    "path": "result['loss']",
                    "kind": "tensor",
                    "graph_output": 0,
                    "shape": [],
                    "dtype": "float32",
                    "device": "cpu",
                },
                {"path": "result['tag']", "kind": "value", "value": "'train'"},
            ],
        )
        self.assertEqual(
            [g["name"] for g in report["grad_params"]],
            ["args[0].0.weight", "args[0].1.weight", "args[0].1.bias"],  # 0.bias is frozen
        )
        self.assertEqual(report["grad_params"][0]["shape"], [3, 4])
        self.assertEqual(report["constants"], {"count": 0, "bytes": 0})
        return inputs

    def test_json_eager(self):
        code_file, cache_file = _files("eager")
        report = self.inspect_json(code_file, cache_file)
        inputs = self.check_common(report, "eager")
        self.assertEqual(inputs["args[1]"]["stride"], [4, 1])  # eager specializes on layout too
        self.assertEqual(report["kernels"], {"count": 0, "bytes": 0})
        self.assertIn("no compiled kernels", report["build_environment"]["consequence"])
        self.assertEqual(report["code_file"], code_file)
        self.assertEqual(report["cache_file"], cache_file)
        self.assertEqual(
            report["sizes"], {"python_code": os.path.getsize(code_file), "cache": os.path.getsize(cache_file)}
        )

    def test_json_inductor(self):
        code_file, cache_file = _files("inductor")
        report = self.inspect_json(code_file, cache_file, run=_inspect)
        inputs = self.check_common(report, "inductor")
        self.assertEqual(inputs["args[1]"]["stride"], [4, 1])
        kernels = format_module._read_envelope(_read(cache_file))["artifact"]["kernels"]
        self.assertGreater(len(kernels), 0)
        self.assertEqual(report["kernels"], {"count": len(kernels), "bytes": sum(map(len, kernels.values()))})
        self.assertIn("load directly", report["build_environment"]["consequence"])

    def test_json_is_describe(self):
        code_file, cache_file = _files("eager")
        report = self.inspect_json(code_file, cache_file)
        expected = describe(_read(code_file).decode(), _read(cache_file))
        self.assertEqual({k: v for k, v in report.items() if k not in ("code_file", "cache_file")}, expected)

    def test_text(self):
        for backend, stride, kernels in (("eager", " stride (4, 1)", "kernels             0, 0 bytes"), ("inductor", " stride (4, 1)", "")):
            with self.subTest(backend=backend):
                code_file, cache_file = _files(backend)
                result = _inspect(code_file, cache_file)
                self.assertEqual(result.returncode, 0, result.stderr)
                self.assertEqual(result.stderr, "")
                text = result.stdout
                for line in (
                    "torch.compiler.precompile artifact",
                    f"  python_code         {code_file} (",
                    f"  cache               {cache_file} (",
                    f"  format version      {V} (cache {CV}; this torch reads "
                    f"{format_module.MIN_CONVENTION_VERSION}..{V} and caches {format_module.MIN_CACHE_VERSION}..{CV})",
                    f"  backend             {backend}\n",
                    "  pair                belongs together",
                    "matches this host",
                    "  calling convention  forward(args[0]: nn.Module, args[1], args[2])",
                    "  module              args[0]: 4 parameters, 3 buffers",
                    "  parameters          4 tensors, 21 elements, 84 bytes; dtypes float32 x4; devices cpu x4\n"
                    "                      args[0].0.weight (3, 4), args[0].0.bias (3,), args[0].1.weight (3,), "
                    "... (1 more; --json lists all)\n",
                    "  buffers             3 tensors, 7 elements, 32 bytes; dtypes float32 x2, int64 x1; devices cpu x3\n"
                    "                      args[0].1.running_mean (3,), args[0].1.running_var (3,), "
                    "args[0].1.num_batches_tracked ()\n",
                    f"  input               args[1]: (5, 4) float32 cpu{stride}\n",
                    "  input               args[2]['scale']: value 0.5 (baked)",
                    "  input               args[2]['target']: (5, 3) float32 cpu",
                    "  output              result['loss']: () float32 cpu (graph output 0)",
                    "  output              result['tag']: value 'train' (baked)",
                    "  grad params         3\n",
                    f"args[0].0.weight: (3, 4) float32 cpu{stride}",
                    kernels,
                ):
                    self.assertIn(line, text)
                self.assertNotIn("args[0].0.bias:", text)

    def test_build_environment_mismatch(self):
        code_file, cache_file = _files("inductor")
        envelope = format_module._read_envelope(_read(cache_file))
        envelope["build_env"] = {**envelope["build_env"], "torch": "2.12.0", "cpu_capability": "NO AVX"}
        foreign = _write("foreign_host.cache", format_module._pack_envelope(envelope))
        report = self.inspect_json(code_file, foreign)  # still a loadable pair: exit 0
        env = report["build_environment"]
        self.assertFalse(env["matches_host"])
        self.assertEqual(env["differs"], ["cpu_capability", "torch"])
        self.assertIn("compile the kernels", env["consequence"])
        self.assertTrue(report["pair"]["belongs_together"])
        text = _main(code_file, foreign).stdout
        self.assertIn("DIFFERS from this host", text)

    def test_free_dims_and_tied_weights(self):
        # Capture does not emit free dims or tied names for this model: edit the literal.
        def edit(convention):
            x = convention["inputs"][0]["tensor"]  # args[1], captured as (5, 4)
            x["shape"][0] = None
            x["free_dims"] = [[0, 0, 2, 64]]
            x["memory_format"] = "contiguous_format"
            x["stride"] = None  # free dims: the layout is pinned as a memory format instead
            convention["state"][2]["names"].append([0, "1.weight_alias"])
            convention["modules"][0]["parameters"].append("1.weight_alias")  # keep it consistent

        code_file, cache_file = _files("eager")
        edited = _edit_convention("free_dims.py", code_file, edit)
        report = self.inspect_json(edited, cache_file, returncode=3)  # edited: code_hash differs
        x = report["inputs"][0]
        self.assertEqual((x["path"], x["shape"], x["bytes"]), ("args[1]", [None, 4], None))
        self.assertEqual(x["free_dims"], [{"dim": 0, "size_group": 0, "min": 2, "max": 64}])
        self.assertEqual(x["memory_format"], "contiguous_format")
        self.assertEqual(report["tied"], [["args[0].1.weight", "args[0].1.weight_alias"]])
        text = _main(edited, cache_file).stdout
        self.assertIn("args[1]: (*, 4) float32 cpu contiguous_format; dim 0 free in [2, 64] (size group 0)", text)
        self.assertIn("tied                args[0].1.weight = args[0].1.weight_alias", text)

    def test_does_not_execute_the_artifact(self):
        code_file, cache_file = _files("eager")
        marker = os.path.join(_DIR.name, "executed")
        booby_trapped = _write(
            "trapped.py", _read(code_file) + f"\nopen({marker!r}, 'w').close()\nraise SystemExit(7)\n".encode()
        )
        result = _inspect(booby_trapped, cache_file)
        self.assertEqual(result.returncode, 3, result.stderr)  # edited: the cache no longer matches
        self.assertFalse(os.path.exists(marker))


class TestInspectMismatch(InspectTestCase):
    def test_backend_mismatch(self):
        eager_code, _ = _files("eager")
        _, inductor_cache = _files("inductor")
        report = self.inspect_json(eager_code, inductor_cache, returncode=3)
        pair = report["pair"]
        self.assertFalse(pair["belongs_together"])
        self.assertFalse(pair["backend_matches"])
        self.assertFalse(pair["code_hash_matches"])
        self.assertIn("backend 'inductor'", pair["problem"])
        self.assertEqual(report["backend"], {"python_code": "eager", "cache": "inductor"})
        text = _inspect(eager_code, inductor_cache)
        self.assertEqual(text.returncode, 3)
        self.assertIn("pair                DOES NOT belong together: cache was built for backend 'inductor'", text.stdout)

    def test_edited_code(self):
        code_file, cache_file = _files("inductor")
        edited = _write("edited.py", _read(code_file) + b"\n# an innocent edit\n")
        pair = self.inspect_json(edited, cache_file, returncode=3)["pair"]
        self.assertEqual(
            (pair["belongs_together"], pair["backend_matches"], pair["code_hash_matches"]), (False, True, False)
        )
        self.assertIn("code_hash mismatch", pair["problem"])


    def test_files_are_read_as_python_reads_source(self):
        # A UTF-8 byte-order mark and CRLF line endings are undone, as files.load undoes them.
        code_file, cache_file = _files("eager")
        transcoded = _write("transcoded.py", b"\xef\xbb\xbf" + _read(code_file).replace(b"\n", b"\r\n"))
        pair = self.inspect_json(transcoded, cache_file)["pair"]
        self.assertTrue(pair["belongs_together"], pair)

class TestReader(InspectTestCase):
    """read_artifact: what load() reads, the inspector reports and the benchmarks use."""

    def test_reads_a_pair(self):
        code_file, cache_file = _files("inductor")
        code, cache = _read(code_file).decode(), _read(cache_file)
        artifact = format_module.read_artifact(code, cache)
        envelope = format_module._read_envelope(cache)
        self.assertEqual(artifact.cache_size, len(cache))
        self.assertEqual(artifact.convention, format_module._read_convention(code))
        self.assertEqual(artifact.kernels, envelope["artifact"]["kernels"])
        self.assertEqual(sorted(artifact.kernel_hashes), sorted(artifact.kernels))
        self.assertEqual((artifact.pair_error, artifact.version_error, artifact.cache_error), (None, None, None))
        self.assertIsNone(artifact.pair_problem)
        self.assertEqual(report(artifact), describe(code, cache))
        # The output's shape and dtype are in the calling convention.
        self.assertEqual(
            artifact.convention.output_tensors, (schema.TensorSpec((), None, "float32", "cpu"),)
        )

    def test_verdicts(self):
        code_file, cache_file = _files("inductor")
        code, cache = _read(code_file).decode(), _read(cache_file)
        eager_cache = _read(_files("eager")[1])
        envelope = format_module._read_envelope(cache)
        first = next(iter(envelope["artifact"]["kernels"]))
        tampered = {**envelope, "artifact": {**envelope["artifact"], "kernels": {first: b"\x00"}}}
        damaged = format_module._pack_envelope(tampered)
        too_old = format_module.MIN_CACHE_VERSION - 1  # below what this torch reads
        older = format_module._pack_envelope({**envelope, "version": too_old})
        for name, pair_cache, field, message in (
            ("other backend", eager_cache, "pair_error", "built for backend 'eager'"),
            ("other version", older, "version_error", f"format version {too_old}"),
            ("damaged payload", damaged, "cache_error", "payload does not match its recorded sha256"),
            ("not a cache", b"", "cache_error", "not a zip archive"),
        ):
            with self.subTest(name):
                artifact = format_module.read_artifact(code, pair_cache)
                verdicts = {f: getattr(artifact, f) for f in ("pair_error", "version_error", "cache_error")}
                self.assertIn(message, str(verdicts.pop(field)))
                self.assertEqual(verdicts, dict.fromkeys(verdicts))
        with self.assertRaisesRegex(PrecompileError, "the pair does not belong together"):
            precompile.load(code, eager_cache)

    def test_checks_are_the_runnables(self):
        """The report lists what a loaded runnable checks (f.checks), read without executing python_code."""
        code_file, cache_file = _files("inductor")
        code, cache = _read(code_file).decode(), _read(cache_file)
        self.assertEqual(describe(code, cache)["driver"], "installed")
        listed = describe(code, cache)["checks"]
        self.assertEqual(listed, [str(check) for check in torch_precompile.load(code, cache).checks])
        text = _main(code_file, cache_file).stdout
        self.assertRegex(text, rf"  checks              {len(listed)} at every call \(binding x1, .*\); --checks lists them\n")
        self.assertNotIn(listed[-1], text)
        full = _main(code_file, cache_file, "--checks").stdout
        for line in listed:
            self.assertIn(f"\n                      {line}\n", full)

    def test_checks_of_an_artifact_with_its_own_driver_are_not_listed(self):
        # load runs the artifact's driver, not the installed one: this older golden pair's
        # driver checks no torch function mode, which the installed one does.
        golden = os.path.join(REPO, "test", "precompile_golden", "convention-11-cache-11", "forward_eager")
        with gzip.open(golden + ".py.gz", "rt") as f:
            code = f.read()
        with gzip.open(golden + ".cache.gz", "rb") as f:
            cache = f.read()
        # A current artifact whose driver section was edited is another such pair.
        current, current_cache = _read(_files("eager")[0]).decode(), _read(_files("eager")[1])
        marker = format_module._marker("driver")
        edited = current.replace(marker, marker + "# an edit\n", 1)
        for name, (python_code, pair_cache) in {"golden": (code, cache), "edited": (edited, current_cache)}.items():
            with self.subTest(name):
                described = describe(python_code, pair_cache)
                self.assertEqual((described.get("driver"), described["checks"]), ("own", None))
                self.assertIn(f"  checks              {OWN_DRIVER}\n", format_report(described, checks=True))
                summary = files_module.PrecompileSummary._of(python_code, pair_cache)
                self.assertIsNone(summary.checks)
                self.assertIn(f"checked at every call: {OWN_DRIVER}", str(summary))
        self.assertFalse(any("torch function" in str(c) for c in torch_precompile.load(code, cache).checks))

    def test_named_classes_are_not_imported(self):
        # `python -m` puts the working directory on sys.path: a module shipped next to a
        # downloaded artifact would run if the inspector imported the classes it names.
        with tempfile.TemporaryDirectory() as directory:
            marker = os.path.join(directory, "IMPORTED")
            with open(os.path.join(directory, "shipped_module.py"), "w") as f:
                f.write(textwrap.dedent(f"""
                    import collections
                    open({marker!r}, "w").close()
                    Pair = collections.namedtuple("Pair", ["x", "scale"])
                """))
            sys.path.insert(0, directory)
            try:
                import shipped_module

                example = shipped_module.Pair(torch.randn(3, 4), torch.tensor(2.0))
                code, cache = precompile(lambda m, p: m(p.x) * p.scale, nn.Linear(4, 2), example, backend="eager")
            finally:
                sys.path.remove(directory)
                sys.modules.pop("shipped_module", None)
            os.unlink(marker)
            for name, data in (("a.py", code.encode()), ("a.cache", cache)):
                with open(os.path.join(directory, name), "wb") as f:
                    f.write(data)
            command = [sys.executable, "-m", "torch_precompile", "inspect", "a.py", "a.cache"]
            text = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=300)
            as_json = subprocess.run([*command, "--json"], cwd=directory, capture_output=True, text=True, timeout=300)
            self.assertFalse(os.path.exists(marker), "the inspector imported shipped_module")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("  class               shipped_module.Pair: named by import path, not imported here", text.stdout)
        self.assertEqual(json.loads(as_json.stdout)["unimported_classes"], ["shipped_module.Pair"])

    def test_empty_cache_is_no_cache_as_for_load(self):
        code_file, _ = _files("inductor")
        code = _read(code_file).decode()
        described = describe(code, b"")
        self.assertEqual(described["pair"], {
            "belongs_together": True, "problem": None, "backend_matches": None, "code_hash_matches": None,
        })  # fmt: skip
        self.assertEqual(described["build_environment"]["consequence"], NO_CACHE)
        self.assertEqual((described["kernels"]["count"], described["format_version"]["cache"]), (0, None))
        result = _main(code_file, _write("empty.cache", b""))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"  build environment   {NO_CACHE}\n", result.stdout)
        with self.assertWarnsRegex(UserWarning, "ignoring the cache"):
            f = torch_precompile.load(code, b"")
        model, x, extra = _example()
        reference, _, _ = _example()
        torch.testing.assert_close(f(model, x, extra)["loss"], _step(reference, x, extra)["loss"])

    def test_outputs_with_free_dims(self):
        x = torch.randn(6, 4)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        code, cache = precompile(lambda m, x: (torch.cat([m(x), m(x)]), m(x).double().sum(0)), nn.Linear(4, 3), x)
        outputs = describe(code, cache)["outputs"]
        self.assertEqual(
            [(o["path"], o["shape"], o["dtype"]) for o in outputs],
            [("result[0]", [None, 3], "float32"), ("result[1]", [3], "float64")],
        )
        self.assertIn("  output              result[0]: (*, 3) float32 cpu (graph output 0)", format_report(describe(code, cache)))


class TestInspectBadFiles(InspectTestCase):
    def test_missing_files(self):
        code_file, cache_file = _files("eager")
        missing = os.path.join(_DIR.name, "missing.py")
        self.assertOneLineError(_inspect(missing, cache_file), missing, "cannot read")
        self.assertOneLineError(_main(code_file, missing), missing, "cannot read")
        self.assertOneLineError(_main(code_file, _DIR.name), _DIR.name, "cannot read")

    def test_corrupt_code_file(self):
        code_file, cache_file = _files("eager")
        code = _read(code_file)
        for i, (name, data, fragment) in enumerate((
            ("syntax.py", code[: len(code) // 2] + b"\ndef (:\n", "not valid Python"),
            ("plain.py", b"x = 1\n", "missing the calling-convention metadata"),
            ("binary.py", b"\xff\xfe\x00garbage", "not UTF-8"),
            ("cache_as_code.py", _read(cache_file), "python_code"),
            ("future.py", code.replace(f"{{'format_version': {V},".encode(), f"{{'format_version': {V + 1},".encode(), 1), "newer"),
        )):
            with self.subTest(name):
                path = _write(name, data)
                run = _inspect if i == 0 else _main  # one fresh interpreter is enough
                self.assertOneLineError(run(path, cache_file), path, fragment)

    def test_malformed_calling_convention(self):
        code_file, cache_file = _files("eager")
        for name, edit, fragment in (
            ("unknown_field.py", lambda c: c.update(extra=1), "unknown fields ['extra']"),
            ("bad_spec.py", lambda c: c.update(input_spec="not a tree spec"), "calling convention is malformed: input_spec"),
            ("bad_module.py", lambda c: c["state"][0].update(names=[[7, "w"]]), "calling convention is malformed: state[0].names"),
        ):
            with self.subTest(name):
                path = _edit_convention(name, code_file, edit)
                self.assertOneLineError(_main(path, cache_file), path, fragment)

    def test_corrupt_cache(self):
        code_file, cache_file = _files("inductor")
        cache = _read(cache_file)
        envelope = format_module._read_envelope(cache)
        first = next(iter(envelope["artifact"]["kernels"]))
        envelope["artifact"]["kernels"][first] += b"\x00"
        tampered = _write("tampered.cache", format_module._pack_envelope(envelope))
        for i, (path, fragment) in enumerate((
            (_write("truncated.cache", cache[: len(cache) // 2]), "damaged"),
            (_write("random.cache", os.urandom(4096)), "damaged"),
            (code_file, "damaged"),  # the code file passed as the cache
            (tampered, "sha256"),
        )):
            with self.subTest(os.path.basename(path)):
                run = _inspect if i == 0 else _main
                self.assertOneLineError(run(code_file, path), path, fragment)

    def test_usage_error(self):
        result = _inspect("only_one_file.py")
        self.assertEqual(result.returncode, 2)
        self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
    run_tests()
