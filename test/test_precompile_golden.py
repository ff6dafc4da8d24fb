# Owner: the format promise (Note [precompile programming model], invariant 7).
"""Pairs written by earlier versions of the package load and compute what eager computes.

``test/precompile_golden/convention-C-cache-K/`` holds the pairs
``_precompile_golden.py`` wrote with the package whose python_code has
convention version C and whose cache has version K.  The oldest of them are
the minimums ``load`` claims to read (``MIN_CONVENTION_VERSION``,
``MIN_CACHE_VERSION``): a constant moved without a golden pair fails here.
"""

import gzip
import os
import re
import warnings
from unittest import mock

import torch
from torch._inductor.codecache import CppPythonBindingsCodeCache
from torch.testing._internal.common_utils import instantiate_parametrized_tests, parametrize, run_tests, TestCase

import _precompile_golden as golden
import torch_precompile
import torch_precompile._precompile_artifact as artifact_module
import torch_precompile._precompile_format as format_module


GOLDEN_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "precompile_golden")
_DIRECTORY = re.compile(r"convention-(\d+)-cache-(\d+)")
VERSIONS = {
    name: tuple(map(int, _DIRECTORY.fullmatch(name).groups())) for name in sorted(os.listdir(GOLDEN_ROOT))
}
PAIRS = [f"{directory}/{program}_{backend}" for directory in VERSIONS for program in golden.programs() for backend in golden.BACKENDS]
STEPS = 3


def _read(pair: str) -> tuple[str, bytes]:
    path = os.path.join(GOLDEN_ROOT, pair)
    with gzip.open(path + ".py.gz") as f:
        python_code = f.read().decode()
    with gzip.open(path + ".cache.gz") as f:
        return python_code, f.read()


def _made_here(python_code: str, cache: bytes) -> bool:
    """Whether this host could use the pair's cache as is: its kernels' build environment and its Python."""
    artifact = format_module.read_artifact(python_code, cache)
    built = artifact.envelope["build_env"]
    return built == format_module._host_environment(built) and bool(artifact.compiled)


def _generated_by_another_torch(cache: bytes) -> bool:
    return format_module._read_envelope(cache)["build_env"]["torch"] != str(torch.__version__)


def _compiled_for_another_isa(python_code: str, cache: bytes) -> bool:
    """Whether load refuses the pair here: its kernels must be compiled and, older than
    INDUCTOR_VEC_ISA, their C++ was written for another host's vector ISA (Note invariant 9)."""
    artifact = format_module.read_artifact(python_code, cache)
    built = artifact.envelope["build_env"]
    return (
        artifact.convention.backend == "inductor"
        and "INDUCTOR_VEC_ISA" not in artifact.constants
        and built != format_module._host_environment(built)
        and built["cpu_capability"] != torch.backends.cpu.get_cpu_capability()
    )


_ANOTHER_ISA = "predates INDUCTOR_VEC_ISA and its C++ kernels must be compiled here"


def _refuse_compiling(*args, **kwargs):
    raise AssertionError("a warm load of a pair made on this host compiled a kernel")


class TestGoldenArtifacts(TestCase):
    def test_the_oldest_golden_pairs_are_the_minimums_load_reads(self):
        conventions = {c for c, _ in VERSIONS.values()}
        caches = {k for _, k in VERSIONS.values()}
        self.assertEqual(min(conventions), format_module.MIN_CONVENTION_VERSION)
        self.assertEqual(min(caches), format_module.MIN_CACHE_VERSION)
        current = golden.directory_name(format_module.CONVENTION_VERSION, format_module.CACHE_VERSION)
        self.assertIn(current, VERSIONS, "the current format has no golden pairs: run test/_precompile_golden.py")

    @parametrize("pair", PAIRS)
    def test_golden_pair_computes_eager(self, pair):
        python_code, cache = _read(pair)
        directory, stem = pair.split("/")
        self.assertEqual(golden.versions(python_code, cache), VERSIONS[directory])
        program = stem.rsplit("_", 1)[0]
        fn, arguments = golden.programs()[program]
        model, reference = golden.model(), golden.model()
        ours, theirs = arguments(model), arguments(reference)
        warm = _made_here(python_code, cache)
        compiled_sections = []
        compile_section = artifact_module._compile_section

        def recording(filename, line_offset, text):
            compiled_sections.append(text)
            return compile_section(filename, line_offset, text)

        with warnings.catch_warnings():
            # On another torch or Python the cache's kernels or bytecode are unusable: load warns and compiles.
            warnings.simplefilter("ignore")
            with mock.patch.object(artifact_module, "_compile_section", recording), mock.patch.object(
                CppPythonBindingsCodeCache, "load_pybinding", _refuse_compiling if warm else CppPythonBindingsCodeCache.load_pybinding
            ):
                if _compiled_for_another_isa(python_code, cache):
                    with self.assertRaisesRegex(torch_precompile.PrecompileError, re.escape(_ANOTHER_ISA)):
                        torch_precompile.load(python_code, cache)
                    return
                try:
                    f = torch_precompile.load(python_code, cache)
                except torch_precompile.PrecompileError as error:
                    # Inductor's C++ kernels are written against the headers of the torch
                    # release that generated them: another release may refuse them, clearly.
                    if not (stem.endswith("_inductor") and _generated_by_another_torch(cache)):
                        raise
                    self.assertIn("compiling a kernel of this artifact failed", str(error))
                    return
                results = [f(*ours) for _ in range(STEPS if program == "train_step" else 1)]
        expected = [fn(*theirs) for _ in results]
        for got, want in zip(results, expected):
            torch.testing.assert_close(got, want.detach())
        for got, want in zip(ours[0].parameters(), theirs[0].parameters()):
            torch.testing.assert_close(got, want)
            self.assertEqual(got.grad, want.grad)
        if program == "train_step":
            torch.testing.assert_close(ours[1].state_dict(), theirs[1].state_dict())
        if warm:
            # The cache's sections run as they are; a driver other than the installed one is compiled.
            driver = artifact_module._split_sections(python_code)["driver"][1]
            installed = format_module._is_installed_driver(driver)
            self.assertEqual(compiled_sections, [] if installed or VERSIONS[directory][1] < 11 else [driver])

    def test_a_pair_older_than_the_isa_record_is_refused_where_the_capability_differs(self):
        """Its own driver would compile its C++ for this host's ISA: wrong results, as the
        golden pairs (made on an AVX512 host) computed on an AVX2 one."""
        newest = max(VERSIONS, key=VERSIONS.get)
        python_code, cache = _read(f"{newest}/forward_inductor")
        self.assertNotIn("INDUCTOR_VEC_ISA", format_module._read_constants(python_code))
        built = format_module._read_envelope(cache)["build_env"]["cpu_capability"]
        with mock.patch.object(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the cache's kernels, built for another host
            with self.assertRaisesRegex(
                torch_precompile.PrecompileError,
                re.escape(f"whose CPU capability was {built} (its cache's build environment), while this machine's is DEFAULT"),
            ):
                torch_precompile.load(python_code, cache)


instantiate_parametrized_tests(TestGoldenArtifacts)


if __name__ == "__main__":
    run_tests()
