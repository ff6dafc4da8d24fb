# Owner(s): ["module: dynamo"]
"""Tests for the kernel store of torch_precompile.load (issue 14).

load() writes the cache's compiled kernels to ``$TORCHINDUCTOR_CACHE_DIR/
precompile_kernels`` and imports them.  A planted, damaged or unwritable file
there must never run foreign code and never break a load; a damaged or foreign
cache only loses its acceleration.  One Inductor artifact (a tiny training
step, several kernels) is compiled per process and shared by every test.
"""

import contextlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
import zipfile
from unittest import mock

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing._internal.common_utils import run_tests, TestCase

import torch_precompile
import torch_precompile._precompile_artifact as artifact_module
import torch_precompile._precompile_format as format_module
import torch_precompile._precompile_kernel_store as kernel_store
from torch_precompile import PrecompileError


precompile = torch_precompile.precompile
NOBODY = 65534
_ARTIFACT: list = []


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(3, 8, generator=g), torch.randn(3, 4, generator=g)


def _train_step(m, x, y):
    loss = F.mse_loss(m(x), y)
    loss.backward()
    return loss


def _artifact():
    """The shared inductor (python_code, cache), compiled once per process."""
    if not _ARTIFACT:
        _ARTIFACT.append(precompile(_train_step, _model(), *_inputs()))
    return _ARTIFACT[0]


def _envelope(cache):
    return format_module._read_envelope(cache)


def _save(envelope):
    return format_module._pack_envelope(envelope)


def _is_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


class _StoreTestCase(TestCase):
    """Each test gets its own TORCHINDUCTOR_CACHE_DIR and fresh once-only warnings."""

    def setUp(self):
        super().setUp()
        self.code, self.cache = _artifact()
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.root = os.path.join(self.tmp, "cache")
        self.store = os.path.join(self.root, "precompile_kernels")
        patcher = mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": self.root})
        patcher.start()
        self.addCleanup(patcher.stop)
        artifact_module._warn_once.cache_clear()
        self.addCleanup(artifact_module._warn_once.cache_clear)

    def kernels(self, cache=None):
        """key -> (sha256, bytes) as load() would place them."""
        return artifact_module._usable_cache(format_module.read_artifact(self.code, cache or self.cache))[0]

    def some_kernel(self):
        digest, blob = next(iter(self.kernels().values()))
        return os.path.join(self.store, digest + ".so"), blob

    def assert_loads_correctly(self, cache=None):
        f = precompile.load(self.code, cache or self.cache)
        ref, model = _model(), _model()
        expected = _train_step(ref, *_inputs())
        torch.testing.assert_close(f(model, *_inputs()), expected)
        for p, q in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad)

    def assert_store_holds_exactly_the_kernels(self, files):
        for key, (digest, blob) in self.kernels().items():
            path = files[key]
            self.assertEqual(path, os.path.join(self.store, digest + ".so"))
            self.assertTrue(stat.S_ISREG(os.lstat(path).st_mode), f"{path} is not a regular file")
            with open(path, "rb") as f:
                self.assertEqual(f.read(), blob)
        self.assertEqual([n for n in os.listdir(self.store) if n.endswith(".tmp")], [])

    def assert_uses_fallback(self, cause):
        """The store is not used: one warning says why, a private directory serves instead."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            files = artifact_module._prime_kernels(self.kernels())
        self.assertEqual(len(caught), 1, [str(w.message) for w in caught])
        self.assertRegex(
            str(caught[0].message),
            f"not using the kernel store {re.escape(self.store)} \\(.*({cause}).*\\); using the private directory",
        )
        fallback = kernel_store.fallback_directory()
        self.assertTrue(all(os.path.dirname(path) == fallback for path in files.values()), files)
        self.assertEqual(stat.S_IMODE(os.stat(fallback).st_mode), 0o700)
        self.assert_loads_correctly()
        if os.path.isdir(self.store):
            self.assertEqual([n for n in os.listdir(self.store) if n.endswith(".tmp")], [])


class TestPlantedFiles(_StoreTestCase):
    def test_planted_extension_of_the_same_size_never_runs(self):
        # A foreign extension whose PyInit_kernel writes a marker, padded to the
        # kernel's size and planted under its name: load() must replace it.
        if shutil.which("g++") is None:
            self.skipTest("needs g++ to build the planted extension")
        path, blob = self.some_kernel()
        marker = os.path.join(self.tmp, "planted_code_ran")
        source = os.path.join(self.tmp, "planted.cpp")
        with open(source, "w") as f:
            f.write(f'#include <cstdio>\nextern "C" void* PyInit_kernel() {{ fclose(fopen("{marker}", "w")); return 0; }}\n')
        planted = os.path.join(self.tmp, "planted.so")
        subprocess.run(["g++", "-shared", "-fPIC", "-o", planted, source], check=True)
        if os.path.getsize(planted) > len(blob):
            self.skipTest("the planted extension is larger than the kernel")
        os.makedirs(self.store, mode=0o700)
        with open(planted, "rb") as f, open(path, "wb") as out:
            out.write(f.read().ljust(len(blob), b"\0"))
        # A fresh process: this one may already have imported the genuine kernel.
        code_file, cache_file = os.path.join(self.tmp, "a.py"), os.path.join(self.tmp, "a.cache")
        with open(code_file, "w") as f:
            f.write(self.code)
        with open(cache_file, "wb") as f:
            f.write(self.cache)
        script = textwrap.dedent(
            f"""
            import sys, torch, torch_precompile
            sys.path.insert(0, {os.path.dirname(__file__)!r})
            from test_precompile_kernel_store import _model, _inputs
            f = torch_precompile.load(open({code_file!r}).read(), open({cache_file!r}, "rb").read())
            print(float(f(_model(), *_inputs())))
            """
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertFalse(os.path.exists(marker), "load() ran a planted extension")
        self.assertAlmostEqual(float(result.stdout), float(_train_step(_model(), *_inputs())), places=5)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), blob)

    def test_same_size_garbage_is_repaired(self):
        path, blob = self.some_kernel()
        os.makedirs(self.store, mode=0o700)
        with open(path, "wb") as f:
            f.write(b"\x7fELF" + b"\0" * (len(blob) - 4))
        self.assert_store_holds_exactly_the_kernels(artifact_module._prime_kernels(self.kernels()))
        self.assert_loads_correctly()

    def test_symlink_is_replaced_not_followed(self):
        # Even a link to a file with the right bytes: its target is not ours.
        path, blob = self.some_kernel()
        os.makedirs(self.store, mode=0o700)
        target = os.path.join(self.tmp, "elsewhere.so")
        with open(target, "wb") as f:
            f.write(blob)
        os.symlink(target, path)
        self.assert_store_holds_exactly_the_kernels(artifact_module._prime_kernels(self.kernels()))
        with open(target, "rb") as f:
            self.assertEqual(f.read(), blob)

    def test_created_directories_are_private(self):
        artifact_module._prime_kernels(self.kernels())
        for directory in (self.root, self.store):
            self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700, directory)


class TestUntrustedStore(_StoreTestCase):
    def test_world_writable_store_not_used(self):
        os.makedirs(self.store)
        os.chmod(self.store, 0o777)
        self.assert_uses_fallback("writable by group or others")

    def test_group_writable_store_not_used(self):
        if not _is_root():
            self.skipTest("needs root to give a directory to another group")
        os.makedirs(self.store)
        os.chown(self.store, -1, NOBODY)
        os.chmod(self.store, 0o770)
        self.assert_uses_fallback("writable by group or others")

    def test_group_writable_directories_of_a_private_group_are_used(self):
        # umask 0002 with user private groups: Inductor's directories are 0775.
        gid = os.getegid()
        if not kernel_store._is_private_group(gid):
            self.skipTest("this user's group is not a user private group")
        os.makedirs(self.store)
        for directory in (self.root, self.store):
            os.chmod(directory, 0o775)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            files = artifact_module._prime_kernels(self.kernels())
        self.assert_store_holds_exactly_the_kernels(files)

    def test_store_that_is_a_symlink_not_used(self):
        os.makedirs(self.root)
        os.symlink(tempfile.mkdtemp(dir=self.tmp), self.store)
        self.assert_uses_fallback("is a symlink")

    def test_store_of_another_user_not_used(self):
        if not _is_root():
            self.skipTest("needs root to give a directory to another user")
        os.makedirs(self.store, mode=0o700)
        os.chown(self.store, NOBODY, NOBODY)
        self.assert_uses_fallback(f"owned by uid {NOBODY}")

    def test_store_inside_another_users_writable_directory_not_used(self):
        # The default root lives in the shared temp dir: another user who made
        # it first (0777, not sticky) could swap the store after verification.
        if not _is_root():
            self.skipTest("needs root to give a directory to another user")
        os.makedirs(self.store, mode=0o700)
        os.chown(self.root, NOBODY, NOBODY)
        os.chmod(self.root, 0o777)
        self.assert_uses_fallback(f"lies in {self.root}, owned by uid {NOBODY}")


    def test_store_reached_through_a_symlink_into_a_writable_directory_not_used(self):
        # The symlink is this user's, but its target sits in a directory anyone can
        # write (not sticky): another user could rename the target away and put theirs.
        shared = os.path.join(self.tmp, "shared")
        os.makedirs(os.path.join(shared, "cache"), mode=0o700)
        os.chmod(shared, 0o777)
        os.symlink(os.path.join(shared, "cache"), self.root)
        self.assert_uses_fallback(f"lies in {re.escape(shared)}, which group or others can write")

    def test_store_behind_another_users_symlink_not_used(self):
        # /tmp/torchinductor_<user> planted by another user as a symlink to a directory
        # of ours: the check passes through it, but its owner can re-point it at any time.
        if not _is_root():
            self.skipTest("needs root to give a symlink to another user")
        sticky = os.path.join(self.tmp, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        os.symlink(tempfile.mkdtemp(dir=self.tmp), os.path.join(sticky, "link"))
        os.lchown(os.path.join(sticky, "link"), NOBODY, NOBODY)
        self.root = os.path.join(sticky, "link")
        self.store = os.path.join(self.root, "precompile_kernels")
        with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": self.root}):
            self.assert_uses_fallback(f"lies in {re.escape(self.root)}, owned by uid {NOBODY}")

    def test_store_behind_own_symlink_is_used(self):
        os.symlink(tempfile.mkdtemp(dir=self.tmp), self.root)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            files = artifact_module._prime_kernels(self.kernels())
        self.assert_store_holds_exactly_the_kernels(files)


class TestFallbackDirectory(_StoreTestCase):
    """The private directory load uses where the store is not private: checked at every use."""

    def setUp(self):
        super().setUp()
        patcher = mock.patch.object(kernel_store, "_fallback", None)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.makedirs(self.store)
        os.chmod(self.store, 0o777)  # not private: every load uses the fallback

    def test_removed_directory_is_made_anew(self):
        first = kernel_store.fallback_directory()
        shutil.rmtree(first)  # a tmp cleaner
        self.assert_uses_fallback("writable by group or others")
        self.assertNotEqual(kernel_store.fallback_directory(), first)
        self.assertFalse(os.path.exists(first))

    def test_directory_made_again_by_someone_else_is_not_used(self):
        first = kernel_store.fallback_directory()
        shutil.rmtree(first)
        os.mkdir(first)
        os.chmod(first, 0o777)  # re-created, by another user where root can chown it
        if _is_root():
            os.chown(first, NOBODY, NOBODY)
        self.assert_uses_fallback("writable by group or others")
        self.assertNotEqual(kernel_store.fallback_directory(), first)
        self.assertEqual(os.listdir(first), [])

    def test_forked_child_leaves_the_parents_directory(self):
        # A child that exits normally runs the atexit handlers it inherited; the
        # directory is removed only when the process that made it exits.
        script = textwrap.dedent(
            """
            import os, sys
            import torch_precompile._precompile_kernel_store as kernel_store
            directory = kernel_store.fallback_directory()
            pid = os.fork()
            if pid == 0:
                child = kernel_store.fallback_directory()  # its own, removed at its exit
                print(child, flush=True)
                sys.exit(0)
            os.waitpid(pid, 0)
            print(directory, os.path.isdir(directory), kernel_store.fallback_directory() == directory)
            """
        )
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        child, parent = result.stdout.splitlines()
        directory, exists, reused = parent.split()
        self.assertEqual((exists, reused), ("True", "True"))
        self.assertNotEqual(child, directory)
        self.assertFalse(os.path.exists(child))
        self.assertFalse(os.path.exists(directory))  # removed when the parent exited

class TestStoreLocation(TestCase):
    def test_store_sits_in_inductors_cache_directory(self):
        # Mirrors Inductor's default cache_dir() (getpass.getuser() and tempfile.gettempdir(),
        # whose candidates are tried in its order) without importing or probing either.
        with tempfile.TemporaryDirectory() as tmp:
            read_only = os.path.join(tmp, "read-only")
            os.mkdir(read_only, 0o500)
            environments = (
                {},
                {"USER": "some/user:name"},
                {"LNAME": "other"},
                {"TMPDIR": tmp},
                {"TMPDIR": os.path.join(tmp, "missing"), "TMP": tmp},
                {"TEMP": read_only} if os.geteuid() != 0 else {"TEMP": tmp},  # root may write anywhere
            )
            for environment in environments:
                with self.subTest(environment=environment), mock.patch.dict(os.environ, environment):
                    self.assert_store_in_inductors_directory(environment)

    def assert_store_in_inductors_directory(self, environment):
        import getpass

        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        variables = ("LOGNAME", "USER", "LNAME", "USERNAME", "TMPDIR", "TEMP", "TMP", "TORCHINDUCTOR_CACHE_DIR")
        for variable in set(variables) - set(environment):
            os.environ.pop(variable, None)
        with mock.patch.object(tempfile, "tempdir", None):  # where gettempdir() caches its answer
            self.assertEqual(kernel_store._user_name(), getpass.getuser())
            self.assertEqual(
                kernel_store.kernel_directory(), os.path.join(default_cache_dir(), "precompile_kernels")
            )


class TestUnwritableStore(_StoreTestCase):
    def test_directory_in_the_way(self):
        path, _ = self.some_kernel()
        os.makedirs(os.path.join(path, "something"), mode=0o700)
        self.assert_uses_fallback("Is a directory|Directory not empty")

    def test_failed_write_removes_its_temp_file(self):
        real_replace = os.replace

        def replace(src, dst):
            if dst.startswith(self.store):
                raise OSError(28, "No space left on device")
            return real_replace(src, dst)

        with mock.patch.object(kernel_store.os, "replace", replace):
            self.assert_uses_fallback("No space left on device")

    @contextlib.contextmanager
    def tmpfs(self, options):
        if not _is_root() or shutil.which("mount") is None:
            self.skipTest("needs root and mount for a small tmpfs")
        os.makedirs(self.root)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", self.root], capture_output=True)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["umount", "-l", self.root], check=True)

    def test_full_file_system(self):
        with self.tmpfs("size=4k,mode=0700"):  # one page: smaller than any kernel
            self.assert_uses_fallback("No space left on device")
            self.assertEqual(os.listdir(self.store), [])

    def test_read_only_file_system(self):
        with self.tmpfs("size=1m,mode=0700,ro"):
            self.assert_uses_fallback("Read-only file system")

    def test_no_writable_location_is_a_precompile_error(self):
        with self.tmpfs("size=1m,mode=0700,ro"):
            with mock.patch.object(tempfile, "tempdir", self.root), mock.patch.object(kernel_store, "_fallback", None):
                with self.assertRaisesRegex(
                    PrecompileError,
                    f"neither to the kernel store \\({self.root}.*Read-only file system\\) "
                    f"nor to a private temporary directory \\({self.root}.*Read-only file system\\)",
                ):
                    precompile.load(self.code, self.cache)


class TestStaleTemporaries(_StoreTestCase):
    def test_temp_files_of_dead_or_old_loaders_are_removed(self):
        # A loader killed mid-write (kill -9) leaves its temp file behind.
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        os.makedirs(self.store, mode=0o700)
        names = {
            f"tmp-{dead.pid}-abcd1234.tmp": False,  # its writer is gone
            "tmpabcd_xyz.tmp": False,  # an old version's temp file, an hour old
            f"tmp-{os.getpid()}-efgh5678.tmp": True,  # a live writer (this process)
            "tmpijkl_mno.tmp": True,  # no pid, recent: maybe still being written
            "notes.txt": True,
        }
        for name in names:
            with open(os.path.join(self.store, name), "wb") as f:
                f.write(b"partial")
        os.utime(os.path.join(self.store, "tmpabcd_xyz.tmp"), (0, 0))
        artifact_module._prime_kernels(self.kernels())
        left = set(os.listdir(self.store))
        for name, kept in names.items():
            self.assertEqual(name in left, kept, name)


class TestCacheEnvelope(_StoreTestCase):
    def assert_ignored(self, cache, why):
        with self.assertWarnsRegex(UserWarning, f"ignoring the cache: {why}"):
            self.assert_loads_correctly(cache)

    def test_rotated_kernels_are_compiled_instead(self):
        envelope = _envelope(self.cache)
        kernels = envelope["artifact"]["kernels"]
        self.assertGreater(len(kernels), 1)
        keys = list(kernels)
        rotated = {key: kernels[keys[(i + 1) % len(keys)]] for i, key in enumerate(keys)}
        envelope["artifact"]["kernels"] = rotated
        envelope["payload_sha256"] = format_module._payload_hash(format_module._kernel_digests(rotated))
        forged = _save(envelope)
        with self.assertWarnsRegex(UserWarning, f"{len(keys)} of the cache's {len(keys)} kernels do not match"):
            self.assertEqual(self.kernels(forged), {})
        self.assert_loads_correctly(forged)

    def test_deflate_bomb_refused_before_inflating(self):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            with archive.open("archive/data.pkl", "w") as entry:
                chunk = b"\0" * (1 << 20)
                for _ in range(64):
                    entry.write(chunk)
        bomb = buffer.getvalue()
        self.assertLess(len(bomb), 1 << 20)
        with mock.patch.object(zipfile.ZipFile, "read", side_effect=AssertionError("an entry of the bomb was read")):
            with self.assertWarnsRegex(UserWarning, rf"declares {64 << 20} bytes in {len(bomb)} .*before inflating"):
                self.assertEqual(self.kernels(bomb), {})

    def test_other_envelope_versions_are_ignored(self):
        for version in (0, format_module.CACHE_VERSION + 1, "1"):
            with self.subTest(version=version):
                envelope = _envelope(self.cache)
                envelope["version"] = version
                low, high = format_module.MIN_CACHE_VERSION, format_module.CACHE_VERSION
                self.assert_ignored(_save(envelope), rf"cache has format version {version!r}, .*{low}\.\.{high}")

    def test_payload_hash_mismatch_is_ignored(self):
        envelope = _envelope(self.cache)
        envelope["payload_sha256"] = "0" * 64
        self.assert_ignored(_save(envelope), "cache is damaged: its payload does not match its recorded sha256")

    def test_foreign_code_or_backend_still_raises(self):
        envelope = _envelope(self.cache)
        for field, value, message in (
            ("code_hash", "0" * 64, "code_hash mismatch"),
            ("backend", "eager", "built for backend 'eager'"),
        ):
            with self.subTest(field=field):
                with self.assertRaisesRegex(PrecompileError, message):
                    precompile.load(self.code, _save({**envelope, field: value}))

    def test_code_without_kernel_hashes_compiles_its_kernels(self):
        # An artifact of an older version: its kernels cannot be bound to their keys.
        start = self.code.index("KERNEL_SHA256 = ")
        older = self.code[:start] + self.code[self.code.index("\n\n# ====", start) + 1 :]
        envelope = _envelope(self.cache)
        envelope["code_hash"] = format_module._text_hashes(older)[1]
        with self.assertWarnsRegex(UserWarning, "records no hashes of its compiled kernels"):
            f = precompile.load(older, _save(envelope))
        self.assertIsNotNone(f)


class TestDriver(TestCase):
    def test_kernel_that_fails_to_import_is_compiled(self):
        # Verified bytes that still do not import here (a missing shared library).
        from torch_precompile import _precompile_runtime as runtime

        with tempfile.NamedTemporaryFile(suffix=".so") as garbage:
            garbage.write(b"not a shared object")
            garbage.flush()
            loader = runtime.KernelLoader({runtime.kernel_key(["int"], "source"): garbage.name})
            compiled = mock.Mock(__self__=mock.Mock(__file__="compiled.so"))
            with mock.patch.object(runtime, "jit_compile_kernel", return_value=compiled):
                with self.assertWarnsRegex(UserWarning, r"a cached kernel failed to load \(ImportError"):
                    self.assertIs(loader.cpp_pybinding(["int"], "source"), compiled)


class TestPythonCodeHeader(TestCase):
    def assert_refused(self, code, message):
        with self.assertRaisesRegex(PrecompileError, message):
            format_module._read_convention(code)

    def test_deep_nesting_is_a_precompile_error(self):
        self.assert_refused("x = " + "-" * 200_000 + "1\n", r"nested too deeply to parse \(MemoryError\)")
        self.assert_refused("x = 1" + "+1" * 100_000 + "\n", r"nested too deeply to parse \(RecursionError\)")

    def test_null_byte_is_a_precompile_error(self):
        self.assert_refused("FORMAT_VERSION = 1\0\n", "not valid Python")

    def test_crlf_line_endings_and_a_byte_order_mark_are_named(self):
        # Each was reported as a header statement or invalid Python.
        code, cache = torch_precompile.precompile(lambda m, x: m(x), nn.Linear(2, 2), torch.randn(1, 2), backend="eager")
        fix = re.escape("or read the file with open(path, encoding='utf-8-sig') as torch_precompile.files.load does")
        for edited, message in (
            (code.replace("\n", "\r\n"), "python_code has CRLF line endings, which precompile never writes"),
            ("\ufeff" + code, r"python_code starts with a byte-order mark \(U\+FEFF\), which precompile never writes"),
        ):
            with self.subTest(message):
                self.assert_refused(edited, f"{message}.*{fix}")
                with self.assertRaisesRegex(PrecompileError, message):
                    torch_precompile.load(edited, cache)

    def test_non_int_format_version_is_malformed(self):
        code, _ = _artifact()
        for value in ("'1'", "True", "1.0", "None"):
            with self.subTest(value=value):
                edited = code.replace(
                    f"{{'format_version': {format_module.CONVENTION_VERSION},", f"{{'format_version': {value},", 1
                )
                self.assert_refused(edited, f"python_code has format version {re.escape(value)}, which is malformed")

    def test_malformed_kernel_hashes(self):
        code, _ = _artifact()
        for value in ("[]", "{'k': 'not a sha256'}", "{1: '" + "0" * 64 + "'}"):
            with self.subTest(value=value):
                start = code.index("KERNEL_SHA256 = ")
                edited = code[:start] + f"KERNEL_SHA256 = {value}\n" + code[code.index("\n\n# ====", start) + 1 :]
                with self.assertRaisesRegex(PrecompileError, "KERNEL_SHA256 is malformed"):
                    precompile.load(edited, b"")

    def test_malformed_bytecode_hash(self):
        code, _ = _artifact()
        start = code.index("BYTECODE_SHA256 = ")
        end = code.index("\n", start)
        for value in ("'not a sha256'", "1", "b'" + "0" * 64 + "'"):
            with self.subTest(value=value):
                edited = code[:start] + f"BYTECODE_SHA256 = {value}" + code[end:]
                with self.assertRaisesRegex(PrecompileError, "BYTECODE_SHA256 is malformed"):
                    precompile.load(edited, b"")


if __name__ == "__main__":
    run_tests()
