"""A small GGUF (v2/v3, little-endian) reader and streaming writer.

Written from the GGUF format description, for the project's tools
(scripts/mkmodel, scripts/reference, tests). Standard library + numpy only.

File layout:
    u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
    n_kv x  { string key, u32 value_type, value }
    n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
    zero padding to general.alignment (default 32)
    data section; each tensor at `offset` from its start, padded to the alignment
A string is u64 length + bytes (no NUL); an array is u32 elem_type, u64 count,
elements. ne[0] is the contiguous dimension: numpy shape = tuple(reversed(ne)).

Metadata values are kept as (value_type, value) pairs in file order, so a copy
round-trips exactly: scalars are Python int/float/bool/str, and an array is
(elem_type, values) where values is a numpy array for numeric element types and
a list for strings (and nested arrays).
"""

import mmap
import struct

import numpy as np

try:
    from . import quants  # noqa: F401  (as a package)
except ImportError:
    import os as _os
    import sys as _sys
    _sys.path.insert(0, _os.path.dirname(_os.path.abspath(__file__)))
    import quants  # noqa: E402

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32

# Metadata value types.
TYPE_U8 = 0
TYPE_I8 = 1
TYPE_U16 = 2
TYPE_I16 = 3
TYPE_U32 = 4
TYPE_I32 = 5
TYPE_F32 = 6
TYPE_BOOL = 7
TYPE_STRING = 8
TYPE_ARRAY = 9
TYPE_U64 = 10
TYPE_I64 = 11
TYPE_F64 = 12

# numpy dtype of each fixed-size value type (bool is one byte, 0 or 1).
VALUE_DTYPE = {
    TYPE_U8: np.dtype("<u1"), TYPE_I8: np.dtype("<i1"),
    TYPE_U16: np.dtype("<u2"), TYPE_I16: np.dtype("<i2"),
    TYPE_U32: np.dtype("<u4"), TYPE_I32: np.dtype("<i4"),
    TYPE_F32: np.dtype("<f4"), TYPE_BOOL: np.dtype("<u1"),
    TYPE_U64: np.dtype("<u8"), TYPE_I64: np.dtype("<i8"),
    TYPE_F64: np.dtype("<f8"),
}
VALUE_STRUCT = {
    TYPE_U8: "<B", TYPE_I8: "<b", TYPE_U16: "<H", TYPE_I16: "<h",
    TYPE_U32: "<I", TYPE_I32: "<i", TYPE_F32: "<f", TYPE_BOOL: "<?",
    TYPE_U64: "<Q", TYPE_I64: "<q", TYPE_F64: "<d",
}

# ggml tensor types used here, and (block size in elements, bytes per block)
# for every type a reader may meet, so quantized files can still be listed.
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_Q4_0 = 2
GGML_TYPE_Q8_0 = 8
GGML_TYPE_BF16 = 30

GGML_TYPE_NAME = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
    15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 30: "BF16",
}
GGML_TYPE_SIZE = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 24: (1, 1), 25: (1, 2),
    26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2),
}


class GGUFError(Exception):
    """A malformed or unsupported file."""


def align_up(n, alignment):
    return (n + alignment - 1) // alignment * alignment


def tensor_nbytes(ne, ggml_type):
    """Bytes of a tensor with dimensions ne (ne[0] contiguous) and ggml_type."""
    if ggml_type not in GGML_TYPE_SIZE:
        raise GGUFError(f"unknown ggml type {ggml_type}")
    block, size = GGML_TYPE_SIZE[ggml_type]
    n = 1
    for d in ne:
        n *= int(d)
    if len(ne) > 0 and int(ne[0]) % block != 0:
        raise GGUFError(f"ne[0]={ne[0]} is not a multiple of the block size {block}")
    return n // block * size


# ---------------------------------------------------------------------------
# Conversions

def f32_to_bf16(a):
    """float32 array -> uint16 array of bfloat16 bits, round to nearest even."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)  # stay a (quiet) NaN
    return rounded


def bf16_to_f32(u16):
    """uint16 array of bfloat16 bits -> float32 array."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def dequantize(raw, ne, ggml_type):
    """Bytes of a tensor (numpy uint8 array) -> float32 array of numpy shape reversed(ne)."""
    shape = tuple(int(d) for d in reversed(ne))
    if ggml_type == GGML_TYPE_F32:
        out = raw.view("<f4").astype(np.float32)
    elif ggml_type == GGML_TYPE_F16:
        out = raw.view("<f2").astype(np.float32)
    elif ggml_type == GGML_TYPE_BF16:
        out = bf16_to_f32(raw.view("<u2"))
    elif ggml_type == GGML_TYPE_Q8_0:
        # block_q8_0: f16 scale d, then 32 int8 quants; x = d * q.
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        out = (d * q).reshape(-1)
    elif ggml_type in quants.FORMATS:
        out = quants.dequantize_blocks(raw, ggml_type).astype(np.float32)
    else:
        raise GGUFError(f"cannot convert ggml type {GGML_TYPE_NAME.get(ggml_type, ggml_type)}")
    return out.reshape(shape)


# ---------------------------------------------------------------------------
# Reader

class TensorInfo:
    def __init__(self, name, ne, ggml_type, offset):
        self.name = name
        self.ne = tuple(ne)            # ne[0] contiguous
        self.ggml_type = ggml_type
        self.offset = offset           # relative to the data section
        self.nbytes = tensor_nbytes(ne, ggml_type)

    @property
    def shape(self):
        """numpy shape: reversed ne."""
        return tuple(reversed(self.ne))

    def __repr__(self):
        t = GGML_TYPE_NAME.get(self.ggml_type, self.ggml_type)
        return f"TensorInfo({self.name!r}, ne={list(self.ne)}, {t}, offset={self.offset})"


class Reader:
    """Parses a GGUF file (v2 or v3). The tensor data stays memory-mapped.

    kv:       dict key -> (value_type, value), in file order
    tensors:  dict name -> TensorInfo, in file order
    """

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = memoryview(self._map)
        self._pos = 0
        self._parse()

    # primitive readers, bounds-checked
    def _take(self, n):
        if n < 0 or self._pos + n > len(self._buf):
            raise GGUFError(f"{self.path}: truncated at offset {self._pos} (need {n} bytes)")
        b = self._buf[self._pos:self._pos + n]
        self._pos += n
        return b

    def _scalar(self, vtype):
        fmt = VALUE_STRUCT[vtype]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _string(self):
        n = self._scalar(TYPE_U64)
        return bytes(self._take(n)).decode("utf-8", errors="surrogateescape")

    def _value(self, vtype):
        if vtype == TYPE_STRING:
            return self._string()
        if vtype == TYPE_ARRAY:
            etype = self._scalar(TYPE_U32)
            count = self._scalar(TYPE_U64)
            if etype in VALUE_DTYPE:
                dt = VALUE_DTYPE[etype]
                if count > len(self._buf):
                    raise GGUFError(f"{self.path}: array count {count} too large")
                arr = np.frombuffer(self._take(count * dt.itemsize), dtype=dt).copy()
                return (etype, arr)
            if etype in (TYPE_STRING, TYPE_ARRAY):
                if count > len(self._buf):
                    raise GGUFError(f"{self.path}: array count {count} too large")
                return (etype, [self._value(etype) for _ in range(count)])
            raise GGUFError(f"{self.path}: unknown array element type {etype}")
        if vtype == TYPE_BOOL:
            b = self._scalar(TYPE_U8)
            if b > 1:
                raise GGUFError(f"{self.path}: bool value {b}")
            return bool(b)
        if vtype in VALUE_STRUCT:
            return self._scalar(vtype)
        raise GGUFError(f"{self.path}: unknown value type {vtype}")

    def _parse(self):
        if bytes(self._take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (bad magic)")
        self.version = self._scalar(TYPE_U32)
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors = self._scalar(TYPE_U64)
        n_kv = self._scalar(TYPE_U64)
        if n_tensors > len(self._buf) or n_kv > len(self._buf):
            raise GGUFError(f"{self.path}: implausible counts n_tensors={n_tensors} n_kv={n_kv}")

        self.kv = {}
        for _ in range(n_kv):
            key = self._string()
            vtype = self._scalar(TYPE_U32)
            if key in self.kv:
                raise GGUFError(f"{self.path}: duplicate key {key}")
            self.kv[key] = (vtype, self._value(vtype))

        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if "general.alignment" in self.kv:
            t, a = self.kv["general.alignment"]
            if t != TYPE_U32 or a == 0 or a & (a - 1):
                raise GGUFError(f"{self.path}: bad general.alignment")
            self.alignment = a

        self.tensors = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._scalar(TYPE_U32)
            if n_dims > 4:
                raise GGUFError(f"{self.path}: tensor {name} has {n_dims} dims")
            ne = [self._scalar(TYPE_U64) for _ in range(n_dims)]
            ggml_type = self._scalar(TYPE_U32)
            offset = self._scalar(TYPE_U64)
            if name in self.tensors:
                raise GGUFError(f"{self.path}: duplicate tensor {name}")
            if offset % self.alignment:
                raise GGUFError(f"{self.path}: tensor {name} offset {offset} not aligned")
            self.tensors[name] = TensorInfo(name, ne, ggml_type, offset)

        self.data_offset = align_up(self._pos, self.alignment)
        for t in self.tensors.values():
            if self.data_offset + t.offset + t.nbytes > len(self._buf):
                raise GGUFError(f"{self.path}: tensor {t.name} runs past the end of the file")

    # metadata access
    def get(self, key, default=None):
        """The plain value of a key (an array gives its values), or default."""
        if key not in self.kv:
            return default
        vtype, value = self.kv[key]
        return value[1] if vtype == TYPE_ARRAY else value

    def get_type(self, key):
        return self.kv[key][0]

    # tensor access
    def raw(self, name):
        """The tensor's bytes as a read-only numpy uint8 array (a view of the mapping)."""
        t = self.tensors[name]
        start = self.data_offset + t.offset
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=start)

    def tensor(self, name):
        """The tensor converted to float32, numpy shape reversed(ne)."""
        t = self.tensors[name]
        return dequantize(self.raw(name), t.ne, t.ggml_type)


# ---------------------------------------------------------------------------
# Writer

def _pack_scalar(vtype, value):
    if vtype == TYPE_BOOL:
        return struct.pack("<B", 1 if value else 0)
    return struct.pack(VALUE_STRUCT[vtype], value)


def _pack_string(s):
    b = s.encode("utf-8", errors="surrogateescape") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == TYPE_STRING:
        return _pack_string(value)
    if vtype == TYPE_ARRAY:
        etype, values = value
        head = struct.pack("<IQ", etype, len(values))
        if etype in VALUE_DTYPE:
            dt = VALUE_DTYPE[etype]
            if etype == TYPE_BOOL:
                arr = np.asarray(values, dtype=bool).astype(dt)
            else:
                arr = np.asarray(values).astype(dt, casting="unsafe")
            return head + arr.tobytes()
        if etype in (TYPE_STRING, TYPE_ARRAY):
            return head + b"".join(_pack_value(etype, v) for v in values)
        raise GGUFError(f"unknown array element type {etype}")
    if vtype in VALUE_STRUCT:
        return _pack_scalar(vtype, value)
    raise GGUFError(f"unknown value type {vtype}")


class Writer:
    """Streams a GGUF v3 file: add every kv and tensor info, write_header(),
    then write_tensor() for each tensor in the order the infos were added,
    then close(). Only the current tensor is ever held in memory."""

    def __init__(self, path, alignment=GGUF_DEFAULT_ALIGNMENT):
        self.path = path
        self.alignment = alignment
        self.kv = {}
        self.infos = []          # TensorInfo, in order
        self._names = set()
        self._next_offset = 0
        self._i_write = 0
        self._f = None

    def add_kv(self, key, vtype, value):
        if key in self.kv:
            raise GGUFError(f"duplicate key {key}")
        if key == "general.alignment":
            if vtype != TYPE_U32:
                raise GGUFError("general.alignment must be u32")
            if self.infos:
                raise GGUFError("set general.alignment before adding tensors")
            self.alignment = int(value)
        self.kv[key] = (vtype, value)

    def add_u32(self, key, value):
        self.add_kv(key, TYPE_U32, int(value))

    def add_f32(self, key, value):
        self.add_kv(key, TYPE_F32, float(value))

    def add_bool(self, key, value):
        self.add_kv(key, TYPE_BOOL, bool(value))

    def add_string(self, key, value):
        self.add_kv(key, TYPE_STRING, value)

    def add_array(self, key, elem_type, values):
        self.add_kv(key, TYPE_ARRAY, (elem_type, values))

    def add_tensor_info(self, name, ne, ggml_type):
        """Declares a tensor; ne[0] is the contiguous dimension."""
        if name in self._names:
            raise GGUFError(f"duplicate tensor {name}")
        self._names.add(name)
        info = TensorInfo(name, [int(d) for d in ne], ggml_type, self._next_offset)
        self.infos.append(info)
        self._next_offset = align_up(self._next_offset + info.nbytes, self.alignment)
        return info

    def write_header(self):
        out = bytearray()
        out += GGUF_MAGIC
        out += struct.pack("<IQQ", GGUF_VERSION, len(self.infos), len(self.kv))
        for key, (vtype, value) in self.kv.items():
            out += _pack_string(key)
            out += struct.pack("<I", vtype)
            out += _pack_value(vtype, value)
        for t in self.infos:
            out += _pack_string(t.name)
            out += struct.pack("<I", len(t.ne))
            out += struct.pack(f"<{len(t.ne)}Q", *t.ne)
            out += struct.pack("<IQ", t.ggml_type, t.offset)
        if self.infos:  # a file without tensors (vocab only) ends after the infos
            out += bytes(align_up(len(out), self.alignment) - len(out))
        self._f = open(self.path, "wb")
        self._f.write(out)

    def write_tensor(self, name, data):
        """Writes the next tensor's data: a numpy array (any shape, already in
        the declared type's encoding, e.g. float16 or uint16 bf16 bits) or bytes."""
        if self._f is None:
            raise GGUFError("write_header() first")
        if self._i_write >= len(self.infos):
            raise GGUFError(f"tensor {name} was not declared")
        info = self.infos[self._i_write]
        if info.name != name:
            raise GGUFError(f"expected tensor {info.name}, got {name}")
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
            if data.dtype.byteorder == ">":
                data = data.byteswap().view(data.dtype.newbyteorder("<"))
            n = data.nbytes
        else:
            n = len(data)
        if n != info.nbytes:
            raise GGUFError(f"tensor {name}: {n} bytes, expected {info.nbytes}")
        self._f.write(memoryview(data).cast("B") if isinstance(data, np.ndarray) else data)
        self._f.write(bytes(align_up(n, self.alignment) - n))
        self._i_write += 1

    def close(self):
        if self._f is None:
            raise GGUFError("write_header() first")
        if self._i_write != len(self.infos):
            missing = self.infos[self._i_write].name
            raise GGUFError(f"closed before tensor {missing} was written")
        self._f.close()
        self._f = None


def encode_tensor(a, ggml_type):
    """float array -> numpy array holding the encoding of ggml_type (F32, F16, BF16)."""
    if ggml_type == GGML_TYPE_F32:
        return np.ascontiguousarray(a, dtype="<f4")
    if ggml_type == GGML_TYPE_F16:
        return np.ascontiguousarray(a, dtype="<f4").astype("<f2")
    if ggml_type == GGML_TYPE_BF16:
        return f32_to_bf16(a)
    raise GGUFError(f"cannot encode ggml type {GGML_TYPE_NAME.get(ggml_type, ggml_type)}")
