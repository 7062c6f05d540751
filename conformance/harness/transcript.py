"""What a rank sends to the judge: plain data in length-prefixed frames.

The judge runs in a process where no code of the implementation under test
was ever imported, so what an implementation returned travels as plain data:
tensors as bytes with dtype, shape, strides and device; numpy arrays and
scalars as themselves; lists, tuples and dicts as themselves; any other
object as its type's name and its fields. Decoding rebuilds shardspec's own
data-model classes and, for any other type, a stand-in class of the same
name, so checkers see the same container types, dtypes and type names.

Frames are read with an unpickler that resolves only the classes listed
here: a stream cannot make the judge import or run anything else. What
cannot cross (a value whose encoding fails, a numpy array of objects or
of a subclass, an int or str subclass) is sent as :class:`Unsendable`,
saying what it is; decoding it, or data the judge does not rebuild (a
tensor of another dtype), raises :class:`DecodeError` naming where in the
value it lies. A frame the judge's unpickler refuses is read as
``{"unreadable": why}`` and the frames after it are still read.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
import struct
from collections import namedtuple
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import torch

from shardspec.conformance.record import NUMPY_CARRIER
from shardspec.spec.errors import PreconditionError

# Dtypes numpy cannot hold: sent as same-size integers, rebuilt by a view.
_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.complex64,
    )
}
# Classes the judge rebuilds as themselves (everything else becomes a stand-in): the data model, and the
# spec's own types an input may carry (e.g. an engine's InputBatch subclass built by a case).
_OWN_PACKAGES = ("shardspec.spec.", "shardspec.conformance.record")


@dataclass
class TensorData:
    dtype: str
    shape: tuple
    stride: tuple
    storage_offset: int
    device: str
    values: np.ndarray  # contiguous, in the carrier dtype where numpy lacks the dtype


@dataclass
class ObjectData:
    module: str
    qualname: str
    kind: str  # dataclass | namedtuple | object
    fields: dict


@dataclass
class ErrorData:
    module: str
    qualname: str
    message: str
    attrs: dict


@dataclass(frozen=True)
class Unsendable:
    """A value that cannot cross to the judge, and why."""

    why: str


class DecodeError(ValueError):
    """Part of a transcript the judge cannot rebuild: ``path`` (e.g. ``.num_nans[2]``) says where in it."""

    def __init__(self, why: str, path: str = ""):
        super().__init__(f"{path.lstrip('.')}: {why}" if path else why)
        self.why, self.path = why, path

    def within(self, key) -> DecodeError:
        step = f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
        return DecodeError(self.why, step + self.path)


def encode(value: Any) -> Any:
    """Plain data for ``value`` (recursively); what cannot be encoded becomes an :class:`Unsendable`."""
    try:
        return _encode(value)
    except Exception as exc:
        return Unsendable(f"a {type(value).__qualname__} that could not be encoded ({type(exc).__name__}: {exc})")


def _encode(value: Any) -> Any:
    if value is None or type(value) in (bool, int, float, str, bytes) or isinstance(value, np.generic):
        return value
    if isinstance(value, np.ndarray):
        return _encode_array(value)
    if isinstance(value, (int, float, str, bytes)):  # subclasses: pickled by reference to their class
        return Unsendable(f"a {type(value).__qualname__} (a subclass of {type(value).__mro__[1].__name__})")
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value)
    if isinstance(value, BaseException):
        attrs = {k: encode(v) for k, v in vars(value).items() if isinstance(v, (str, int, float, bool, type(None)))}
        return ErrorData(type(value).__module__, type(value).__qualname__, str(value), attrs)
    cls = type(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        fields = {name: encode(getattr(value, name)) for name in value._fields}
        return ObjectData(cls.__module__, cls.__qualname__, "namedtuple", fields)
    if isinstance(value, (list, tuple)):
        return cls(encode(v) for v in value) if cls in (list, tuple) else list(encode(v) for v in value)
    if isinstance(value, dict):
        return {_encode_key(k): encode(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return ObjectData(cls.__module__, cls.__qualname__, "dataclass", fields)
    fields = {k: encode(v) for k, v in vars(value).items()} if hasattr(value, "__dict__") else {}
    return ObjectData(cls.__module__, cls.__qualname__, "object", fields)


def _encode_array(a: np.ndarray) -> np.ndarray | Unsendable:
    if type(a) is not np.ndarray:
        return Unsendable(f"a {type(a).__module__}.{type(a).__qualname__} (a subclass of numpy.ndarray)")
    if a.dtype.hasobject:
        return Unsendable(f"a numpy array of dtype {a.dtype} (Python objects, which the judge never loads)")
    return a.copy()


def _encode_key(key: Any) -> Any:
    encoded = encode(key)
    return encoded if isinstance(encoded, (str, int, float, bool, bytes, Unsendable, type(None))) else repr(key)


def _encode_tensor(t: torch.Tensor) -> TensorData:
    data = t.detach()
    carrier = data.contiguous().cpu()
    if carrier.dtype in NUMPY_CARRIER:
        carrier = carrier.view(NUMPY_CARRIER[carrier.dtype])
    return TensorData(
        str(t.dtype).removeprefix("torch."),
        tuple(t.shape),
        tuple(t.stride()),
        t.storage_offset(),
        str(t.device),
        carrier.numpy().copy(),
    )


def decode(value: Any, device: str | torch.device | None = None) -> Any:
    """The inverse of :func:`encode`; tensors land on ``device`` (default: where they were, when possible).
    Raises :class:`DecodeError` for what the judge cannot rebuild."""
    if device is not None and not isinstance(device, str):
        device = str(torch.device(device))  # a rank passes its torch.device; the targets below compare text
    if isinstance(value, Unsendable):
        raise DecodeError(value.why)
    if isinstance(value, TensorData):
        return _decode_tensor(value, device)
    if isinstance(value, ErrorData):
        return _decode_error(value)
    if isinstance(value, ObjectData):
        return _decode_object(value, device)
    if isinstance(value, (list, tuple)):
        return type(value)(_decode_child(i, v, device) for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _decode_child(k, v, device) for k, v in value.items()}
    return value


def _decode_child(key, value: Any, device: str | None) -> Any:
    try:
        return decode(value, device)
    except DecodeError as exc:
        raise exc.within(key) from None
    except Exception as exc:
        raise DecodeError(f"{type(exc).__name__}: {exc}").within(key) from exc


def _decode_tensor(data: TensorData, device: str | None) -> torch.Tensor:
    dtype = _DTYPES.get(data.dtype)
    if dtype is None:
        raise DecodeError(f"a tensor of dtype {data.dtype}, which the judge does not rebuild")
    t = torch.from_numpy(data.values.copy()).reshape(data.shape)
    if dtype in NUMPY_CARRIER:
        t = t.view(dtype)
    # Device tensors land on the judge's device; a host tensor stays on the host, where the spec may
    # require it (seq_lens_cpu_upper_bound) or forbid it (a device field handed back on the CPU).
    target = data.device if data.device == "cpu" else (device or data.device)
    if target.startswith("cuda") and not torch.cuda.is_available():
        target = "cpu"
    return _with_strides(t.to(target), tuple(data.stride))


def _with_strides(t: torch.Tensor, stride: tuple) -> torch.Tensor:
    """``t`` laid out with the rank's strides, so that checks of a result's layout see what the
    implementation returned; a layout no fresh tensor can have (overlapping, negative) stays contiguous."""
    if tuple(t.stride()) == stride or t.numel() == 0 or len(stride) != t.dim() or min(stride, default=0) < 0:
        return t
    try:
        laid_out = torch.empty_strided(tuple(t.shape), stride, dtype=t.dtype, device=t.device)
        return laid_out.copy_(t)
    except RuntimeError:  # elements that share memory (stride 0): the values are what matters
        return t


def _decode_object(data: ObjectData, device: str | None) -> Any:
    fields = {k: _decode_child(k, v, device) for k, v in data.fields.items()}
    own = _own_class(data.module, data.qualname)
    if own is not None and data.kind in ("dataclass", "namedtuple"):
        return own(**fields)
    stand_in = _stand_in(data.qualname, data.kind, tuple(fields))
    if data.kind == "namedtuple":
        return stand_in(**fields)
    obj = stand_in.__new__(stand_in)
    vars(obj).update(fields)
    return obj


def _decode_error(data: ErrorData) -> BaseException:
    own = _own_class(data.module, data.qualname)
    base = own if isinstance(own, type) and issubclass(own, BaseException) else None
    cls = base or type(data.qualname.rsplit(".", 1)[-1], (ReportedError,), {"__module__": data.module})
    exc = cls.__new__(cls)
    exc.args = (data.message,)
    vars(exc).update({k: _decode_child(k, v, None) for k, v in data.attrs.items()})
    if base is PreconditionError and "precondition_id" not in data.attrs:
        exc.precondition_id = None
    return exc


class ReportedError(Exception):
    """An exception of a type the judge does not import: same name, message and attributes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_STAND_INS: dict[tuple, type] = {}


def _stand_in(qualname: str, kind: str, field_names: tuple) -> type:
    """A class named like the implementation's own type, holding its fields."""
    key = (qualname, kind, field_names)
    if key not in _STAND_INS:
        name = qualname.rsplit(".", 1)[-1]
        if kind == "namedtuple":
            _STAND_INS[key] = namedtuple(name, field_names)
        else:
            _STAND_INS[key] = type(name, (), {"__repr__": lambda self: f"{name}({vars(self)})"})
    return _STAND_INS[key]


def _own_class(module: str, qualname: str):
    if not module.startswith(_OWN_PACKAGES):
        return None
    return getattr(importlib.import_module(module), qualname, None)


# -- framing -----------------------------------------------------------------

_HEADER = struct.Struct("<Q")
_ALLOWED = (
    {
        ("builtins", name)
        for name in (
            "list",
            "tuple",
            "dict",
            "set",
            "frozenset",
            "int",
            "float",
            "str",
            "bytes",
            "bool",
            "complex",
            "slice",
        )
    }
    | {(__name__, name) for name in ("TensorData", "ObjectData", "ErrorData", "Unsendable")}
    | {
        (module, name)
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    }
    | {("numpy", "ndarray"), ("numpy", "dtype")}
    | {(module, name) for module in ("numpy", "numpy.dtypes") for name in dir(np.dtypes) if name.endswith("DType")}
)


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"a rank's transcript refers to {module}.{name}, which the judge never loads")
        return super().find_class(module, name)


def write_frame(stream: BinaryIO, record: dict) -> None:
    payload = pickle.dumps(record, protocol=4)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def read_frames(data: bytes) -> tuple[list[dict], int]:
    """The complete frames at the start of ``data`` and how many bytes they take (a frame may be half-written).
    A frame the restricted unpickler refuses is ``{"unreadable": why}``; the next frames are read on."""
    frames, offset = [], 0
    while offset + _HEADER.size <= len(data):
        (length,) = _HEADER.unpack_from(data, offset)
        end = offset + _HEADER.size + length
        if end > len(data):
            break
        try:
            frames.append(_RestrictedUnpickler(io.BytesIO(data[offset + _HEADER.size : end])).load())
        except Exception as exc:
            frames.append({"unreadable": f"a frame of {length} bytes could not be read ({exc})"})
        offset = end
    return frames, offset


def cut_frame(data: bytes) -> str | None:
    """What is left of a transcript after its last complete frame, when the rank wrote no more (None: nothing)."""
    if not data:
        return None
    if len(data) < _HEADER.size:
        return f"its last frame ends inside its {_HEADER.size}-byte header ({len(data)} bytes)"
    (length,) = _HEADER.unpack_from(data, 0)
    return f"its last frame ends after {len(data) - _HEADER.size} of {length} bytes"
