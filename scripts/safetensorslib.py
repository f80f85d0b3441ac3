"""A small safetensors reader and writer for the project's tools (scripts/mklora,
scripts/reference). Standard library + numpy only.

Written from the format's description (github.com/huggingface/safetensors, "Format"):
    u64 N (little-endian), N bytes of JSON header, then the data section.
    The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
    (offsets relative to the data section), plus an optional "__metadata__" object
    of strings. Writers pad the header with spaces to a multiple of 8 bytes.
Only F32, F16 and BF16 tensors are handled (what adapters use).
"""

import json
import struct

import numpy as np

DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _to_bf16_bits(a):
    """float32 -> bfloat16 bits, round to nearest even (NaN kept quiet)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def encode(a, dtype):
    """Bytes of float array a stored as dtype ("F32", "F16", "BF16")."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":
        return _to_bf16_bits(a).astype("<u2").tobytes()
    raise ValueError(dtype)


def decode(raw, dtype, shape):
    """float32 array of the given shape from raw bytes of dtype."""
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError(f"dtype {dtype} not supported")
    return a.reshape(shape).astype(np.float32)


def write(path, tensors, metadata=None):
    """tensors: list of (name, float array, dtype) in file order."""
    header = {}
    blobs = []
    off = 0
    for name, a, dtype in tensors:
        raw = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read(path):
    """{name: float32 array} of every tensor in the file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = decode(data[base + b:base + e], info["dtype"], info["shape"])
    return out
