"""The on-disk pipeline cache file: encode, decode with strict validation, inspect.

One file per Vulkan device holds the two persistent tiers of DESIGN §5: compiled
SPIR-V for built-in shaders and the driver's VkPipelineCache blob. The file is a
performance hint only, so decoding is all-or-nothing: any doubt rejects the
whole file with `CacheFileRejected(reason)`, which callers treat as a miss.
Partial use is unsafe because one driver blob can hold pipelines built from many
shaders. This module does no I/O and makes no Vulkan calls (see `persist.py`).

Layout (every integer little-endian, no implicit padding)::

    header   HEADER_SIZE bytes, `_HEADER` below
    spirv    `spirv_count` entries, each `_ENTRY` + shader id (UTF-8) + SPIR-V
    blob     raw vkGetPipelineCacheData output, to end of file (may be empty)

Header fields, in order: magic (8 B), format version, header size, vkserve
version hash, endianness marker, pointer size, vendor id, device id, api
version, driver version, driver id, device name hash, driver name hash,
pipelineCacheUUID (16 B), SPIR-V entry count, SPIR-V section size and hash,
driver blob size and hash, and a hash of all preceding header bytes.

The endianness marker is the only native-order field: it is 0x01020304 packed
in the writer's byte order. It exists because the driver blob and SPIR-V words
are in the writer's native order, so a file from a host of the other byte order
must be refused even though our own fields would still parse.

Entry: name length (u16), option bits (u64), source hash (16 B), SPIR-V size
(u32), entry hash (16 B), then the name and the SPIR-V words. The entry hash
covers the entry's key and its SPIR-V, so an entry is checked on its own even
though the section hash already covers it.

Hashes: BLAKE2b (hashlib, no extra dependency). 16-byte digests for the header,
the sections, the entries and shader sources; 8-byte digests for names and the
vkserve version, where they only need to tell values apart, not detect damage.
FNV-1a (as in ncnn) was rejected: it is weak against the structured, repetitive
damage (zeroed pages, shifted blocks) that corruption tends to produce.

Validation order in `decode_cache_file` (the first failure is the reason):

 1. size bounds: HEADER_SIZE <= len(data) <= MAX_FILE_BYTES
 2. magic
 3. format version (and header size field)
 4. header hash
 5. vkserve version
 6. endianness marker
 7. pointer size
 8. identity fields, in `_IDENTITY_FIELDS` order (against the expected device)
 9. section sizes: header + SPIR-V section + driver blob == len(data)
10. section hashes: SPIR-V section, then driver blob
11. each SPIR-V entry in file order: fits, name is UTF-8, entry hash, SPIR-V
    size and magic, no duplicate key; then entry count and exact section use
12. driver blob: empty, or a VkPipelineCacheHeaderVersionOne with header length
    >= 32, version 1, and vendorID, deviceID and pipelineCacheUUID equal to the
    header's (which step 8 has already matched against the expected device)

The header hash (step 4) is not one of DESIGN §5's fields; it is checked before
any field is interpreted so that a flipped header byte reads as damage, not as a
plausible "another device" mismatch, and so `inspect` can tell the two apart
without knowing the device.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vkserve import __version__

if TYPE_CHECKING:  # devices depends on cache, not the reverse: caps are duck-typed here
    from vkserve.devices.capabilities import DeviceCaps

MAGIC = b"VKSVPC\r\n"  # \r\n catches files mangled by text-mode transfers
FORMAT_VERSION = 1
MAX_FILE_BYTES = 256 * 1024 * 1024
HASH_BYTES = 16
NAME_HASH_BYTES = 8

SPIRV_MAGIC = 0x07230203
VK_PIPELINE_CACHE_HEADER_VERSION_ONE = 1
_VK_PIPELINE_CACHE_HEADER = struct.Struct("=IIII16s")  # native order, as drivers write it

_ENDIAN_MARKER = struct.pack("=I", 0x01020304)
_POINTER_SIZE = struct.calcsize("P")

_HEADER = struct.Struct(
    "<"
    "8s"  # magic
    "I"  # format_version
    "I"  # header_size
    "8s"  # vkserve_version_hash
    "4s"  # endian_marker (native order, see module doc)
    "I"  # pointer_size
    "I"  # vendor_id
    "I"  # device_id
    "I"  # api_version
    "I"  # driver_version
    "I"  # driver_id
    "8s"  # device_name_hash
    "8s"  # driver_name_hash
    "16s"  # pipeline_cache_uuid
    "I"  # spirv_count
    "Q"  # spirv_size
    "16s"  # spirv_hash
    "Q"  # blob_size
    "16s"  # blob_hash
    "16s"  # header_hash, over every byte before it
)
HEADER_SIZE = _HEADER.size
_HEADER_FIELDS = (
    "magic",
    "format_version",
    "header_size",
    "vkserve_version_hash",
    "endian_marker",
    "pointer_size",
    "vendor_id",
    "device_id",
    "api_version",
    "driver_version",
    "driver_id",
    "device_name_hash",
    "driver_name_hash",
    "pipeline_cache_uuid",
    "spirv_count",
    "spirv_size",
    "spirv_hash",
    "blob_size",
    "blob_hash",
    "header_hash",
)
_IDENTITY_FIELDS = (
    "vendor_id",
    "device_id",
    "api_version",
    "driver_version",
    "driver_id",
    "device_name_hash",
    "driver_name_hash",
    "pipeline_cache_uuid",
)

_ENTRY = struct.Struct(
    "<"
    "H"  # name_size
    "Q"  # option_bits
    "16s"  # source_hash
    "I"  # spirv_size
    "16s"  # entry_hash, over the other entry header fields + name + SPIR-V
)
_ENTRY_KEY = struct.Struct("<HQ16sI")  # the hashed prefix of _ENTRY

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _digest(data: bytes | memoryview, size: int = HASH_BYTES) -> bytes:
    return hashlib.blake2b(data, digest_size=size).digest()


def _name_hash(name: str) -> bytes:
    return _digest(name.encode("utf-8"), NAME_HASH_BYTES)


VKSERVE_VERSION = __version__


def source_hash(source: bytes) -> bytes:
    """The `SpirvKey.source_hash` of a shader whose source text is `source`."""
    return _digest(source)


class CacheFileRejected(Exception):
    """The cache file must not be used; `reason` says why (for the log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class DeviceIdentity:
    """Everything about a device and driver that compiled code depends on."""

    vendor_id: int
    device_id: int
    api_version: int
    driver_version: int
    driver_id: int
    device_name: str
    driver_name: str
    pipeline_cache_uuid: bytes

    def __post_init__(self) -> None:
        for name in ("vendor_id", "device_id", "api_version", "driver_version", "driver_id"):
            value = getattr(self, name)
            if not 0 <= value <= _U32:
                raise ValueError(f"{name} {value} does not fit in 32 bits")
        if len(self.pipeline_cache_uuid) != 16:
            raise ValueError("pipeline_cache_uuid must be 16 bytes")

    @classmethod
    def from_caps(cls, caps: DeviceCaps) -> DeviceIdentity:
        """The identity of a Vulkan device (ValueError for the CPU device, which has no UUID)."""
        return cls(
            vendor_id=caps.vendor_id,
            device_id=caps.device_id,
            api_version=caps.api_version,
            driver_version=caps.driver_version,
            driver_id=caps.driver_id,
            device_name=caps.name,
            driver_name=caps.driver_name,
            pipeline_cache_uuid=bytes(caps.pipeline_cache_uuid),
        )

    def header_values(self) -> dict[str, int | bytes]:
        """The identity as the header stores it (names reduced to hashes)."""
        return {
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "api_version": self.api_version,
            "driver_version": self.driver_version,
            "driver_id": self.driver_id,
            "device_name_hash": _name_hash(self.device_name),
            "driver_name_hash": _name_hash(self.driver_name),
            "pipeline_cache_uuid": self.pipeline_cache_uuid,
        }

    def file_name(self) -> str:
        """A stable, filesystem-safe file name for this device and driver.

        Vendor and device ids keep names readable; the hash covers the driver
        (its UUID changes with each driver build), so a driver update starts a
        new file instead of fighting over the old one. Two identical GPUs with
        one driver share a name, which is correct: their caches are
        interchangeable.
        """
        driver = struct.pack("<II", self.driver_id, self.driver_version)
        tag = hashlib.blake2b(
            self.pipeline_cache_uuid + driver + self.driver_name.encode("utf-8"), digest_size=6
        ).hexdigest()
        return f"vkserve-{self.vendor_id:04x}-{self.device_id:04x}-{tag}.cache"


@dataclasses.dataclass(frozen=True, order=True)
class SpirvKey:
    """Key of one cached SPIR-V module: shader name, option bits, source hash."""

    shader_id: str
    option_bits: int
    source_hash: bytes


@dataclasses.dataclass(frozen=True)
class CacheContents:
    """What a valid file holds, ready to merge into a live PipelineCache."""

    identity: DeviceIdentity
    spirv: dict[SpirvKey, bytes]
    driver_blob: bytes


def driver_blob_problem(blob: bytes, identity: DeviceIdentity) -> str | None:
    """Why `blob` is not a driver cache for `identity`'s device, or None if it is.

    An empty blob is fine (no driver cache, or the driver gave none). Callers
    that get a bad blob from vkGetPipelineCacheData should drop it before
    `encode_cache_file`, which refuses it.
    """
    return _blob_problem(blob, identity.vendor_id, identity.device_id, identity.pipeline_cache_uuid)


def _blob_problem(blob: bytes | memoryview, vendor_id: int, device_id: int, uuid: bytes) -> str | None:
    if not blob:
        return None
    if len(blob) < _VK_PIPELINE_CACHE_HEADER.size:
        return f"driver blob of {len(blob)} bytes is shorter than a pipeline cache header"
    length, version, vendor, device, blob_uuid = _VK_PIPELINE_CACHE_HEADER.unpack_from(blob)
    if length < _VK_PIPELINE_CACHE_HEADER.size or length > len(blob):
        return f"driver blob header length {length} is out of range"
    if version != VK_PIPELINE_CACHE_HEADER_VERSION_ONE:
        return f"driver blob header version {version} is not VK_PIPELINE_CACHE_HEADER_VERSION_ONE"
    if vendor != vendor_id:
        return f"driver blob vendorID 0x{vendor:x} differs from the device's 0x{vendor_id:x}"
    if device != device_id:
        return f"driver blob deviceID 0x{device:x} differs from the device's 0x{device_id:x}"
    if blob_uuid != uuid:
        return f"driver blob pipelineCacheUUID {blob_uuid.hex()} differs from the device's {uuid.hex()}"
    return None


def _spirv_problem(key: SpirvKey, spirv: bytes | memoryview) -> str | None:
    if not spirv or len(spirv) % 4:
        return f"SPIR-V of {key.shader_id!r} has {len(spirv)} bytes, not a positive multiple of 4"
    if struct.unpack_from("=I", spirv)[0] != SPIRV_MAGIC:
        return f"SPIR-V of {key.shader_id!r} does not start with the SPIR-V magic number"
    return None


def _encode_entry(key: SpirvKey, spirv: bytes) -> bytes:
    name = key.shader_id.encode("utf-8")
    if not name or len(name) > 0xFFFF:
        raise ValueError(f"shader id {key.shader_id!r} must be 1..65535 UTF-8 bytes")
    if not 0 <= key.option_bits <= _U64:
        raise ValueError(f"option bits {key.option_bits} of {key.shader_id!r} do not fit in 64 bits")
    if len(key.source_hash) != HASH_BYTES:
        raise ValueError(f"source hash of {key.shader_id!r} must be {HASH_BYTES} bytes")
    if len(spirv) > _U32:
        raise ValueError(f"SPIR-V of {key.shader_id!r} is larger than 4 GiB")
    problem = _spirv_problem(key, spirv)
    if problem:
        raise ValueError(problem)
    prefix = _ENTRY_KEY.pack(len(name), key.option_bits, key.source_hash, len(spirv))
    entry_hash = _digest(prefix + name + spirv)
    return prefix + entry_hash + name + spirv


def encode_cache_file(
    identity: DeviceIdentity,
    spirv_entries: Mapping[SpirvKey, bytes],
    driver_blob: bytes,
    *,
    vkserve_version: str = VKSERVE_VERSION,
) -> bytes:
    """Serialise a cache file. Raises ValueError for input `decode` would reject.

    Entries are written sorted by key, so equal contents give equal bytes.
    `vkserve_version` is for tests; production files carry the installed one.
    """
    problem = driver_blob_problem(driver_blob, identity)
    if problem:
        raise ValueError(problem)
    spirv_section = b"".join(_encode_entry(k, spirv_entries[k]) for k in sorted(spirv_entries))
    if HEADER_SIZE + len(spirv_section) + len(driver_blob) > MAX_FILE_BYTES:
        raise ValueError(f"cache file would exceed {MAX_FILE_BYTES} bytes")
    values: dict[str, Any] = {
        "magic": MAGIC,
        "format_version": FORMAT_VERSION,
        "header_size": HEADER_SIZE,
        "vkserve_version_hash": _name_hash(vkserve_version),
        "endian_marker": _ENDIAN_MARKER,
        "pointer_size": _POINTER_SIZE,
        **identity.header_values(),
        "spirv_count": len(spirv_entries),
        "spirv_size": len(spirv_section),
        "spirv_hash": _digest(spirv_section),
        "blob_size": len(driver_blob),
        "blob_hash": _digest(driver_blob),
        "header_hash": bytes(HASH_BYTES),
    }
    header = bytearray(_HEADER.pack(*(values[f] for f in _HEADER_FIELDS)))
    header[-HASH_BYTES:] = _digest(header[:-HASH_BYTES])
    return bytes(header) + spirv_section + driver_blob


@dataclasses.dataclass
class _Parsed:
    """What validation has read so far; `inspect` reports it even on rejection."""

    header: dict[str, Any] | None = None
    entries: list[tuple[SpirvKey, bytes]] = dataclasses.field(default_factory=list)


def _show(value: int | bytes) -> str:
    return value.hex() if isinstance(value, bytes) else f"0x{value:x}"


def _validate(
    data: bytes, expected: DeviceIdentity | None, vkserve_version: str, out: _Parsed
) -> bytes:
    """Run the documented checks in order, filling `out`; raise on the first failure.

    Returns the driver blob of a valid file.
    """
    view = memoryview(data)
    size = len(view)
    if size == 0:
        raise CacheFileRejected("file is empty")
    if size < HEADER_SIZE:
        raise CacheFileRejected(f"file of {size} bytes is shorter than the {HEADER_SIZE}-byte header")
    if size > MAX_FILE_BYTES:
        raise CacheFileRejected(f"file of {size} bytes exceeds the {MAX_FILE_BYTES}-byte limit")
    header = dict(zip(_HEADER_FIELDS, _HEADER.unpack_from(view), strict=True))
    if header["magic"] != MAGIC:
        raise CacheFileRejected(f"bad magic {header['magic'].hex()}: not a vkserve pipeline cache file")
    if header["format_version"] != FORMAT_VERSION:
        raise CacheFileRejected(
            f"format version {header['format_version']} is not the supported {FORMAT_VERSION}"
        )
    if header["header_size"] != HEADER_SIZE:
        raise CacheFileRejected(f"header size {header['header_size']} is not {HEADER_SIZE}")
    out.header = header
    if _digest(view[: HEADER_SIZE - HASH_BYTES]) != header["header_hash"]:
        raise CacheFileRejected("header hash mismatch: the header is damaged")
    if header["vkserve_version_hash"] != _name_hash(vkserve_version):
        raise CacheFileRejected(f"written by another vkserve version (this is {vkserve_version})")
    if header["endian_marker"] != _ENDIAN_MARKER:
        raise CacheFileRejected("written on a host of the other byte order")
    if header["pointer_size"] != _POINTER_SIZE:
        raise CacheFileRejected(f"written with pointer size {header['pointer_size']}, this host has {_POINTER_SIZE}")
    if expected is not None:
        want = expected.header_values()
        for name in _IDENTITY_FIELDS:
            if header[name] != want[name]:
                raise CacheFileRejected(
                    f"another device: {name} is {_show(header[name])} in the file, "
                    f"{_show(want[name])} on this device"
                )
    spirv_size, blob_size = header["spirv_size"], header["blob_size"]
    if HEADER_SIZE + spirv_size + blob_size != size:
        raise CacheFileRejected(
            f"section sizes (SPIR-V {spirv_size}, driver blob {blob_size}) "
            f"do not add up to the file size {size}"
        )
    spirv_view = view[HEADER_SIZE : HEADER_SIZE + spirv_size]
    blob_view = view[HEADER_SIZE + spirv_size :]
    if _digest(spirv_view) != header["spirv_hash"]:
        raise CacheFileRejected("SPIR-V section hash mismatch")
    if _digest(blob_view) != header["blob_hash"]:
        raise CacheFileRejected("driver blob hash mismatch")
    _validate_entries(spirv_view, header["spirv_count"], out)
    problem = _blob_problem(
        blob_view, header["vendor_id"], header["device_id"], header["pipeline_cache_uuid"]
    )
    if problem:
        raise CacheFileRejected(problem)
    return bytes(blob_view)


def _validate_entries(section: memoryview, count: int, out: _Parsed) -> None:
    seen: set[SpirvKey] = set()
    offset = 0
    while offset < len(section):
        index = len(out.entries)
        if len(section) - offset < _ENTRY.size:
            raise CacheFileRejected(f"SPIR-V entry {index} header is cut off")
        name_size, option_bits, src_hash, spirv_size, entry_hash = _ENTRY.unpack_from(section, offset)
        body = offset + _ENTRY.size
        end = body + name_size + spirv_size
        if end > len(section):
            raise CacheFileRejected(f"SPIR-V entry {index} runs past the end of the section")
        name_bytes = section[body : body + name_size]
        spirv = section[body + name_size : end]
        hashed = _ENTRY_KEY.pack(name_size, option_bits, src_hash, spirv_size)
        if _digest(hashed + name_bytes + spirv) != entry_hash:
            raise CacheFileRejected(f"SPIR-V entry {index} hash mismatch")
        try:
            shader_id = bytes(name_bytes).decode("utf-8")
        except UnicodeDecodeError:
            raise CacheFileRejected(f"SPIR-V entry {index} shader id is not UTF-8") from None
        if not shader_id:
            raise CacheFileRejected(f"SPIR-V entry {index} has an empty shader id")
        key = SpirvKey(shader_id, option_bits, src_hash)
        problem = _spirv_problem(key, spirv)
        if problem:
            raise CacheFileRejected(f"SPIR-V entry {index}: {problem}")
        if key in seen:
            raise CacheFileRejected(f"SPIR-V entry {index} repeats the key of an earlier entry")
        seen.add(key)
        out.entries.append((key, bytes(spirv)))
        offset = end
    if len(out.entries) != count:
        raise CacheFileRejected(f"SPIR-V section holds {len(out.entries)} entries, the header says {count}")


def decode_cache_file(
    data: bytes, expected: DeviceIdentity, *, vkserve_version: str = VKSERVE_VERSION
) -> CacheContents:
    """Validate `data` for the `expected` device and return its contents.

    Raises CacheFileRejected, and nothing else, for any problem; the checks run
    in the order given in the module docstring.
    """
    parsed = _Parsed()
    blob = _validate(data, expected, vkserve_version, parsed)
    return CacheContents(expected, dict(parsed.entries), blob)


def inspect_cache_file(
    data: bytes,
    expected: DeviceIdentity | None = None,
    *,
    vkserve_version: str = VKSERVE_VERSION,
) -> dict[str, Any]:
    """Describe a cache file for `vkserve cache inspect`; never raises for bad data.

    Without `expected`, every check except the device match runs (the driver
    blob is checked against the identity the header records). The result has
    `valid`, `reason` (None when valid), `size`, `header` (fields as JSON-ready
    values, or None if the file is not in this format; check `reason` before
    trusting them), `entries` (those read
    before any failure) and `driver_blob` (bytes, or None unless valid).
    """
    parsed = _Parsed()
    reason: str | None = None
    blob: bytes | None = None
    try:
        blob = _validate(data, expected, vkserve_version, parsed)
    except CacheFileRejected as exc:
        reason = exc.reason
    header = None
    if parsed.header is not None:
        header = {
            name: value.hex() if isinstance(value, bytes) else value
            for name, value in parsed.header.items()
        }
        header["vkserve_version_matches"] = parsed.header["vkserve_version_hash"] == _name_hash(
            vkserve_version
        )
    return {
        "valid": reason is None,
        "reason": reason,
        "size": len(data),
        "header": header,
        "entries": [
            {
                "shader_id": key.shader_id,
                "option_bits": key.option_bits,
                "source_hash": key.source_hash.hex(),
                "spirv_bytes": len(spirv),
            }
            for key, spirv in parsed.entries
        ],
        "driver_blob": blob,
    }

