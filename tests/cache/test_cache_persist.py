"""Cache file persistence: bounded reads, atomic replacement under SIGKILL, one writer."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import vkserve.cache.persist as persist
from vkserve.cache.cache_file import (
    HEADER_SIZE,
    SPIRV_MAGIC,
    DeviceIdentity,
    SpirvKey,
    encode_cache_file,
    source_hash,
)
from vkserve.cache.persist import (
    WriterLock,
    atomic_write,
    default_cache_dir,
    read_cache_file,
    remove_stale_temp_files,
)

IDENTITY = DeviceIdentity(
    vendor_id=0x10005,
    device_id=0,
    api_version=(1 << 22) | (3 << 12),
    driver_version=(24 << 22) | (2 << 12),
    driver_id=13,
    device_name="llvmpipe (LLVM 17.0.6, 256 bits)",
    driver_name="llvmpipe",
    pipeline_cache_uuid=b"24.2.8-1ubuntu1\0",
)


def driver_blob(payload: bytes) -> bytes:
    header = struct.pack(
        "=IIII16s", 32, 1, IDENTITY.vendor_id, IDENTITY.device_id, IDENTITY.pipeline_cache_uuid
    )
    return header + payload


# Big enough that a save takes a while, so random kills land inside writes.
ENTRIES = {SpirvKey("relu", 0, source_hash(b"relu")): struct.pack("=I", SPIRV_MAGIC) + bytes(252)}
OLD = encode_cache_file(IDENTITY, ENTRIES, driver_blob(b"\x01" * (1 << 20)))
NEW = encode_cache_file(IDENTITY, {}, driver_blob(b"\x02" * (3 << 20)))


def warnings_in(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- default_cache_dir


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/vkserve:/var/cache/other")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == Path("/var/cache/vkserve")
    monkeypatch.delenv("CACHE_DIRECTORY")
    assert default_cache_dir() == tmp_path / "vkserve"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "vkserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == tmp_path / ".cache" / "vkserve"


# --------------------------------------------------------------------------- reading


def test_read_valid(tmp_path: Path) -> None:
    path = tmp_path / IDENTITY.file_name()
    atomic_write(path, OLD)
    contents = read_cache_file(path, IDENTITY)
    assert contents is not None and contents.spirv == ENTRIES


def test_missing_file_is_a_quiet_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="vkserve.cache.persist")
    assert read_cache_file(tmp_path / "absent.cache", IDENTITY) is None
    assert read_cache_file(tmp_path / "no" / "dir.cache", IDENTITY) is None
    assert warnings_in(caplog) == []
    assert any("no pipeline cache file" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "file is empty"),
        (OLD[:-1], "do not add up"),
        (OLD[:HEADER_SIZE - 1], "shorter than"),
        (b"X" + OLD[1:], "bad magic"),
    ],
)
def test_bad_file_is_a_logged_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, reason: str
) -> None:
    path = tmp_path / "bad.cache"
    path.write_bytes(content)
    assert read_cache_file(path, IDENTITY) is None
    [message] = warnings_in(caplog)
    assert str(path) in message and reason in message


def test_not_a_regular_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fifo = tmp_path / "fifo.cache"
    os.mkfifo(fifo)
    assert read_cache_file(fifo, IDENTITY) is None  # and does not hang
    assert read_cache_file(tmp_path, IDENTITY) is None
    fifo_warning, dir_warning = warnings_in(caplog)
    assert "not a regular file" in fifo_warning
    assert "not a regular file" in dir_warning or "Is a directory" in dir_warning


def test_read_error_is_a_logged_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.cache"
    path.write_bytes(OLD)

    def failing_read(f: object, max_bytes: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(persist, "_read_bounded", failing_read)
    assert read_cache_file(path, IDENTITY) is None
    [message] = warnings_in(caplog)
    assert str(path) in message and "cannot read: Input/output error" in message


def test_sparse_huge_file_rejected_before_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "huge.cache"
    with open(path, "wb") as f:
        f.write(OLD[:HEADER_SIZE])
        f.truncate(6 << 30)  # sparse: 6 GiB apparent size, a few KiB on disk

    def must_not_decode(*args: object) -> None:
        raise AssertionError("an oversized file reached the decoder")

    monkeypatch.setattr(persist, "decode_cache_file", must_not_decode)
    started = time.monotonic()
    assert read_cache_file(path, IDENTITY) is None
    assert time.monotonic() - started < 1.0
    [message] = warnings_in(caplog)
    assert f"size {6 << 30} exceeds" in message


def test_max_bytes_applies(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.cache"
    path.write_bytes(OLD)
    assert read_cache_file(path, IDENTITY, max_bytes=len(OLD) - 1) is None
    assert "exceeds" in warnings_in(caplog)[0]
    assert read_cache_file(path, IDENTITY, max_bytes=len(OLD)) is not None


def test_another_device_is_a_logged_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.cache"
    path.write_bytes(OLD)
    assert read_cache_file(path, dataclasses.replace(IDENTITY, driver_version=1)) is None
    assert "another device: driver_version" in warnings_in(caplog)[0]


# --------------------------------------------------------------------------- atomic_write


def test_atomic_write_replaces(tmp_path: Path) -> None:
    path = tmp_path / "c.cache"
    atomic_write(path, OLD)
    atomic_write(path, NEW)
    assert path.read_bytes() == NEW
    assert os.listdir(tmp_path) == ["c.cache"]


def test_atomic_write_failure_keeps_old_file_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.cache"
    atomic_write(path, OLD)

    def broken_replace(src: str, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(path, NEW)
    assert path.read_bytes() == OLD
    assert os.listdir(tmp_path) == ["c.cache"]


def test_atomic_write_into_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / "missing" / "c.cache", OLD)


# --------------------------------------------------------------------------- crash safety

SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from vkserve.cache.persist import atomic_write

    target, old, new = sys.argv[1:4]
    payloads = [Path(old).read_bytes(), Path(new).read_bytes()]
    i = 0
    while True:
        atomic_write(target, payloads[i % 2])
        if i == 0:
            print("saving", flush=True)
        i += 1
    """
)


def test_sigkill_during_saves_never_tears_the_file(tmp_path: Path) -> None:
    """Kill a process that saves in a loop at random moments, 60 times; the
    file is always exactly the old or the new content, and leftover temp files
    are neither read as the cache nor left once a writer takes the lock."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    target = cache_dir / IDENTITY.file_name()
    (tmp_path / "old").write_bytes(OLD)
    (tmp_path / "new").write_bytes(NEW)
    atomic_write(target, OLD)
    rng = random.Random(0x5EED)
    seen: set[bytes] = set()
    strays = 0
    for _ in range(60):
        child = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(target), str(tmp_path / "old"), str(tmp_path / "new")],
            stdout=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == b"saving\n"
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        data = target.read_bytes()
        assert data in (OLD, NEW)
        seen.add(data)
        contents = read_cache_file(target, IDENTITY)
        assert contents is not None and contents.driver_blob == data[-len(contents.driver_blob) :]
        others = [n for n in os.listdir(cache_dir) if n != target.name]
        assert all(n.startswith(f".{target.name}.") and n.endswith(".tmp") for n in others)
        strays += len(others)
        remove_stale_temp_files(target)
    assert seen == {OLD, NEW}
    assert strays > 0, "no kill landed inside a save: the test exercised nothing"


# --------------------------------------------------------------------------- single writer


def test_second_lock_in_process_is_refused_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vkserve.cache.persist")
    path = tmp_path / "c.cache"
    first, second = WriterLock(path), WriterLock(path)
    assert first.acquire() and first.acquire() and first.held
    assert not second.acquire() and not second.acquire() and not second.held
    refusals = [r for r in caplog.records if "will load the pipeline cache but not write" in r.getMessage()]
    assert len(refusals) == 1
    first.release()
    assert second.acquire()
    second.release()
    assert (tmp_path / "c.cache.lock").exists()


def test_lock_in_unusable_folder_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = WriterLock(tmp_path / "missing" / "c.cache")
    assert not lock.acquire() and not lock.acquire()
    [message] = warnings_in(caplog)
    assert "cannot open" in message and "will load the pipeline cache but not write" in message


def test_lock_holder_removes_stale_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "c.cache"
    atomic_write(path, OLD)
    stale = tmp_path / ".c.cache.abc123.tmp"
    stale.write_bytes(OLD[:100])
    unrelated = tmp_path / ".d.cache.abc123.tmp"
    unrelated.write_bytes(b"")
    with WriterLock(path) as lock:
        assert lock.acquire()
    assert not stale.exists() and unrelated.exists() and path.read_bytes() == OLD


LOCKER = textwrap.dedent(
    """
    import logging
    import sys
    from vkserve.cache.persist import WriterLock

    logging.basicConfig(level=logging.INFO)
    lock = WriterLock(sys.argv[1])
    print("writer" if lock.acquire() else "reader", flush=True)
    sys.stdin.read()  # hold until the parent closes stdin or kills us
    """
)


def _locker(path: Path) -> tuple[subprocess.Popen[bytes], str]:
    child = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    return child, child.stdout.readline().decode().strip()


def test_one_writer_across_processes_and_release_on_kill(tmp_path: Path) -> None:
    path = tmp_path / IDENTITY.file_name()
    holder, role = _locker(path)
    other, other_role = _locker(path)
    try:
        assert (role, other_role) == ("writer", "reader")
        assert b"will load the pipeline cache but not write" in other.communicate(b"")[1]
        assert not WriterLock(path).acquire()
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        successor, successor_role = _locker(path)
        assert successor_role == "writer"
        successor.communicate(b"")
    finally:
        for child in (holder, other):
            if child.poll() is None:
                child.kill()
                child.wait()
            for stream in (child.stdin, child.stdout, child.stderr):
                if stream:
                    stream.close()
