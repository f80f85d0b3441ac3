"""numpy (de)quantizers of the GGUF block formats: the independent oracle.

Written from the block layouts (ggml-common.h as the GGUF spec describes
them), vectorised over blocks, without looking at engine/quant.c. Used by
gguflib.dequantize() (hence scripts/reference) and by the test vectors below.

  quants.py vectors OUT
      Writes random blocks of every format with their dequantization:
      per format: u32 ggml type, u32 n_blocks, raw blocks, then
      n_blocks * block_size little-endian float32 values. Scale fields are
      finite halves; every other byte is random, so every bit pattern of the
      quants occurs.
"""

import struct
import sys

import numpy as np

QK_K = 256

# ggml type id -> (name, elements per block, bytes per block)
FORMATS = {
    2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110),
    12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210),
}


def _f16(b, off):
    """Half at byte offset off of every block (rows of b) -> float64 column."""
    return b[:, off:off + 2].copy().view("<f2").astype(np.float64)


def _nibbles(qs):
    """[nb, 16] bytes -> [nb, 32]: low nibbles are elements 0..15, high 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)


def _bits32(qh):
    """[nb, 4] bytes -> [nb, 32]: bit i of the little-endian uint32."""
    u = qh.copy().view("<u4").astype(np.uint64)
    return ((u >> np.arange(32, dtype=np.uint64)) & 1).astype(np.int64)


def _q2bits(qs):
    """[nb, 64] bytes -> [nb, 256] 2-bit values: element i is in
    qs[32 * (i // 128) + i % 32] at bit 2 * ((i % 128) // 32)."""
    nb = qs.shape[0]
    q = qs.reshape(nb, 2, 1, 32).astype(np.int64)
    shifts = np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)
    return ((q >> shifts) & 3).reshape(nb, 256)


def _k4_scales(s):
    """[nb, 12] packed q4_K/q5_K scales -> (sc [nb, 8], m [nb, 8])."""
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    m = np.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    m[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    m[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, m


def dequantize_blocks(raw, ggml_type):
    """uint8 array of whole blocks -> float64 array of their elements."""
    _, bs, ts = FORMATS[ggml_type]
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, ts)
    nb = b.shape[0]
    if ggml_type == 2:    # q4_0: d, qs[16]
        x = _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8)
    elif ggml_type == 3:  # q4_1: d, m, qs[16]
        x = _f16(b, 0) * _nibbles(b[:, 4:20]) + _f16(b, 2)
    elif ggml_type == 6:  # q5_0: d, qh[4], qs[16]
        q = _nibbles(b[:, 6:22]) | (_bits32(b[:, 2:6]) << 4)
        x = _f16(b, 0) * (q - 16)
    elif ggml_type == 7:  # q5_1: d, m, qh[4], qs[16]
        q = _nibbles(b[:, 8:24]) | (_bits32(b[:, 4:8]) << 4)
        x = _f16(b, 0) * q + _f16(b, 2)
    elif ggml_type == 8:  # q8_0: d, qs[32]
        x = _f16(b, 0) * b[:, 2:34].view(np.int8).astype(np.int64)
    elif ggml_type == 10:  # q2_K: scales[16], qs[64], d, dmin
        sc = b[:, 0:16].astype(np.int64)
        q = _q2bits(b[:, 16:80])
        scale = np.repeat(sc & 15, 16, axis=1)
        mn = np.repeat(sc >> 4, 16, axis=1)
        x = _f16(b, 80) * scale * q - _f16(b, 82) * mn
    elif ggml_type == 11:  # q3_K: hmask[32], qs[64], scales[12], d
        hm = b[:, 0:32].astype(np.int64)
        hbit = (hm[:, None, :] >> np.arange(8).reshape(1, 8, 1)) & 1  # [nb, i // 32, i % 32]
        q = _q2bits(b[:, 32:96]) | (hbit.reshape(nb, 256) << 2)
        s = b[:, 96:108].astype(np.int64)
        j = np.arange(16)
        lo = (s[:, j % 8] >> (4 * (j // 8))) & 15
        hi = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        scale = np.repeat((lo | (hi << 4)) - 32, 16, axis=1)
        x = _f16(b, 108) * scale * (q - 4)
    elif ggml_type in (12, 13):  # q4_K / q5_K: d, dmin, scales[12], (qh[32],) qs[128]
        sc, m = _k4_scales(b[:, 4:16])
        qs_off = 16 if ggml_type == 12 else 48
        qs = b[:, qs_off:qs_off + 128].reshape(nb, 4, 32).astype(np.int64)
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(nb, 256)  # sub-block j = 2 * (j // 2) + nib
        if ggml_type == 13:
            qh = b[:, 16:48].astype(np.int64)
            hbit = (qh[:, None, :] >> np.arange(8).reshape(1, 8, 1)) & 1
            q = q | (hbit.reshape(nb, 256) << 4)
        x = _f16(b, 0) * np.repeat(sc, 32, axis=1) * q - _f16(b, 2) * np.repeat(m, 32, axis=1)
    elif ggml_type == 14:  # q6_K: ql[128], qh[64], scales[16] (int8), d
        ql = b[:, 0:128].reshape(nb, 2, 2, 32).astype(np.int64)  # [half, +32, l]
        qh = b[:, 128:192].reshape(nb, 2, 1, 32).astype(np.int64)
        low = np.stack([ql[:, :, 0] & 15, ql[:, :, 1] & 15, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4],
                       axis=2)  # [nb, half, c, l]
        high = (qh >> (2 * np.arange(4)).reshape(1, 1, 4, 1)) & 3
        q = (low | (high << 4)).reshape(nb, 256) - 32
        sc = b[:, 192:208].view(np.int8).astype(np.int64)
        x = _f16(b, 208) * np.repeat(sc, 16, axis=1) * q
    else:
        raise ValueError(f"no dequantizer for ggml type {ggml_type}")
    return x.reshape(nb * bs)


def random_blocks(ggml_type, n_blocks, rng):
    """Random blocks whose half-precision scale fields hold finite values."""
    _, _, ts = FORMATS[ggml_type]
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    halves = {2: [0], 3: [0, 2], 6: [0], 7: [0, 2], 8: [0], 10: [80, 82], 11: [108],
              12: [0, 2], 13: [0, 2], 14: [208]}[ggml_type]
    for off in halves:
        v = rng.uniform(-0.1, 0.1, size=n_blocks).astype(np.float16)
        if ggml_type in (10, 12, 13):  # d, dmin of the asymmetric K-quants are >= 0
            v = np.abs(v)
        b[:, off:off + 2] = v.view(np.uint8).reshape(n_blocks, 2)
    return b.reshape(-1)


def write_vectors(path, n_blocks=64, seed=6):
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for t in sorted(FORMATS):
            raw = random_blocks(t, n_blocks, rng)
            x = dequantize_blocks(raw, t).astype("<f4")
            f.write(struct.pack("<II", t, n_blocks))
            f.write(raw.tobytes())
            f.write(x.tobytes())


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "vectors":
        sys.exit("usage: quants.py vectors OUT")
    write_vectors(sys.argv[2])
