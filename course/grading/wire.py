"""The grading channel's format: plain values and tensors as bytes, never pickles.

A frame is b"GRD1", the header's length (4 bytes) and the blob's (8 bytes), then a JSON header
and a blob of raw tensor bytes. Values in the header are JSON scalars (None, bools, ints, floats,
strings) or objects with one tag: {"list": [...]}, {"tuple": [...]}, {"dict": [[key, value], ...]},
{"dtype": "float32"}, {"device": "cuda:0"}, {"slice": [start, stop, step]},
{"object": "NodeGroups", "fields": {...}} (a dataclass the receiver looks up by name in the
module it serves: never a class the sender names by path), and {"tensor": {"storage": i, "dtype",
"shape", "stride", "offset"}}, a view of storage i of the header's "storages" list
({"device", "dtype", "start" (byte offset into the blob), "count" (elements)}). Views of one storage
stay views of one storage, so aliased arguments arrive aliased.

`decode` builds every tensor itself from dtype, shape and bytes (bools from bytes != 0) and
checks every number against the limits it is given: a frame it cannot read raises WireError,
whatever the sender put in it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MAGIC = b"GRD1"
PREFIX = struct.Struct(">4sIQ")
DTYPES = {name: getattr(torch, name) for name in (
    "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_RANK = 8
MAX_DEPTH = 24
MAX_NODES = 200_000
MAX_STRING = 1 << 20


class WireError(ValueError):
    """A frame that does not follow the format or breaks a limit."""


@dataclass(frozen=True)
class WireLimits:
    header_bytes: int = 16 << 20
    blob_bytes: int = 2 << 30


# ------------------------------------------------------------------------------------ encoding

class Encoder:
    """Turns values into a header and a blob. `name_of(obj)` names a dataclass instance's class for
    the receiver (None: not sendable)."""

    def __init__(self, name_of: Callable[[object], str | None] = lambda obj: None):
        self.name_of = name_of
        self.storages: list[dict] = []
        self.chunks: list[bytes] = []
        self.size = 0
        self._seen: dict[tuple, int] = {}

    def encode(self, value, depth: int = 0):
        if depth > MAX_DEPTH:
            raise TypeError("values nested too deeply to send")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, torch.Tensor):
            return {"tensor": self._tensor(value)}
        if isinstance(value, torch.dtype):
            if value not in DTYPE_NAMES:
                raise TypeError(f"cannot send the dtype {value}")
            return {"dtype": DTYPE_NAMES[value]}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.Size):
            return {"tuple": [int(n) for n in value]}
        if isinstance(value, (list, tuple)):
            tag = "list" if isinstance(value, list) else "tuple"
            return {tag: [self.encode(item, depth + 1) for item in value]}
        if isinstance(value, dict):
            return {"dict": [[self.encode(k, depth + 1), self.encode(v, depth + 1)]
                             for k, v in value.items()]}
        if isinstance(value, slice):
            return {"slice": [self.encode(x, depth + 1) for x in (value.start, value.stop, value.step)]}
        if hasattr(value, "item") and getattr(value, "shape", None) == ():
            return self.encode(value.item(), depth)  # a numpy scalar
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            name = self.name_of(value)
            if name is None:
                raise TypeError(f"cannot send a {type(value).__name__}")
            return {"object": name, "fields": {f.name: self.encode(getattr(value, f.name), depth + 1)
                                               for f in dataclasses.fields(value)}}
        raise TypeError(f"cannot send a {type(value).__name__}")

    def _tensor(self, tensor: torch.Tensor) -> dict:
        if tensor.dtype not in DTYPE_NAMES:
            raise TypeError(f"cannot send a {tensor.dtype} tensor")
        if tensor.is_sparse or tensor.layout != torch.strided or tensor.is_complex():
            raise TypeError("cannot send a sparse or complex tensor")
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device.type, tensor.device.index, tensor.dtype)
        itemsize = tensor.element_size()
        if key not in self._seen or storage.data_ptr() == 0:
            data = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
                storage, 0, (storage.nbytes() // itemsize,), (1,))
            raw = data.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
            self._seen[key] = len(self.storages)
            self.storages.append({"device": tensor.device.type, "dtype": DTYPE_NAMES[tensor.dtype],
                                  "start": self.size, "count": len(raw) // itemsize})
            self.chunks.append(raw)
            self.size += len(raw)
        return {"storage": self._seen[key], "dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                "stride": list(tensor.stride()), "offset": tensor.storage_offset()}

    def frame(self, message: dict) -> bytes:
        header = json.dumps({**message, "storages": self.storages}, allow_nan=True).encode()
        return PREFIX.pack(MAGIC, len(header), self.size) + header + b"".join(self.chunks)


def frame(message: dict, name_of: Callable[[object], str | None] = lambda obj: None, **values) -> bytes:
    """One frame: `message` (plain JSON) with each of `values` encoded under its key."""
    encoder = Encoder(name_of)
    encoded = {key: encoder.encode(value) for key, value in values.items()}
    return encoder.frame({**message, **encoded})


# ------------------------------------------------------------------------------------ decoding

class Decoder:
    """Builds values from a header and a blob. `resolve(name)` gives the dataclass a name stands for
    (None: refused); `device_ok(name)` says where tensors may be built."""

    def __init__(self, header: dict, blob: bytes, resolve: Callable[[str], type | None] = lambda name: None,
                 device_ok: Callable[[str], bool] = lambda device: device == "cpu"):
        self.blob, self.resolve, self.device_ok = blob, resolve, device_ok
        self.nodes = 0
        storages = header.get("storages", [])
        if not isinstance(storages, list):
            raise WireError("storages must be a list")
        self.storages = [self._storage(s) for s in storages]
        self.built: dict[int, torch.Tensor] = {}
        # A reply (`strict`): every tensor contiguous, alone in a storage of exactly its size, so
        # that what the grader builds is never larger than the bytes that came (no zero-stride
        # or overlapping view of a few bytes standing for gigabytes), and no two share memory.
        self.strict = False
        self.claimed: set[int] = set()  # storages a strict tensor owns

    def _storage(self, spec) -> tuple[str, torch.dtype, int, int]:
        if not isinstance(spec, dict) or set(spec) != {"device", "dtype", "start", "count"}:
            raise WireError("a storage must give device, dtype, start and count")
        device, dtype, start, count = spec["device"], spec["dtype"], spec["start"], spec["count"]
        if not isinstance(device, str) or not self.device_ok(device):
            raise WireError(f"tensors may not live on {device!r}")
        if dtype not in DTYPES:
            raise WireError(f"unknown dtype {dtype!r}")
        if not all(is_int(x) and x >= 0 for x in (start, count)):
            raise WireError("a storage's start and count must be non-negative ints")
        itemsize = torch.empty(0, dtype=DTYPES[dtype]).element_size()
        if start + count * itemsize > len(self.blob):
            raise WireError("a storage runs past the end of the data")
        return device, DTYPES[dtype], start, count

    def decode(self, value, depth: int = 0):
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise WireError("too many or too deeply nested values")
        if value is None or isinstance(value, (bool, float)):
            return value
        if is_int(value):
            return value
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise WireError("a string longer than the limit")
            return value
        if not isinstance(value, dict) or len(value) not in (1, 2):
            raise WireError(f"not a value: {type(value).__name__}")
        if "list" in value or "tuple" in value:
            items = value.get("list", value.get("tuple"))
            if len(value) != 1 or not isinstance(items, list):
                raise WireError("a list must hold a list")
            decoded = [self.decode(item, depth + 1) for item in items]
            return decoded if "list" in value else tuple(decoded)
        if "dict" in value:
            pairs = value["dict"]
            if len(value) != 1 or not isinstance(pairs, list) or not all(
                    isinstance(p, list) and len(p) == 2 for p in pairs):
                raise WireError("a dict must hold [key, value] pairs")
            out = {}
            for key, item in pairs:
                key = self.decode(key, depth + 1)
                if not isinstance(key, (str, int, bool)) and key is not None:
                    raise WireError("a dict key must be a string or an int")
                out[key] = self.decode(item, depth + 1)
            return out
        if "dtype" in value:
            if len(value) != 1 or value["dtype"] not in DTYPES:
                raise WireError(f"unknown dtype {value.get('dtype')!r}")
            return DTYPES[value["dtype"]]
        if "device" in value:
            name = value["device"]
            if len(value) != 1 or not isinstance(name, str) or not self.device_ok(name.split(":")[0]):
                raise WireError(f"not a device here: {name!r}")
            return torch.device(name)
        if "slice" in value:
            parts = value["slice"]
            if len(value) != 1 or not isinstance(parts, list) or len(parts) != 3:
                raise WireError("a slice must hold [start, stop, step]")
            parts = [self.decode(x, depth + 1) for x in parts]
            if not all(x is None or is_int(x) for x in parts):
                raise WireError("a slice holds ints or None")
            return slice(*parts)
        if "tensor" in value:
            if len(value) != 1:
                raise WireError("a tensor is tagged alone")
            return self._tensor(value["tensor"])
        if "object" in value:
            return self._object(value, depth)
        raise WireError(f"unknown tag {sorted(value)!r}")

    def _tensor(self, spec) -> torch.Tensor:
        if not isinstance(spec, dict) or set(spec) != {"storage", "dtype", "shape", "stride", "offset"}:
            raise WireError("a tensor must give storage, dtype, shape, stride and offset")
        index, shape, stride, offset = spec["storage"], spec["shape"], spec["stride"], spec["offset"]
        if not is_int(index) or not 0 <= index < len(self.storages):
            raise WireError("a tensor names a storage that is not there")
        device, dtype, start, count = self.storages[index]
        if spec["dtype"] != DTYPE_NAMES[dtype]:
            raise WireError("a tensor's dtype differs from its storage's")
        if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride) <= MAX_RANK
                and all(is_int(x) and x >= 0 for x in shape + stride) and is_int(offset) and offset >= 0):
            raise WireError("a tensor's shape, stride and offset must be non-negative ints, rank at most 8")
        numel = 1
        for n in shape:
            numel *= n
        if numel and offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) >= count:
            raise WireError("a tensor reaches past the end of its storage")
        if numel and offset >= count:
            raise WireError("a tensor starts past the end of its storage")
        if index in self.claimed:
            raise WireError("two tensors of the reply share memory")
        if self.strict:
            if offset != 0 or count != numel or stride != contiguous_strides(shape):
                raise WireError(f"a reply tensor of shape {tuple(shape)} is not a contiguous tensor of its "
                                "own (a view, a zero-stride or an overlapping tensor)")
            self.claimed.add(index)
        flat = self._flat(index, device, dtype, start, count)
        return flat.as_strided(shape, stride, offset)

    def _flat(self, index, device, dtype, start, count) -> torch.Tensor:
        if index not in self.built:
            itemsize = torch.empty(0, dtype=dtype).element_size()
            raw = bytearray(memoryview(self.blob)[start : start + count * itemsize])  # one copy, not two
            if dtype == torch.bool:  # a bool is 0 or 1; build it from the bytes rather than trust them
                flat = torch.frombuffer(raw, dtype=torch.uint8) != 0 if raw else torch.empty(0, dtype=dtype)
            else:
                flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
            self.built[index] = flat.to(device)
        return self.built[index]

    def _object(self, value, depth: int):
        name, fields = value.get("object"), value.get("fields")
        if set(value) != {"object", "fields"} or not isinstance(name, str) or not isinstance(fields, dict):
            raise WireError("an object must give its class name and fields")
        cls = self.resolve(name)
        if cls is None or not dataclasses.is_dataclass(cls):
            raise WireError(f"not a class this channel sends: {name[:80]!r}")
        expected = {f.name for f in dataclasses.fields(cls)}
        if set(fields) != expected:
            raise WireError(f"{name}'s fields differ from the class's")
        obj = object.__new__(cls)
        for key, item in fields.items():
            object.__setattr__(obj, key, self.decode(item, depth + 1))
        return obj


def tensor_specs(value, depth: int = 0) -> list[tuple]:
    """(dtype, shape) of each tensor a value's header names, in the order `decode` builds them (and
    course.core.blockread.tensors_in finds them), without building any: an object's fields are not
    searched, as tensors_in does not. Anything malformed is given as ("?", "?")."""
    if depth > MAX_DEPTH or not isinstance(value, dict):
        return []
    if "tensor" in value:
        spec = value["tensor"] if isinstance(value["tensor"], dict) else {}
        dtype, shape = spec.get("dtype"), spec.get("shape")
        return [(dtype, shape) if isinstance(dtype, str) and isinstance(shape, list) else ("?", "?")]
    items = value.get("list", value.get("tuple"))
    if isinstance(items, list):
        return [found for item in items for found in tensor_specs(item, depth + 1)]
    pairs = value.get("dict")
    if isinstance(pairs, list):
        return [found for pair in pairs if isinstance(pair, list) and len(pair) == 2
                for found in tensor_specs(pair[1], depth + 1)]
    return []


def contiguous_strides(shape: list[int]) -> list[int]:
    """The strides of a row-major tensor of this shape, as torch gives a fresh one."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------ frames

def read_frame(fd: int, limits: WireLimits = WireLimits(), deadline: float | None = None,
               tick: Callable[[], None] = lambda: None) -> tuple[dict, bytes]:
    """One frame from fd: (header, blob). Raises WireError on a malformed frame, EOFError when the
    sender closed, TimeoutError past `deadline` (time.monotonic()); calls tick() about 4 times a
    second while it waits (the grader checks the child's limits there)."""
    prefix = _read_exactly(fd, PREFIX.size, deadline, tick)
    magic, header_size, blob_size = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise WireError("not a frame (bad magic)")
    if header_size > limits.header_bytes or blob_size > limits.blob_bytes:
        raise WireError(f"a frame over the size limit ({header_size + blob_size} bytes)")
    raw = _read_exactly(fd, header_size, deadline, tick)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise WireError(f"an unreadable header: {str(error)[:100]}") from None
    if not isinstance(header, dict):
        raise WireError("a header must be an object")
    return header, _read_exactly(fd, blob_size, deadline, tick)


def _read_exactly(fd: int, size: int, deadline: float | None, tick: Callable[[], None]) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(wait, 0.25))
            tick()
            if not ready:
                continue
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
