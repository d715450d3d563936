"""Files in directories somebody else wrote: every read and write dpledger makes in a run goes through here.

An audit's input is a run directory that may have been crafted against whoever audits it: a file
replaced by a FIFO or a device would block a read forever, a huge file would exhaust memory, and
a symbolic link would make a write land anywhere the auditor can write. So:

* Below a directory the caller trusts (`root`: the run directory named on the command line, or
  one dpledger created), every path component is opened with O_NOFOLLOW relative to its parent's
  descriptor: a symbolic link anywhere below the root is refused, never followed, whether it points
  inside or outside (dpledger never writes a link, and checking where a link points would race with
  whoever changes it). The root itself may be a link: the user named it.
* A file is opened with O_NONBLOCK and checked on the opened descriptor (fstat; the lstat before the
  open only spares opening a device at all, it is not the check): it must be a regular file within
  a stated size bound. FIFOs, devices, sockets and directories are refused in one line, never read.
* A write goes to a new temporary file in the same directory (O_CREAT | O_EXCL | O_NOFOLLOW, a name
  nobody can predict), is fsynced, then renamed over the target: rename replaces a link at the
  target instead of writing through it. The lock file, the one file written in place, must be a
  regular file with a single link.

Files the user names directly (`follow=True`: a claim, an event file, a data file) follow links,
as the user chose them, but get the same checks on the opened file.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Iterator

TEMPORARY_NAME = re.compile(r"\..+\.tmp-\d+(?:-[0-9a-f]{8})?")
"""Names of the temporary files of writes that did not finish (older dpledgers wrote no random part)."""
LINK_RULE = "dpledger never follows a link inside a run directory"

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory", stat.S_IFLNK: "a symbolic link"}


class UnsafeFileError(ValueError):
    """A path dpledger will not use: a link below the root, not a regular file, or over its size
    bound; the message names the path and the reason in one line."""


def kind_of(mode: int) -> str:
    """"a regular file", "a FIFO", "a symbolic link", ... for an st_mode.

    Args:
        mode: an st_mode from stat/lstat/fstat.

    Returns:
        A short English phrase naming the kind of file, "a special file" for a kind without a name here.
    """
    return "a regular file" if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "a special file")


def _refusal(path: Path, mode: int, expected: str = "a regular file") -> UnsafeFileError:
    return UnsafeFileError(f"{path}: {kind_of(mode)}, not {expected}" + (f" ({LINK_RULE})" if stat.S_ISLNK(mode)
                                                                        else ""))


def _split(path: str | Path, root: str | Path | None) -> tuple[Path, list[str]]:
    """(the root, the components of `path` below it); without a root, the path's own directory."""
    path = Path(os.path.abspath(path))
    root = path.parent if root is None else Path(os.path.abspath(root))
    components = list(path.relative_to(root).parts)  # ValueError: a caller's bug, never the input's
    if not components or ".." in components:
        raise ValueError(f"{path} is not below {root}")
    return root, components


def _open_directory(root: Path, components: list[str]) -> int:
    """A descriptor of root/components..., each component opened without following a link."""
    fd = os.open(root, _DIRECTORY)
    where = root
    try:
        for name in components:
            where = where / name
            try:
                child = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise _refusal(where, os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode, "a directory") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _checked(fd: int, path: Path, limit: int | None, what: str) -> int:
    """`fd` once fstat says it is a regular file of at most `limit` bytes; closed and refused otherwise."""
    status = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(status.st_mode):
        problem = _refusal(path, status.st_mode)
    elif limit is not None and status.st_size > limit:
        problem = UnsafeFileError(f"{path}: {status.st_size} bytes, more than the {limit} bytes {what} can hold")
    if problem is not None:
        os.close(fd)
        raise problem
    return fd


def open_regular(path: str | Path, limit: int | None, *, root: str | Path | None = None, follow: bool = False,
                 what: str = "this file") -> int:
    """A read-only descriptor of a regular file of at most `limit` bytes (None: unbounded), opened
    without blocking; the caller closes it. `follow`: a path the user named (links followed);
    otherwise no component below `root` (default: the file's directory) may be a link.
    FileNotFoundError when nothing is there; UnsafeFileError for anything but such a file.

    Args:
        path: the file.
        limit: the largest size accepted, in bytes; None for no bound.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        follow: True for a path the user named (links followed, the opened file still checked).
        what: what the file is, for the size error's message.

    Returns:
        An open read-only, non-blocking file descriptor (an int) of the checked file.

    Raises:
        FileNotFoundError: nothing at path (or a missing directory on the way).
        UnsafeFileError: a link below root, something other than a regular file, or a file over limit.
        ValueError: path is not below root.
        OSError: any other failure of the open.
    """
    path = Path(path)
    if follow:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _refusal(path, mode)
        return _checked(os.open(path, _READ), path, limit, what)
    base, components = _split(path, root)
    directory = _open_directory(base, components[:-1])
    try:
        mode = os.stat(components[-1], dir_fd=directory, follow_symlinks=False).st_mode
        if not stat.S_ISREG(mode):
            raise _refusal(path, mode)
        try:
            fd = os.open(components[-1], _READ | os.O_NOFOLLOW, dir_fd=directory)
        except OSError as error:
            if error.errno == errno.ELOOP:  # replaced by a link since the lstat
                raise _refusal(path, stat.S_IFLNK) from None
            raise
        return _checked(fd, path, limit, what)
    finally:
        os.close(directory)


def _chunks(fd: int, limit: int | None, path: Path, what: str) -> Iterator[bytes]:
    """The file's bytes in pieces; UnsafeFileError if it grows past `limit` while being read."""
    total = 0
    while piece := os.read(fd, 1 << 22):
        total += len(piece)
        if limit is not None and total > limit:
            raise UnsafeFileError(f"{path}: more than the {limit} bytes {what} can hold (it grew while read)")
        yield piece


def read_bytes(path: str | Path, limit: int, *, root: str | Path | None = None, follow: bool = False,
               what: str = "this file") -> bytes:
    """The whole content of a regular file of at most `limit` bytes (open_regular's checks).

    Args:
        path: the file.
        limit: the largest size accepted, in bytes.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        follow: True for a path the user named (links followed).
        what: what the file is, for the size error's message.

    Returns:
        The file's bytes.

    Raises:
        FileNotFoundError: nothing at path.
        UnsafeFileError: open_regular refuses the file, or it grew past limit while read.
    """
    fd = open_regular(path, limit, root=root, follow=follow, what=what)
    try:
        return b"".join(_chunks(fd, limit, Path(path), what))
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int, *, root: str | Path | None = None, follow: bool = False,
              what: str = "this file") -> str:
    """read_bytes decoded as UTF-8; ValueError naming the file and the byte for other bytes.

    Args:
        path: the file.
        limit: the largest size accepted, in bytes.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        follow: True for a path the user named (links followed).
        what: what the file is, for the size error's message.

    Returns:
        The file's text.

    Raises:
        ValueError: the content is not UTF-8.
        FileNotFoundError: nothing at path.
        UnsafeFileError: open_regular refuses the file, or it grew past limit while read.
    """
    data = read_bytes(path, limit, root=root, follow=follow, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def file_sha256(path: str | Path, limit: int | None = None, *, root: str | Path | None = None,
                what: str = "this file") -> str:
    """sha256 of a regular file of at most `limit` bytes (open_regular's checks), read in pieces.

    Args:
        path: the file.
        limit: the largest size accepted, in bytes; None for no bound.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        what: what the file is, for the size error's message.

    Returns:
        The SHA-256 digest of the content as 64 lowercase hex digits.

    Raises:
        FileNotFoundError: nothing at path.
        UnsafeFileError: open_regular refuses the file, or it grew past limit while read.
    """
    digest = hashlib.sha256()
    fd = open_regular(path, limit, root=root, what=what)
    try:
        for piece in _chunks(fd, limit, Path(path), what):
            digest.update(piece)
    finally:
        os.close(fd)
    return digest.hexdigest()


def regular_size(path: str | Path, limit: int | None, *, root: str | Path | None = None,
                 what: str = "this file") -> int:
    """The size of a regular file of at most `limit` bytes (open_regular's checks, nothing read).

    Args:
        path: the file.
        limit: the largest size accepted, in bytes; None for no bound.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        what: what the file is, for the size error's message.

    Returns:
        The size in bytes.

    Raises:
        FileNotFoundError: nothing at path.
        UnsafeFileError: open_regular refuses the file.
    """
    fd = open_regular(path, limit, root=root, what=what)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def entries(directory: str | Path, *, root: str | Path | None = None) -> list[tuple[str, int]]:
    """(name, st_mode of the entry itself, links not followed) of a directory's entries, sorted;
    the directory and every component below `root` must not be links. FileNotFoundError when
    the directory is not there.

    Args:
        directory: the directory to list.
        root: the directory the caller trusts (default: directory's parent); directory itself may be
            root.

    Returns:
        (name, st_mode) pairs of the entries, sorted by name.

    Raises:
        FileNotFoundError: the directory is not there.
        UnsafeFileError: the directory or a component below root is a link or not a directory.
    """
    directory = Path(directory)
    if root is not None and Path(os.path.abspath(directory)) == Path(os.path.abspath(root)):
        fd = os.open(directory, _DIRECTORY)
    else:
        base, components = _split(directory, root)
        fd = _open_directory(base, components)
    try:
        with os.scandir(fd) as listing:
            return sorted((entry.name, entry.stat(follow_symlinks=False).st_mode) for entry in listing)
    finally:
        os.close(fd)


def special_entries(root: str | Path) -> list[tuple[str, str]]:
    """(path relative to root, what it is) of every entry below `root` that is neither a regular
    file nor a directory (links, FIFOs, devices, sockets); links are listed, never followed.

    Args:
        root: the directory to walk.

    Returns:
        (relative path, kind_of phrase) pairs, in walk order (names sorted within each directory).
    """
    found = []
    root = Path(root)
    for directory, subdirectories, files in os.walk(root):  # os.walk does not descend into links
        for name in sorted(subdirectories + files):
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append((str(Path(directory, name).relative_to(root)), kind_of(mode)))
    return found


def temporary_name(name: str) -> str:
    """A new temporary file's name beside `name` (TEMPORARY_NAME): the pid and 32 random bits.

    Args:
        name: the target file's name (no directory).

    Returns:
        ".<name>.tmp-<pid>-<8 hex digits>".
    """
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def write_atomic(path: str | Path, data: bytes, *, root: str | Path | None = None) -> None:
    """Write `data` to `path` atomically: a new temporary file beside it (exclusive creation, no
    link followed), fsynced, then renamed over `path` (replacing a link there, never writing through
    it). No component below `root` (default: the file's directory) may be a link. A failed write
    leaves `path` as it was and no temporary file behind.

    Args:
        path: the file to write.
        data: its new content.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.

    Raises:
        UnsafeFileError: a component below root is a link or not a directory.
        ValueError: path is not below root.
        OSError: the write, fsync or rename failed (path is left as it was).
    """
    base, components = _split(path, root)
    directory = _open_directory(base, components[:-1])
    temporary = temporary_name(components[-1])
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                     dir_fd=directory)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, components[-1], src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=directory)
        except OSError:
            pass  # never created, or already renamed
        raise
    finally:
        os.close(directory)


def open_lock(path: str | Path, *, root: str | Path | None = None, create: bool = True) -> int:
    """A read-write descriptor of a lock file (created if absent and `create`), opened without
    blocking or following a link: it must be a regular file with one link (writing the holder's
    pid into a hard link would change another file). The caller closes it.

    Args:
        path: the lock file.
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.
        create: create the file when it is absent.

    Returns:
        An open read-write file descriptor (an int) of the lock file.

    Raises:
        FileNotFoundError: the file is absent and create is False.
        UnsafeFileError: a link, something other than a regular file, or a file with several hard links.
        OSError: any other failure of the open.
    """
    base, components = _split(path, root)
    directory = _open_directory(base, components[:-1])
    flags = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        mode: int | None
        try:
            mode = os.stat(components[-1], dir_fd=directory, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = stat.S_IFREG if create else None
        if mode is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        if not stat.S_ISREG(mode):  # never open a device or a FIFO at all
            raise _refusal(Path(path), mode)
        try:
            fd = os.open(components[-1], flags, 0o666, dir_fd=directory)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # swapped in since the lstat
                raise _refusal(Path(path), os.stat(components[-1], dir_fd=directory,
                                                   follow_symlinks=False).st_mode) from None
            raise
    finally:
        os.close(directory)
    _checked(fd, Path(path), None, "a lock")
    links = os.fstat(fd).st_nlink
    if links != 1:
        os.close(fd)
        raise UnsafeFileError(f"{path}: a regular file with {links} hard links; the lock dpledger writes has one")
    return fd


def unlink(path: str | Path, *, root: str | Path | None = None) -> None:
    """Remove the entry at `path` (a link itself, never its target); no component below `root` may be a link.

    Args:
        path: the entry to remove (not a directory).
        root: the directory the caller trusts (default: the file's own directory); no component
            of the path below it may be a link.

    Raises:
        FileNotFoundError: nothing at path.
        UnsafeFileError: a component below root is a link or not a directory.
    """
    base, components = _split(path, root)
    directory = _open_directory(base, components[:-1])
    try:
        os.unlink(components[-1], dir_fd=directory)
    finally:
        os.close(directory)


def remove_entry(path: str | Path) -> None:
    """Remove whatever is at `path`: a directory with its content (links inside removed, not
    followed), anything else (a link included) by unlinking it; nothing there is fine.

    Args:
        path: the entry to remove.

    Raises:
        OSError: the removal failed (permissions, a busy entry).
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)  # fd-based: refuses to follow a link swapped in meanwhile
    else:
        os.unlink(path)


def fresh_directory(path: str | Path) -> None:
    """An empty directory at `path` that this process created (whatever was there removed first).

    Args:
        path: where the directory goes.

    Raises:
        FileExistsError: something was created at path between the removal and the mkdir.
        OSError: the removal or the mkdir failed otherwise.
    """
    remove_entry(path)
    os.mkdir(path)  # fails on anything created meanwhile (a link included) instead of following it
