"""Layout: a (partial) shape, an element type and a memory format (the GPU plugin's `cldnn::layout`).

A dim is an int when known and None when unknown (a `dim_param` or an empty dim in the
ONNX graph). At run time every layout the engine executes with is static.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from onnx import TensorProto

# Element types the engine executes: name -> (numpy dtype, OpenCL C type)
DTYPES = {
    "f32": (np.dtype(np.float32), "float"),
    "i64": (np.dtype(np.int64), "long"),
    "i32": (np.dtype(np.int32), "int"),
    "bool": (np.dtype(np.bool_), "uchar"),
    # the integer types ONNX's node tests use; f64 needs cl_khr_fp64 (a build error names it)
    "i8": (np.dtype(np.int8), "char"),
    "u8": (np.dtype(np.uint8), "uchar"),
    "i16": (np.dtype(np.int16), "short"),
    "u16": (np.dtype(np.uint16), "ushort"),
    "u32": (np.dtype(np.uint32), "uint"),
    "u64": (np.dtype(np.uint64), "ulong"),
    "f64": (np.dtype(np.float64), "double"),
    # stored as half, computed as float (engine/f16.py): "half" is only ever a pointer type
    "f16": (np.dtype(np.float16), "half"),
}
_FROM_ONNX = {TensorProto.FLOAT: "f32", TensorProto.INT64: "i64", TensorProto.INT32: "i32",
              TensorProto.BOOL: "bool", TensorProto.INT8: "i8", TensorProto.UINT8: "u8",
              TensorProto.INT16: "i16", TensorProto.UINT16: "u16", TensorProto.UINT32: "u32",
              TensorProto.UINT64: "u64", TensorProto.DOUBLE: "f64",
              TensorProto.FLOAT16: "f16"}
_FROM_NUMPY = {v[0]: k for k, v in DTYPES.items()}


def dtype_from_onnx(elem_type: int) -> str | None:
    """Our dtype name for an ONNX TensorProto element type; None when unsupported."""
    return _FROM_ONNX.get(elem_type)


def dtype_from_numpy(dt) -> str:
    dt = np.dtype(dt)
    if dt not in _FROM_NUMPY:
        raise TypeError(f"unsupported element type {dt}")
    return _FROM_NUMPY[dt]


def np_dtype(dtype: str) -> np.dtype:
    return DTYPES[dtype][0]


def cl_type(dtype: str) -> str:
    return DTYPES[dtype][1]


def type_jit(name: str, dtype: str) -> tuple:
    """JIT constants of one tensor type slot `name`: name (storage type), name_C (compute
    type), LOAD_name(p, i) and STORE_name(p, i, v)."""
    if dtype == "f16":
        return ((name, "half"), (f"{name}_C", "float"),
                (f"LOAD_{name}(p, i)", "LOAD_HALF(p, i)"),
                (f"STORE_{name}(p, i, v)", "STORE_HALF(p, i, v)"))
    t = cl_type(dtype)
    return ((name, t), (f"{name}_C", t), (f"LOAD_{name}(p, i)", "((p)[i])"),
            (f"STORE_{name}(p, i, v)", f"((p)[i] = ({t})(v))"))


def bits_type(dtype: str) -> str:
    """Element type for kernels that only move data (copies, gathers): f16 as its 16 bits."""
    return "ushort" if dtype == "f16" else cl_type(dtype)


@dataclass(frozen=True)
class Layout:
    shape: tuple  # of int | None
    dtype: str = "f32"
    format: str = "bfyx"
    # Padded layouts (the KV cache's preallocated sequence axis): the dims of the buffer region
    # the tensor lives in, of which `shape` is the leading corner. None: dense. Only ops marked
    # `padded_ok` ever see one.
    pad: tuple | None = None

    def __hash__(self) -> int:
        # kept once computed: layouts key the memo tables of every node's flow (engine/memo.py),
        # tens of hashes per node when a decode step brings new shapes
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.shape, self.dtype, self.format, self.pad))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other) -> bool:
        # the flow compares every node's input layouts on every inference: identity first
        # (layers share their class's layout objects), then hashes already kept, then the fields
        if self is other:
            return True
        if other.__class__ is not Layout:
            return NotImplemented
        h, g = self.__dict__.get("_hash"), other.__dict__.get("_hash")
        if h is not None and g is not None and h != g:
            return False
        return self.shape == other.shape and self.dtype == other.dtype and self.format == other.format \
            and self.pad == other.pad

    def __getstate__(self) -> dict:   # a string's hash differs from one process to the next
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @property
    def phys(self) -> tuple:
        return self.pad or self.shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    # cached: the flow asks for these on every node of every inference (frozen dataclass:
    # cached_property writes the instance dict directly, equality and hash keep to the fields)
    @cached_property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return np_dtype(self.dtype).itemsize

    @cached_property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def __str__(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape) or "scalar"
        return f"{dims}:{self.dtype}" + (f" (in {shape_str(self.pad)})" if self.pad else "")


def shape_str(shape) -> str:
    return "x".join("?" if d is None else str(d) for d in shape) or "scalar"
