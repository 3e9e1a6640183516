"""Files on disk: opening a checkpoint to read, and replacing one atomically."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["open_for_reading", "write_atomically"]


def open_for_reading(path: str) -> BinaryIO:
    """`path` opened for reading in binary mode."""
    return open(path, "rb")


def write_atomically(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Call `write` on a new temporary file next to `path`, then rename it over `path`.

    If `write` fails or the process dies, `path` still holds what it held before and the
    temporary file is removed (on failure).
    """
    folder, base = os.path.split(os.path.abspath(path))
    temp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
    # O_EXCL: never write into a file someone else made; mode 0o666 minus the umask, as
    # for any new file (mkstemp would make it 0o600)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    descriptor = os.open(temp, flags, 0o666)
    try:
        with open(descriptor, "wb") as file:
            write(file)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
