"""Files on disk: opening a checkpoint to read, replacing one atomically, byte counters."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class IOCounters:
    """What this process's checkpoint files moved since `reset`: bytes read, reads, written."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.read_bytes = self.reads = self.written_bytes = 0

    def read(self, count: int) -> None:
        self.read_bytes += count
        self.reads += 1


IO = IOCounters()


_NOT_A_FILE = (
    "tc.load reads only regular files (or links to them), and {path} is {what}. Give the "
    "path of a checkpoint file."
)


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _check_regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        what = next((what for test, what in _KINDS if test(mode)), "not a regular file")
        raise ValueError(_NOT_A_FILE.format(path=path, what=what))


class SizedFile:
    """A file whose reads never ask for more than it holds, whatever a header claims."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.size = os.fstat(file.fileno()).st_size

    def _left(self) -> int:
        return max(self.size - self._file.tell(), 0)

    def read(self, count: int | None = -1) -> bytes:
        left = self._left()
        return self._file.read(left if count is None or count < 0 else min(count, left))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        return self._file.readinto(view[: self._left()])  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:  # seek, tell, fileno, close, ...
        return getattr(self._file, name)

    def __enter__(self) -> SizedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_into(file: BinaryIO, view: memoryview, offset: int | None = None) -> int:
    """Fill `view` from `file` at `offset` (by positioned reads where the OS has them: a small
    slice costs its size), else from its position; the bytes read (fewer: the file ended)."""
    at = offset if hasattr(os, "preadv") else None
    if offset is not None and at is None:
        file.seek(offset)
    done = 0
    while done < len(view):
        if at is not None:
            count = os.preadv(file.fileno(), [view[done:]], at + done)
        else:
            count = file.readinto(view[done:])  # type: ignore[attr-defined]
        if not count:
            break
        done += count
    return done


def open_for_reading(path: str) -> BinaryIO:
    """`path` opened for reading (a `SizedFile`); `ValueError` unless it is a regular file."""
    try:
        mode = os.stat(path).st_mode  # follows links; FileNotFoundError names the path
    except ValueError as error:  # a NUL byte in the name
        raise ValueError(f"{path!r} cannot name a file: {error}") from None
    _check_regular(mode, path)
    # non-blocking, so that a file swapped for a pipe after the check cannot hang the open
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | _NONBLOCK)
    try:
        _check_regular(os.fstat(descriptor).st_mode, path)
        if _NONBLOCK:
            os.set_blocking(descriptor, True)
        file = open(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
    try:
        return SizedFile(file)  # type: ignore[return-value]
    except BaseException:
        file.close()
        raise


def _create_temp(folder: str, base: str, path: str) -> tuple[int, str]:
    """A new, empty file in `folder`: `(descriptor, path)`, named after the target if it fits."""
    token = secrets.token_hex(6)
    names = [f".{base}.{token}.tmp", f".tc-{token}.tmp"]
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no answer
        limit = 255
    if len(os.fsencode(names[0])) > limit:
        names.pop(0)
    # O_EXCL: never write into a file someone else made; mode 0o666 minus the umask, as
    # for any new file (mkstemp would make it 0o600)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for name in names:
        temp = os.path.join(folder, name)
        try:
            return os.open(temp, flags, 0o666), temp
        except OSError as error:
            if error.errno == errno.ENAMETOOLONG and name is not names[-1]:
                continue  # the filesystem's limit is lower than it said
            text = f"cannot write {path}: creating a temporary file in {folder} failed"
            raise reworded(error, f"{text} ({error.strerror})", path) from error
    raise AssertionError("unreachable: the last name raises")


def _temp_beside(path: str) -> tuple[str, int, str]:
    """`(path, descriptor, temp)`: a temporary file beside `path` with its permission bits."""
    if os.path.islink(path):
        path = os.path.realpath(path)
    folder, base = os.path.split(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            errno.ENOENT,
            f"cannot write {path}: its folder {folder} does not exist (create it first)",
            path,
        )
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # no file there yet (or none we may look at): a new file's mode
        mode = None
    descriptor, temp = _create_temp(folder, base, path)
    if mode is not None:
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(descriptor, mode)
            else:  # Windows
                os.chmod(temp, mode)
        except BaseException:
            os.close(descriptor)
            discard(temp)
            raise
    return path, descriptor, temp


def write_atomically(path: str, write: Callable[[Callable[[Any], object]], object]) -> None:
    """Call `write(put)`, `put` writing bytes (counted) to a new temporary file beside `path`,
    then rename that file over `path`."""
    path, descriptor, temp = _temp_beside(path)
    try:
        with open(descriptor, "wb") as file:

            def put(data: Any) -> None:
                file.write(data)
                IO.written_bytes += memoryview(data).nbytes

            try:
                write(put)
            except OSError as error:
                raise reworded(error, f"cannot write {path} ({error.strerror})", path) from error
        os.replace(temp, path)
    except BaseException:
        discard(temp)
        raise


def create_sized(path: str, size: int, head: bytes) -> str:
    """The name of a new temporary file beside `path`, `size` bytes long, starting `head`."""
    _, descriptor, temp = _temp_beside(path)
    try:
        os.ftruncate(descriptor, size)
        write_at(descriptor, head, 0)
    except BaseException:
        os.close(descriptor)
        discard(temp)
        raise
    os.close(descriptor)
    return temp


def write_at(descriptor: int, data: Any, offset: int) -> None:
    """Write all of `data` (a bytes-like object) at `offset` of an open file, counted."""
    data = memoryview(data).cast("B")
    done = 0
    while done < len(data):
        if hasattr(os, "pwrite"):
            done += os.pwrite(descriptor, data[done:], offset + done)
        else:  # Windows: one writer per descriptor, so seeking first is safe
            os.lseek(descriptor, offset + done, os.SEEK_SET)
            done += os.write(descriptor, data[done:])
    IO.written_bytes += len(data)


def reworded(error: OSError, text: str, filename: object) -> OSError:
    """`error` of a failed system call as its own type saying `text` (else re-raised)."""
    if error.errno is None:
        raise error
    return type(error)(error.errno, text, filename)


def discard(temp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(temp)


def file_reader(make: Callable[[BinaryIO, str], Any]) -> Callable[[str, object], Any]:
    """A format's reader of one file: `make(file, path)`, the file closed if it fails."""

    def read(path: str, like: object) -> Any:
        file = open_for_reading(path)
        try:
            return make(file, path)
        except BaseException:
            file.close()
            raise

    return read
