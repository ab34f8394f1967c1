"""The cache file format: round trip, and rejection of every kind of damage."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vkserve.cache.cache_file as cf
from vkserve.cache.cache_file import (
    HEADER_SIZE,
    CacheFileRejected,
    DeviceIdentity,
    SpirvKey,
    decode_cache_file,
    driver_blob_problem,
    encode_cache_file,
    inspect_cache_file,
    source_hash,
)
from vkserve.devices.capabilities import DeviceCaps, DeviceKind

IDENTITY = DeviceIdentity(
    vendor_id=0x10DE,
    device_id=0x2330,
    api_version=(1 << 22) | (3 << 12) | 277,
    driver_version=0x8C1A4000,
    driver_id=4,
    device_name="NVIDIA H100 80GB HBM3",
    driver_name="NVIDIA",
    pipeline_cache_uuid=bytes(range(16)),
)


def spirv(words: int, seed: int = 0) -> bytes:
    body = bytes((seed + i) % 251 for i in range(4 * (words - 1)))
    return struct.pack("=I", cf.SPIRV_MAGIC) + body


def driver_blob(
    identity: DeviceIdentity = IDENTITY,
    payload: bytes = b"driver-private-data" * 7,
    *,
    length: int = 32,
    version: int = 1,
    vendor_id: int | None = None,
    device_id: int | None = None,
    uuid: bytes | None = None,
) -> bytes:
    header = struct.pack(
        "=IIII16s",
        length,
        version,
        identity.vendor_id if vendor_id is None else vendor_id,
        identity.device_id if device_id is None else device_id,
        identity.pipeline_cache_uuid if uuid is None else uuid,
    )
    return header + payload


ENTRIES = {
    SpirvKey("convolution", 0, source_hash(b"conv glsl")): spirv(40, 1),
    SpirvKey("convolution", 0b1011, source_hash(b"conv glsl")): spirv(44, 2),
    SpirvKey("softmax", 3, source_hash(b"softmax glsl")): spirv(12, 3),
}
BLOB = driver_blob()


@pytest.fixture(scope="module")
def valid() -> bytes:
    return encode_cache_file(IDENTITY, ENTRIES, BLOB)


def header_of(data: bytes) -> dict:
    return dict(zip(cf._HEADER_FIELDS, cf._HEADER.unpack_from(data), strict=True))


def reseal(data: bytes | bytearray, **overrides: object) -> bytes:
    """Set header fields, then recompute every hash the header holds.

    Lets a test damage one thing while keeping every earlier check passing.
    Fields named in `overrides` win over the recomputed hashes.
    """
    data = bytearray(data)
    h = header_of(data)
    h.update(overrides)
    spirv_end = HEADER_SIZE + h["spirv_size"]
    if "spirv_hash" not in overrides:
        h["spirv_hash"] = cf._digest(bytes(data[HEADER_SIZE:spirv_end]))
    if "blob_hash" not in overrides:
        h["blob_hash"] = cf._digest(bytes(data[spirv_end:]))
    packed = bytearray(cf._HEADER.pack(*(h[f] for f in cf._HEADER_FIELDS)))
    if "header_hash" not in overrides:
        packed[-16:] = cf._digest(bytes(packed[:-16]))
    data[:HEADER_SIZE] = packed
    return bytes(data)


def raw_entry(name: bytes, option_bits: int, src: bytes, code: bytes, *, good_hash: bool = True) -> bytes:
    prefix = cf._ENTRY_KEY.pack(len(name), option_bits, src, len(code))
    entry_hash = cf._digest(prefix + name + code) if good_hash else bytes(16)
    return prefix + entry_hash + name + code


def build(section: bytes, count: int, blob: bytes = BLOB, identity: DeviceIdentity = IDENTITY) -> bytes:
    """A file with a hand-made SPIR-V section and correct header hashes."""
    base = bytearray(encode_cache_file(identity, {}, b""))
    data = bytes(base) + section + blob
    return reseal(data, spirv_count=count, spirv_size=len(section), blob_size=len(blob))


def rejected(data: bytes, expected: DeviceIdentity = IDENTITY, **kw: object) -> str:
    with pytest.raises(CacheFileRejected) as info:
        decode_cache_file(data, expected, **kw)
    return info.value.reason


# --------------------------------------------------------------------------- round trip


def test_round_trip(valid: bytes) -> None:
    contents = decode_cache_file(valid, IDENTITY)
    assert contents.spirv == ENTRIES
    assert contents.driver_blob == BLOB
    assert contents.identity == IDENTITY


def test_encoding_is_deterministic() -> None:
    reordered = dict(reversed(list(ENTRIES.items())))
    assert encode_cache_file(IDENTITY, reordered, BLOB) == encode_cache_file(IDENTITY, ENTRIES, BLOB)


def test_empty_cache_round_trips() -> None:
    data = encode_cache_file(IDENTITY, {}, b"")
    assert len(data) == HEADER_SIZE
    contents = decode_cache_file(data, IDENTITY)
    assert contents.spirv == {} and contents.driver_blob == b""


def test_non_ascii_shader_id_round_trips() -> None:
    entries = {SpirvKey("gemm_ü_\u4e2d", 2**64 - 1, source_hash(b"x")): spirv(8)}
    data = encode_cache_file(IDENTITY, entries, b"")
    assert decode_cache_file(data, IDENTITY).spirv == entries


@pytest.mark.parametrize(
    "key, code, blob",
    [
        (SpirvKey("", 0, source_hash(b"")), spirv(4), b""),
        (SpirvKey("a", -1, source_hash(b"")), spirv(4), b""),
        (SpirvKey("a", 2**64, source_hash(b"")), spirv(4), b""),
        (SpirvKey("a", 0, b"short"), spirv(4), b""),
        (SpirvKey("a", 0, source_hash(b"")), spirv(4)[:-1], b""),
        (SpirvKey("a", 0, source_hash(b"")), b"", b""),
        (SpirvKey("a", 0, source_hash(b"")), b"\0" * 16, b""),
        (SpirvKey("a", 0, source_hash(b"")), spirv(4), driver_blob(uuid=b"\xff" * 16)),
    ],
)
def test_encode_refuses_what_decode_would_reject(key: SpirvKey, code: bytes, blob: bytes) -> None:
    with pytest.raises(ValueError):
        encode_cache_file(IDENTITY, {key: code}, blob)


# --------------------------------------------------------------------------- size bounds


def test_empty_file() -> None:
    assert rejected(b"") == "file is empty"


@pytest.mark.parametrize("keep", [1, 8, HEADER_SIZE - 1])
def test_shorter_than_header(valid: bytes, keep: int) -> None:
    assert "shorter than" in rejected(valid[:keep])


@pytest.mark.parametrize("drop", [1, 4, 100, len(BLOB), len(BLOB) + 1])
def test_truncated(valid: bytes, drop: int) -> None:
    assert "do not add up to the file size" in rejected(valid[:-drop])


def test_trailing_garbage(valid: bytes) -> None:
    assert "do not add up to the file size" in rejected(valid + b"\0")


def test_above_size_limit(valid: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cf, "MAX_FILE_BYTES", len(valid) - 1)
    assert "exceeds" in rejected(valid)


@pytest.mark.parametrize("field", ["spirv_size", "blob_size"])
@pytest.mark.parametrize("size", [2**32, 2**63, 2**64 - 1])
def test_huge_declared_size(valid: bytes, field: str, size: int) -> None:
    assert "do not add up to the file size" in rejected(reseal(valid, **{field: size}))


def test_huge_declared_entry_count(valid: bytes) -> None:
    assert "holds 3 entries, the header says" in rejected(reseal(valid, spirv_count=2**32 - 1))


# --------------------------------------------------------------------------- header


def test_wrong_magic(valid: bytes) -> None:
    assert "bad magic" in rejected(b"NOTVKSVC" + valid[8:])
    assert "bad magic" in rejected(reseal(valid, magic=b"NOTVKSVC"))


def test_wrong_version(valid: bytes) -> None:
    assert "format version 2" in rejected(reseal(valid, format_version=cf.FORMAT_VERSION + 1))


def test_wrong_header_size(valid: bytes) -> None:
    assert "header size" in rejected(reseal(valid, header_size=HEADER_SIZE + 4))


def test_other_vkserve_version() -> None:
    data = encode_cache_file(IDENTITY, ENTRIES, BLOB, vkserve_version="0.0.1")
    assert "another vkserve version" in rejected(data)
    assert decode_cache_file(data, IDENTITY, vkserve_version="0.0.1").spirv == ENTRIES


def test_other_endianness(valid: bytes) -> None:
    flipped = cf._ENDIAN_MARKER[::-1]
    assert "byte order" in rejected(reseal(valid, endian_marker=flipped))


def test_other_pointer_size(valid: bytes) -> None:
    other = 4 if cf._POINTER_SIZE == 8 else 8
    assert "pointer size" in rejected(reseal(valid, pointer_size=other))


def _header_region(offset: int) -> str:
    if offset < 8:
        return "bad magic"
    if offset < 12:
        return "format version"
    if offset < 16:
        return "header size"
    return "header hash mismatch"


@pytest.mark.parametrize("offset", range(HEADER_SIZE))
def test_flipped_header_byte(valid: bytes, offset: int) -> None:
    data = bytearray(valid)
    data[offset] ^= 0x01
    assert _header_region(offset) in rejected(bytes(data))


# --------------------------------------------------------------------------- identity

OTHER_DEVICE = {
    "vendor_id": 0x1002,
    "device_id": 0x2331,
    "api_version": IDENTITY.api_version + 1,
    "driver_version": IDENTITY.driver_version + 1,
    "driver_id": 5,
    "device_name": "NVIDIA H100 PCIe",
    "driver_name": "nouveau",
    "pipeline_cache_uuid": bytes(16),
}


@pytest.mark.parametrize("field", sorted(OTHER_DEVICE))
def test_other_device_identity(valid: bytes, field: str) -> None:
    other = dataclasses.replace(IDENTITY, **{field: OTHER_DEVICE[field]})
    reason = rejected(valid, other)
    header_field = field + "_hash" if field.endswith("_name") else field
    assert reason.startswith(f"another device: {header_field} ")


def test_identity_is_checked_before_sections(valid: bytes) -> None:
    """A damaged file from another device reports the device, not the damage."""
    other = dataclasses.replace(IDENTITY, device_id=1)
    assert "another device" in rejected(valid[:-1], other)


# --------------------------------------------------------------------------- sections


def test_flipped_spirv_byte(valid: bytes) -> None:
    spirv_size = header_of(valid)["spirv_size"]
    for offset in range(HEADER_SIZE, HEADER_SIZE + spirv_size):
        data = bytearray(valid)
        data[offset] ^= 0x80
        assert rejected(bytes(data)) == "SPIR-V section hash mismatch", offset


def test_flipped_driver_blob_byte(valid: bytes) -> None:
    for offset in range(len(valid) - len(BLOB), len(valid)):
        data = bytearray(valid)
        data[offset] ^= 0x01
        assert rejected(bytes(data)) == "driver blob hash mismatch", offset


def test_entry_hash_checked_even_when_section_hash_matches(valid: bytes) -> None:
    data = bytearray(valid)
    data[-len(BLOB) - 1] ^= 0x01  # last byte of the last entry's SPIR-V
    assert "SPIR-V entry 2 hash mismatch" in rejected(reseal(data))


def test_entry_header_flip_resealed(valid: bytes) -> None:
    data = bytearray(valid)
    data[HEADER_SIZE + 2] ^= 0x01  # first entry's option bits
    assert "SPIR-V entry 0 hash mismatch" in rejected(reseal(data))


SRC = source_hash(b"s")


@pytest.mark.parametrize(
    "section, count, reason",
    [
        (raw_entry(b"a", 0, SRC, spirv(4), good_hash=False), 1, "entry 0 hash mismatch"),
        (raw_entry(b"a", 0, SRC, spirv(4))[:10], 1, "entry 0 header is cut off"),
        (raw_entry(b"a", 0, SRC, spirv(4))[:-1], 1, "entry 0 runs past the end"),
        (raw_entry(b"\xff\xfe", 0, SRC, spirv(4)), 1, "not UTF-8"),
        (raw_entry(b"", 0, SRC, spirv(4)), 1, "empty shader id"),
        (raw_entry(b"a", 0, SRC, b""), 1, "not a positive multiple of 4"),
        (raw_entry(b"a", 0, SRC, spirv(4) + b"\0"), 1, "not a positive multiple of 4"),
        (raw_entry(b"a", 0, SRC, b"\0" * 16), 1, "SPIR-V magic"),
        (raw_entry(b"a", 0, SRC, spirv(4)) * 2, 2, "entry 1 repeats the key"),
        (raw_entry(b"a", 0, SRC, spirv(4)), 2, "holds 1 entries, the header says 2"),
        (raw_entry(b"a", 0, SRC, spirv(4)), 0, "holds 1 entries, the header says 0"),
    ],
)
def test_bad_entries(section: bytes, count: int, reason: str) -> None:
    assert reason in rejected(build(section, count))


def test_hand_built_file_is_accepted() -> None:
    """The test helpers themselves produce files the decoder accepts."""
    section = raw_entry(b"a", 0, SRC, spirv(4)) + raw_entry(b"a", 1, SRC, spirv(4))
    assert len(decode_cache_file(build(section, 2), IDENTITY).spirv) == 2


# --------------------------------------------------------------------------- driver blob


@pytest.mark.parametrize(
    "blob, reason",
    [
        (driver_blob(uuid=b"\xee" * 16), "pipelineCacheUUID"),
        (driver_blob(vendor_id=0x1002), "vendorID"),
        (driver_blob(device_id=0x1234), "deviceID"),
        (driver_blob(version=2), "header version 2"),
        (driver_blob(length=31), "header length 31"),
        (driver_blob(length=10_000), "header length 10000"),
        (driver_blob()[:31], "shorter than a pipeline cache header"),
    ],
)
def test_bad_driver_blob(blob: bytes, reason: str) -> None:
    assert reason in rejected(build(b"", 0, blob))
    assert reason in (driver_blob_problem(blob, IDENTITY) or "")


def test_driver_blob_header_length_may_exceed_32() -> None:
    blob = driver_blob(length=48, payload=bytes(64))
    assert decode_cache_file(build(b"", 0, blob), IDENTITY).driver_blob == blob


# --------------------------------------------------------------------------- inspect


def test_inspect_valid(valid: bytes) -> None:
    info = inspect_cache_file(valid)
    assert info["valid"] and info["reason"] is None
    assert info["header"]["vendor_id"] == IDENTITY.vendor_id
    assert info["header"]["pipeline_cache_uuid"] == IDENTITY.pipeline_cache_uuid.hex()
    assert info["header"]["vkserve_version_matches"]
    assert [e["shader_id"] for e in info["entries"]] == ["convolution", "convolution", "softmax"]
    assert info["driver_blob"] == BLOB
    assert inspect_cache_file(valid, IDENTITY)["valid"]


def test_inspect_other_device(valid: bytes) -> None:
    info = inspect_cache_file(valid, dataclasses.replace(IDENTITY, driver_id=9))
    assert not info["valid"] and "driver_id" in info["reason"]
    assert info["header"]["driver_id"] == IDENTITY.driver_id


def test_inspect_checks_blob_against_its_own_header() -> None:
    info = inspect_cache_file(build(b"", 0, driver_blob(uuid=b"\x01" * 16)))
    assert not info["valid"] and "pipelineCacheUUID" in info["reason"]


def test_inspect_damaged(valid: bytes) -> None:
    data = bytearray(valid)
    data[-len(BLOB) - 1] ^= 0x01
    info = inspect_cache_file(reseal(data))
    assert not info["valid"] and "entry 2" in info["reason"]
    assert len(info["entries"]) == 2 and info["driver_blob"] is None
    garbage = inspect_cache_file(b"hello")
    assert garbage["header"] is None and not garbage["valid"]


# --------------------------------------------------------------------------- identity


def test_identity_from_caps() -> None:
    caps = DeviceCaps(
        index=0,
        kind=DeviceKind.VULKAN,
        name=IDENTITY.device_name,
        type="discrete-gpu",
        vendor_id=IDENTITY.vendor_id,
        device_id=IDENTITY.device_id,
        driver_id=IDENTITY.driver_id,
        driver_name=IDENTITY.driver_name,
        driver_version=IDENTITY.driver_version,
        api_version=IDENTITY.api_version,
        pipeline_cache_uuid=IDENTITY.pipeline_cache_uuid,
    )
    assert DeviceIdentity.from_caps(caps) == IDENTITY


def test_identity_of_the_real_device(vulkan_caps: DeviceCaps) -> None:
    identity = DeviceIdentity.from_caps(vulkan_caps)
    blob = driver_blob(identity)
    data = encode_cache_file(identity, ENTRIES, blob)
    assert decode_cache_file(data, identity).driver_blob == blob
    assert identity.file_name().startswith(f"vkserve-{vulkan_caps.vendor_id:04x}-")


def test_identity_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(IDENTITY, pipeline_cache_uuid=b"")
    with pytest.raises(ValueError):
        dataclasses.replace(IDENTITY, vendor_id=2**32)


def test_file_name() -> None:
    name = IDENTITY.file_name()
    assert name == dataclasses.replace(IDENTITY).file_name()  # stable
    assert name.startswith("vkserve-10de-2330-") and name.endswith(".cache")
    assert all(c.isalnum() or c in "-." for c in name)
    others = {
        dataclasses.replace(IDENTITY, **{f: OTHER_DEVICE[f]}).file_name()
        for f in ("vendor_id", "device_id", "pipeline_cache_uuid", "driver_version", "driver_name", "driver_id")
    }
    assert name not in others and len(others) == 6


# --------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_or_reject(data: bytes) -> cf.CacheContents | None:
    """Decode; None on CacheFileRejected. Any other exception fails the test."""
    try:
        return decode_cache_file(data, IDENTITY)
    except CacheFileRejected as exc:
        assert exc.reason
        return None


@FUZZ
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    assert decode_or_reject(data) is None
    inspect_cache_file(data)


@FUZZ
@given(st.binary(max_size=1024))
def test_fuzz_bytes_after_a_valid_prefix(tail: bytes) -> None:
    prefix = encode_cache_file(IDENTITY, {}, b"")[:16]
    decode_or_reject(prefix + tail)
    inspect_cache_file(prefix + tail)


@st.composite
def mutations(draw: st.DrawFn, size: int) -> list[tuple[str, int, int, bytes]]:
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        pos = draw(st.integers(0, size))
        ops.append((kind, pos, draw(st.integers(0, 255)), draw(st.binary(min_size=1, max_size=16))))
    return ops


def apply(data: bytes, ops: list[tuple[str, int, int, bytes]]) -> bytes:
    buf = bytearray(data)
    for kind, pos, value, chunk in ops:
        pos = min(pos, len(buf))
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= value or 1
        elif kind == "set" and pos < len(buf):
            buf[pos] = value
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = chunk
        elif kind == "delete":
            del buf[pos : pos + len(chunk)]
    return bytes(buf)


VALID = encode_cache_file(IDENTITY, ENTRIES, BLOB)


@FUZZ
@given(mutations(len(VALID)), st.booleans())
def test_fuzz_mutations_of_a_valid_file(ops: list, sealed: bool) -> None:
    """Random damage is rejected or harmless; with `sealed`, the header hashes
    are recomputed after the damage so the deeper checks get exercised too."""
    data = apply(VALID, ops)
    if sealed and len(data) >= HEADER_SIZE:
        data = reseal(data)
    contents = decode_or_reject(data)
    if contents is not None and not sealed:
        assert data == VALID
    if contents is not None:
        assert encode_cache_file(IDENTITY, contents.spirv, contents.driver_blob) == data
    inspect_cache_file(data)


@FUZZ
@given(
    st.dictionaries(
        st.builds(
            SpirvKey,
            st.text(min_size=1, max_size=20),
            st.integers(0, 2**64 - 1),
            st.binary(min_size=16, max_size=16),
        ),
        st.integers(1, 64).map(spirv),
        max_size=8,
    ),
    st.binary(max_size=256).map(lambda p: driver_blob(payload=p)) | st.just(b""),
)
def test_fuzz_round_trip(entries: dict, blob: bytes) -> None:
    contents = decode_cache_file(encode_cache_file(IDENTITY, entries, blob), IDENTITY)
    assert contents.spirv == entries and contents.driver_blob == blob
