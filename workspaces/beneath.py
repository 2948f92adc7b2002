"""Opening paths below a directory descriptor without following any link.

Every function here takes a descriptor of a directory (a workspace root, or a
directory below it opened by this module) and a path as a tuple of names
(see :func:`split_path`). Nothing is ever opened by an absolute path and no
symbolic link or magic link (``/proc/self/fd/N``, ``/proc/self/root``...) is
followed at any component: a link met on the way fails with ``ELOOP``. Linux's
``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS`` does the walk where the kernel has it; elsewhere each
component is opened with ``O_NOFOLLOW`` relative to the one before.

A link the user made that points inside the root is followed only through
:func:`resolve_links`, which reads each link on the way and re-walks its target
lexically, at most :data:`MAX_LINK_HOPS` times; the open that follows is again
link-free, so a link swapped in meanwhile makes it fail rather than escape.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import uuid
from collections.abc import Sequence
from pathlib import PureWindowsPath
from typing import Any

MAX_LINK_HOPS = 8
"""Links :func:`resolve_links` follows for one path before giving up (``ELOOP``)."""

Parts = tuple[str, ...]
"""A path below a root as its names: no ``""``, ``.`` or ``..``; ``()`` is the root itself."""

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}.get(platform.machine())
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class PathRefused(ValueError):
    """A path that is not a plain relative path below the root: absolute, ``~``,
    a null byte, or ``..`` climbing above it. ``escape`` tells the last case apart."""

    def __init__(self, message: str, *, escape: bool = False) -> None:
        super().__init__(message)
        self.escape = escape


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64))


def _load_openat2() -> Any:
    if _SYS_OPENAT2 is None or not hasattr(os, "O_PATH"):
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p,
                        ctypes.POINTER(_OpenHow), ctypes.c_size_t)
    how = _OpenHow(_DIR_FLAGS, 0, _RESOLVE)
    fd = syscall(_SYS_OPENAT2, -100, b".", ctypes.byref(how), ctypes.sizeof(how))  # AT_FDCWD
    if fd < 0:
        # ENOSYS: an older kernel; EPERM: a seccomp filter that does not know it.
        return None
    os.close(fd)
    return syscall


_openat2 = _load_openat2()
_HOW_SIZE = ctypes.sizeof(_OpenHow)
_EAGAIN_TRIES = 8
_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_hows: dict[tuple[int, int], Any] = {}
"""The ``open_how`` of each (flags, mode) pair seen, built once (a few are ever used)."""


def has_openat2() -> bool:
    """Whether opens go through ``openat2(2)`` (else the per-component walk)."""
    return _openat2 is not None


def use_openat2(enabled: bool) -> None:
    """Switch ``openat2(2)`` off (``False``) or back on where the kernel has it; for tests
    and benchmarks of the per-component walk."""
    global _openat2
    _openat2 = _load_openat2() if enabled else None


def split_path(user_path: str) -> Parts:
    """``user_path`` (relative to a root) as names, ``..`` applied lexically.

    ``""`` and ``"."`` are the root itself. Raises :class:`PathRefused` for a
    null byte, a leading ``~``, an absolute path (POSIX or Windows style) or a
    ``..`` that climbs above the root.
    """
    if "\x00" in user_path:
        raise PathRefused(f"path {user_path!r} contains a null byte")
    if user_path.startswith("~"):
        raise PathRefused(f"path {user_path!r}: '~' is not expanded; use a path relative "
                          "to your workspace")
    # Both flavours, so "C:\\x" is refused on a POSIX host too (the Windows parse only
    # when it can matter: it is the costly part of a call).
    if user_path.startswith("/") or (("\\" in user_path or ":" in user_path)
                                     and PureWindowsPath(user_path).is_absolute()):
        raise PathRefused(f"path {user_path!r} is absolute; use a path relative to your "
                          "workspace")
    return split_path_under((), user_path, user_path)


def open_root(path: str | os.PathLike[str]) -> int:
    """A descriptor of the directory ``path`` (the operator's path: links in it are
    followed). The caller closes it."""
    return os.open(path, _DIR_FLAGS)


def open_beneath(dir_fd: int, parts: Parts, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Open ``parts`` below ``dir_fd`` once, following no link anywhere; the caller closes it.

    ``flags`` as for :func:`os.open` (``O_CLOEXEC`` and, on the last name,
    ``O_NOFOLLOW`` are added; ``O_CREAT`` creates the last name only). A link at
    any component raises :class:`OSError` ``ELOOP`` (with ``O_DIRECTORY`` too);
    ``()`` opens ``dir_fd``'s directory again.
    """
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    if not parts:
        return os.open(".", flags & ~os.O_NOFOLLOW, dir_fd=dir_fd)
    if _openat2 is not None:
        how = _hows.get((flags, mode))
        if how is None:
            # openat2 refuses a mode without O_CREAT or O_TMPFILE (which has O_DIRECTORY).
            creates = flags & os.O_CREAT or (_O_TMPFILE and flags & _O_TMPFILE == _O_TMPFILE)
            how = _hows[(flags, mode)] = ctypes.byref(
                _OpenHow(flags, mode if creates else 0, _RESOLVE))
        name = "/".join(parts).encode("utf-8", "surrogateescape")
        for _ in range(_EAGAIN_TRIES):
            fd = _openat2(_SYS_OPENAT2, dir_fd, name, how, _HOW_SIZE)
            # EAGAIN: the kernel could not rule out a race on the way; it asks for a retry.
            if fd >= 0 or ctypes.get_errno() != errno.EAGAIN:
                break
        if fd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOTDIR and flags & os.O_DIRECTORY and _leaf_is_link(dir_fd, parts):
                code = errno.ELOOP  # as the walk says, and as any other link says
            raise OSError(code, os.strerror(code), "/".join(parts))
        return int(fd)
    return _walk(dir_fd, parts, flags, mode)


def _walk(dir_fd: int, parts: Parts, flags: int, mode: int) -> int:
    """The fallback of :func:`open_beneath`: one ``O_NOFOLLOW`` open per component."""
    current = dir_fd
    try:
        for name in parts[:-1]:
            try:
                following = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=current)
            except NotADirectoryError:
                # O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a link; openat2 says ELOOP.
                if _is_link(current, name):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
                raise
            if current != dir_fd:
                os.close(current)
            current = following
        try:
            return os.open(parts[-1], flags, mode, dir_fd=current)
        except NotADirectoryError:
            if flags & os.O_DIRECTORY and _is_link(current, parts[-1]):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), parts[-1]) from None
            raise
    finally:
        if current != dir_fd:
            os.close(current)


def _leaf_is_link(dir_fd: int, parts: Parts) -> bool:
    try:
        parent = open_beneath(dir_fd, parts[:-1], os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        return _is_link(parent, parts[-1])
    finally:
        os.close(parent)


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_dir(dir_fd: int, parts: Parts) -> int:
    """A descriptor of the directory ``parts`` below ``dir_fd`` (no link followed)."""
    return open_beneath(dir_fd, parts, os.O_RDONLY | os.O_DIRECTORY)


def make_dirs(dir_fd: int, parts: Parts, mode: int = 0o755) -> int:
    """Create the directories ``parts`` below ``dir_fd`` as needed; a descriptor of the last.

    Each is created and then opened relative to the one before, never through a
    link: a link (or a file) in the way raises :class:`OSError`.
    """
    current = os.open(".", _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for name in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=current)
            following = open_dir(current, (name,))
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


def resolve_links(dir_fd: int, parts: Parts, *, root_paths: Sequence[str] = (),
                  hops: int = MAX_LINK_HOPS) -> Parts:
    """``parts`` with every link on the way replaced by its target, checked to stay below.

    A relative target is applied lexically where the link is; an absolute one is
    taken only when it names a path inside one of ``root_paths`` (how the root is
    known on this host). A target that climbs out, any other absolute target, or
    more than ``hops`` links raise :class:`PathRefused` (``escape``) or
    :class:`OSError` ``ELOOP``. Names that do not exist yet are kept as they are.
    The result names no link at the moment it was read; open it with
    :func:`open_beneath`, which refuses one swapped in since.
    """
    todo = list(parts)
    done: list[str] = []
    current = os.open(".", _DIR_FLAGS, dir_fd=dir_fd)
    try:
        while todo:
            name = todo.pop(0)
            try:
                target = os.readlink(name, dir_fd=current)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                    raise
                done.append(name)
                if todo and exc.errno == errno.EINVAL:  # not a link: go down
                    try:
                        following = open_dir(current, (name,))
                    except (NotADirectoryError, FileNotFoundError):
                        done.extend(todo)  # the open after says what is wrong
                        break
                    os.close(current)
                    current = following
                elif todo:
                    done.extend(todo)  # absent: nothing below it can be a link
                    break
                continue
            hops -= 1
            if hops < 0:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), "/".join(parts))
            base = done
            if target.startswith("/"):
                base = []
                target = _inside(target, root_paths, "/".join(parts))
            rebuilt = split_path_under(base, target, "/".join(parts))
            todo = [*rebuilt, *todo]
            done = []
            os.close(current)
            current = os.open(".", _DIR_FLAGS, dir_fd=dir_fd)
    finally:
        os.close(current)
    return tuple(done)


def _inside(target: str, root_paths: Sequence[str], shown: str) -> str:
    """An absolute link target as a path relative to the root, if it lies inside it."""
    for root in root_paths:
        base = root.rstrip("/") + "/"
        if target == root.rstrip("/") or target.startswith(base):
            return target[len(base):]
    raise PathRefused(f"path {shown!r} is outside your workspace", escape=True)


def split_path_under(base: Sequence[str], target: str, shown: str) -> Parts:
    """``target`` (relative) applied to the directory ``base``, lexically; refuses climbing out."""
    parts = list(base)
    for name in target.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise PathRefused(f"path {shown!r} is outside your workspace", escape=True)
            parts.pop()
        else:
            parts.append(name)
    return tuple(parts)


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of ``fd`` from offset 0 (``pread``: its position is untouched)."""
    chunks: list[bytes] = []
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(limit - offset, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def write_atomic(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Put ``data`` in place as ``name`` in ``dir_fd``'s directory, whole or not at all.

    Written to a new file created exclusively beside it, synced, then renamed
    over ``name`` (a link there is replaced, never written through).
    """
    temp = f".{name[:100]}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def lstat_at(dir_fd: int, name: str) -> os.stat_result:
    """The status of ``name`` in ``dir_fd``'s directory, a link not followed."""
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def unlink_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` (a file or link, never what a link points to) from ``dir_fd``'s directory."""
    os.unlink(name, dir_fd=dir_fd)
