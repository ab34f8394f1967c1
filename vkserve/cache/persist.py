"""Reading, atomically replacing and single-writer locking of pipeline cache files.

Crash safety rests on three rules (DESIGN §5):

* a reader only ever opens the target path, and the target only ever changes by
  `os.replace` of a complete, fsynced temp file, so it is the old file or the new
  one, never a torn one; the directory is fsynced after the rename so the new
  name survives a power cut too;
* temp files are named `.<target name>.<random>.tmp` in the target's directory
  (same filesystem, so the rename is atomic); a writer killed mid-save leaves
  one behind, which no reader ever opens and the next lock holder deletes;
* only the process holding an exclusive `flock` on `<file>.lock` writes. The
  kernel drops the lock when the holder dies, so there is no stale-lock cleanup.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from vkserve.cache.cache_file import (
    MAX_FILE_BYTES,
    CacheContents,
    CacheFileRejected,
    DeviceIdentity,
    decode_cache_file,
)

log = logging.getLogger(__name__)

_TEMP_SUFFIX = ".tmp"


def describe_os_error(exc: OSError) -> str:
    """`No space left on device (errno 28, ENOSPC)`: the error's text and errno, without the
    path (the caller's message names the path)."""
    if exc.errno is None:
        return str(exc)
    name = errno.errorcode.get(exc.errno, "?")
    return f"{exc.strerror or os.strerror(exc.errno)} (errno {exc.errno}, {name})"


def default_cache_dir() -> Path:
    """`$CACHE_DIRECTORY` (systemd `CacheDirectory=`), else the XDG cache dir.

    systemd lists one path per `CacheDirectory=` entry, colon-separated; the
    first is ours.
    """
    systemd = os.environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "vkserve"
    return Path.home() / ".cache" / "vkserve"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def read_cache_file(
    path: str | os.PathLike[str], expected: DeviceIdentity, max_bytes: int = MAX_FILE_BYTES,
    on_error: Callable[[OSError], None] | None = None,
) -> CacheContents | None:
    """Load and validate a cache file; None on any problem, never an exception.

    A missing file is an ordinary cold start (logged at DEBUG). Anything else
    that prevents use logs one WARNING naming the file and the reason; an OSError
    other than a missing file (the file could not be read, as opposed to being
    rejected) is also passed to `on_error`. The size
    is checked on the open descriptor before reading, so an oversized (or
    sparse multi-GB) file is never read into memory.
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO planted at the path must not hang startup.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            data = _read_bounded(f, max_bytes)
        return decode_cache_file(data, expected)
    except FileNotFoundError:
        log.debug("no pipeline cache file at %s", path)
        return None
    except CacheFileRejected as exc:
        reason = exc.reason
    except OSError as exc:
        if on_error is not None:
            on_error(exc)
        reason = f"cannot read: {describe_os_error(exc)}"
    log.warning("ignoring pipeline cache file %s: %s", path, reason)
    return None


def _read_bounded(f: BinaryIO, max_bytes: int) -> bytes:
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise CacheFileRejected("not a regular file")
    if st.st_size > max_bytes:
        raise CacheFileRejected(f"size {st.st_size} exceeds the {max_bytes}-byte limit")
    data = f.read(max_bytes + 1)  # +1: notice growth since the fstat
    if len(data) > max_bytes:
        raise CacheFileRejected(f"grew past the {max_bytes}-byte limit while being read")
    return data


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data` so that a crash at any point leaves the old
    file or the new one. Raises OSError on failure, after removing the temp file.

    The new file has mkstemp's mode 0600: the cache is private to the daemon's user.
    """
    path = Path(path)
    directory = path.parent
    fd, temp_name = tempfile.mkstemp(
        prefix=_temp_prefix(path), suffix=_TEMP_SUFFIX, dir=directory
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp_name, path)
    except BaseException:  # including KeyboardInterrupt: never leave the temp behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_dir(directory)


def remove_stale_temp_files(path: str | os.PathLike[str]) -> int:
    """Delete temp files that writers of `path` left when they died; returns how many.

    Only call this while holding `path`'s WriterLock: then no live writer can
    own one of them.
    """
    path = Path(path)
    prefix = _temp_prefix(path)
    removed = 0
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        return 0
    for name in names:
        if name.startswith(prefix) and name.endswith(_TEMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.parent / name)
                removed += 1
    if removed:
        log.info("removed %d temp file(s) left by an interrupted save of %s", removed, path)
    return removed


class WriterLock:
    """The right to write one cache file, exclusive across processes.

    `acquire()` takes a non-blocking `flock` on `<file>.lock` and keeps it until
    `release()` or the process exits (the kernel drops it then, even on
    SIGKILL). The lock file itself is never deleted: removing it would let two
    processes lock two different inodes under the same name.

    flock locks belong to the open file description: a child created by
    fork() shares a held lock, and a second WriterLock on the same path in the
    same process does not get it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._fd: int | None = None
        self._refusal_logged = False
        #: Why the last `acquire()` failed, when it was an error (not another process holding
        #: the lock): the caller counts it (PipelineCache's lock errors).
        self.error: OSError | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """True if this object now holds (or already held) the lock.

        On first success, removes temp files left by writers that died mid-save.
        When another process holds the lock, or the lock file cannot be opened
        or locked (read-only cache folder, filesystem without flock), returns
        False and logs once per object that this process will load but not write.
        """
        if self._fd is not None:
            return True
        self.error = None
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self.error = exc
            self._refuse(logging.WARNING,
                         f"cannot open {self.lock_path}: {describe_os_error(exc)}")
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                self._refuse(logging.INFO, f"another process holds {self.lock_path}")
            else:
                self.error = exc
                self._refuse(logging.WARNING,
                             f"cannot lock {self.lock_path}: {describe_os_error(exc)}")
            return False
        self._fd = fd
        remove_stale_temp_files(self.path)
        return True

    def _refuse(self, level: int, why: str) -> None:
        if not self._refusal_logged:
            self._refusal_logged = True
            log.log(level, "%s: will load the pipeline cache but not write it", why)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
