"""The kernel store: where ``load`` puts the cache's compiled kernels before it loads them
(Note [precompile programming model], invariant 6: kernels run only from verified files in a
private store).

A kernel is loaded (dlopen) from a file, so the file must hold exactly the bytes python_code
pinned when the library is opened.  The store is ``precompile_kernels`` under Inductor's cache
directory (``TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``), used only if no
other local user can change it or any directory or symlink on the way to it; otherwise a
private temporary directory of this process.  Either is checked again at every load.  Files
are named by their sha256, written atomically (readers never see half a file), and rewritten
where they do not hold exactly the expected bytes (missing, planted, damaged, a symlink).  Only the standard library: ``load`` imports this before torch's
compilers, and an artifact never does.
"""

import atexit
import contextlib
import functools
import os
import re
import shutil
import stat
import tempfile
import time


class StoreUnusable(Exception):
    """A kernel store directory cannot be used; the message names the path and cause."""


def kernel_directory() -> str:
    # Mirrors torch._inductor.runtime.cache_dir_utils.cache_dir() without importing Inductor.
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is None:
        root = os.path.join(_temp_directory(), "torchinductor_" + _user_name().translate(_PATH_UNSAFE))
    return os.path.abspath(os.path.join(root, "precompile_kernels"))


def _temp_directory() -> str:
    """``tempfile.gettempdir()`` without the probe of its first call, which writes
    and removes a file (~0.3 ms of a warm load): the first of its candidate
    directories (TMPDIR, TEMP, TMP, then the system's) that this process may write."""
    if tempfile.tempdir is None and os.name == "posix":
        candidates = [os.environ.get(name) for name in ("TMPDIR", "TEMP", "TMP")]
        for candidate in [*filter(None, candidates), "/tmp", "/var/tmp", "/usr/tmp"]:
            candidate = os.path.abspath(candidate)
            if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
                return candidate
    return tempfile.gettempdir()


_PATH_UNSAFE = str.maketrans(dict.fromkeys('\\/:*?"<>|', "_"))  # what Inductor replaces by "_"


def _user_name() -> str:
    """``getpass.getuser()``, as Inductor names its directory: importing getpass
    (and termios with it) would cost a warm load ~0.8 ms."""
    for variable in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(variable):
            return os.environ[variable]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ModuleNotFoundError):
        return f"uid_{os.getuid()}"


def private_directory(path: str) -> str:
    """``path`` as a directory no other user can change, created (0700) if missing."""
    try:
        _make_private_dirs(path)
        problem = _untrusted_reason(path)
    except OSError as error:
        raise StoreUnusable(f"{error.filename or path}: {error.strerror or error}") from None
    if problem is not None:
        raise StoreUnusable(f"{path} {problem}")
    return path


def _make_private_dirs(path: str) -> None:
    if os.path.lexists(path):
        return
    _make_private_dirs(os.path.dirname(path))
    with contextlib.suppress(FileExistsError):  # a concurrent loader made it
        os.mkdir(path, 0o700)


def _untrusted_reason(path: str) -> str | None:
    """Why another local user could change what ``path`` holds; None if nobody can.

    The store must be ours and writable only by us, and every directory and
    symlink that reaching it goes through ours or root's, each such directory,
    if others can write it, sticky (like /tmp): else someone could swap a
    verified file, or the whole store, before it loads.
    """
    uid = os.geteuid()
    problem = _resolution_reason(os.path.dirname(path), uid)
    if problem is not None:
        return problem
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != uid:
        return f"is owned by uid {info.st_uid}, not this user ({uid})"
    if _writable_by_others(info):
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


_MAX_SYMLINKS = 40  # Linux's limit on the symlinks one lookup follows (ELOOP)


def _resolution_reason(directory: str, uid: int) -> str | None:
    """Why another user could change the directory that ``directory`` (absolute) resolves to.

    Resolves it one component at a time as the kernel does, with lstat: a
    symlink counts by its own owner, who can re-point it at any time (os.stat
    would judge its target instead), and its target is then checked the same way.
    Where nothing on the way is another user's to change, what was checked stays
    what later opens and dlopens reach (only root and this user could change it).
    """
    current, pending, followed = os.sep, directory.split(os.sep), 0
    while True:
        info = os.lstat(current)
        if info.st_uid not in (uid, 0):
            return f"lies in {current}, owned by uid {info.st_uid}"
        if stat.S_ISLNK(info.st_mode):
            followed += 1
            if followed > _MAX_SYMLINKS:
                return f"lies in {current}, a symlink loop"
            target = os.readlink(current)
            pending[:0] = target.split(os.sep)
            current = os.sep if os.path.isabs(target) else os.path.dirname(current)
            continue
        if _writable_by_others(info) and not info.st_mode & stat.S_ISVTX:
            return f"lies in {current}, which group or others can write"
        while pending and pending[0] in ("", "."):
            pending.pop(0)
        if not pending:
            return None
        name = pending.pop(0)
        # current holds no symlink, so its lexical parent is its real one.
        current = os.path.dirname(current) if name == ".." else os.path.join(current, name)


def _writable_by_others(info: os.stat_result) -> bool:
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _is_private_group(info.st_gid)


@functools.lru_cache(maxsize=None)
def _is_private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's private group (named after the user, no other members).

    With user private groups (the Debian/Fedora default, umask 0002), the
    directories Inductor creates are group-writable by this user alone.
    """
    try:
        import grp
        import pwd

        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


_fallback: tuple[int, str] | None = None  # (pid of the process that made it, path)


def fallback_directory() -> str:
    """This process's private directory, removed at its exit.

    Checked at every use and made anew where it is gone or no longer private
    (a tmp cleaner removed it, then another user made that name) or belongs to
    the parent of a fork()ed child, which removes it at its own exit.
    """
    global _fallback
    if _fallback is not None and _fallback[0] == os.getpid() and _is_private(_fallback[1]):
        return _fallback[1]
    try:
        directory = tempfile.mkdtemp(prefix="torch_precompile_kernels_")
    except OSError as error:
        raise StoreUnusable(f"{error.filename or tempfile.gettempdir()}: {error.strerror or error}") from None
    atexit.register(_remove_own_directory, os.getpid(), directory)
    _fallback = (os.getpid(), directory)
    return directory


def _is_private(directory: str) -> bool:
    try:
        return _untrusted_reason(directory) is None
    except OSError:
        return False


def _remove_own_directory(creator: int, directory: str) -> None:
    # A fork()ed child inherits atexit handlers: only the creator removes the
    # directory, and only while it is still its own (not a stranger's re-creation).
    if os.getpid() == creator and _is_private(directory):
        shutil.rmtree(directory, ignore_errors=True)


def place_kernels(directory: str, kernels: dict) -> dict[str, str]:
    files, cleaned = {}, False
    for key, (digest, blob) in kernels.items():
        path = os.path.join(directory, digest + (os.path.splitext(key)[1] or ".so"))
        if not _holds(path, blob):  # missing, planted, damaged, a symlink: (re)write it
            try:
                if not cleaned:
                    _remove_stale_temporaries(directory)
                    cleaned = True
                write_atomically(directory, path, blob)
            except OSError as error:
                raise StoreUnusable(f"{path}: {error.strerror or error}") from None
        files[key] = path
    return files


def _holds(path: str, blob: bytes) -> bool:
    """Whether ``path`` is a regular file, not a symlink, holding exactly ``blob``."""
    try:
        # O_NONBLOCK: a FIFO planted at the path must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != len(blob):
            return False
        with open(fd, "rb", closefd=False) as f:
            return f.read(len(blob) + 1) == blob
    except OSError:
        return False
    finally:
        os.close(fd)


# mkstemp names, with the writer's pid (older versions wrote tmpXXXXXXXX.tmp without one).
_TEMPORARY = r"tmp(?:-(\d+)-)?\w+\.tmp"
_STALE_AFTER_S = 600


def write_atomically(directory: str, path: str, blob: bytes) -> None:
    # Atomic: concurrent loaders never see a half-written file; the pid in the
    # temp name lets a later loader remove it if this process dies mid-write.
    fd, temporary = tempfile.mkstemp(prefix=f"tmp-{os.getpid()}-", suffix=".tmp", dir=directory)
    try:
        with open(fd, "wb") as f:
            f.write(blob)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _remove_stale_temporaries(directory: str) -> None:
    """Remove temp files of loaders that died mid-write: their pid is gone, or they are old."""
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            match = re.fullmatch(_TEMPORARY, entry.name)
            if match is None:
                continue
            try:
                dead = match.group(1) is not None and not _pid_alive(int(match.group(1)))
                if dead or now - entry.stat(follow_symlinks=False).st_mtime > _STALE_AFTER_S:
                    os.unlink(entry.path)
            except OSError:
                pass  # its writer finished it, or another loader removed it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
