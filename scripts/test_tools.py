#!/usr/bin/python3
"""Self-check of scripts/gguflib.py, scripts/mkmodel and scripts/reference.

Run by hand: /usr/bin/python3 scripts/test_tools.py  (stdlib + numpy only).
Checks that need ../shared (LLMSERVE_SHARED or <source>/../shared) are skipped
when it is absent.
"""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, SCRIPTS)
import gguflib as gg  # noqa: E402

PY = "/usr/bin/python3"
MKMODEL = os.path.join(SCRIPTS, "mkmodel")
REFERENCE = os.path.join(SCRIPTS, "reference")
SHARED = os.environ.get("LLMSERVE_SHARED", os.path.join(SCRIPTS, "..", "..", "shared"))
STORIES = os.path.join(SHARED, "models", "stories260K.gguf")
SPM_VOCAB = os.path.join(SHARED, "models", "vocab", "ggml-vocab-llama-spm.gguf")
STORIES_GREEDY_31 = ("403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 "
                     "267 337 410 408 419 292 411 322 265 282 295 433 426")


def load_script(name):
    loader = importlib.machinery.SourceFileLoader(name, os.path.join(SCRIPTS, name))
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def copy_gguf(src_path, dst_path):
    """Reader -> Writer copy of every kv and tensor."""
    r = gg.Reader(src_path)
    w = gg.Writer(dst_path)
    for k, (t, v) in r.kv.items():
        w.add_kv(k, t, v)
    for t in r.tensors.values():
        w.add_tensor_info(t.name, t.ne, t.ggml_type)
    w.write_header()
    for t in r.tensors.values():
        w.write_tensor(t.name, r.raw(t.name))
    w.close()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def run(*args):
    return subprocess.run([PY, *args], check=True, capture_output=True, text=True).stdout


class TestGGUFLib(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_every_value_type_round_trips_byte_exact(self):
        path = os.path.join(self.dir, "a.gguf")
        w = gg.Writer(path, alignment=64)
        w.add_kv("general.alignment", gg.TYPE_U32, 64)
        w.add_kv("u8", gg.TYPE_U8, 255)
        w.add_kv("i8", gg.TYPE_I8, -128)
        w.add_kv("u16", gg.TYPE_U16, 65535)
        w.add_kv("i16", gg.TYPE_I16, -32768)
        w.add_kv("u32", gg.TYPE_U32, 4294967295)
        w.add_kv("i32", gg.TYPE_I32, -2147483648)
        w.add_kv("f32", gg.TYPE_F32, 0.1)
        w.add_kv("bool", gg.TYPE_BOOL, True)
        w.add_kv("str", gg.TYPE_STRING, "h\u00e9llo \u2581 \U0001F600")
        w.add_kv("bad_utf8", gg.TYPE_STRING, b"\xff\xfe".decode("utf-8", "surrogateescape"))
        w.add_kv("u64", gg.TYPE_U64, 2**64 - 1)
        w.add_kv("i64", gg.TYPE_I64, -2**63)
        w.add_kv("f64", gg.TYPE_F64, 1e300)
        w.add_array("arr_f32", gg.TYPE_F32, np.array([1.5, -2.0], dtype=np.float32))
        w.add_array("arr_i32", gg.TYPE_I32, [1, -2, 3])
        w.add_array("arr_bool", gg.TYPE_BOOL, [True, False])
        w.add_array("arr_str", gg.TYPE_STRING, ["a", "", "\u2581b"])
        w.add_array("arr_nested", gg.TYPE_ARRAY, [(gg.TYPE_U8, [1, 2]), (gg.TYPE_STRING, ["x"])])
        w.add_array("arr_empty", gg.TYPE_U32, [])
        a32 = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
        w.add_tensor_info("f32", [4, 3], gg.GGML_TYPE_F32)
        w.add_tensor_info("f16", [4, 3], gg.GGML_TYPE_F16)
        w.add_tensor_info("bf16", [4, 3], gg.GGML_TYPE_BF16)
        w.add_tensor_info("q8_0", [32, 2], gg.GGML_TYPE_Q8_0)
        w.add_tensor_info("vec", [5], gg.GGML_TYPE_F32)
        w.write_header()
        w.write_tensor("f32", gg.encode_tensor(a32, gg.GGML_TYPE_F32))
        w.write_tensor("f16", gg.encode_tensor(a32, gg.GGML_TYPE_F16))
        w.write_tensor("bf16", gg.encode_tensor(a32, gg.GGML_TYPE_BF16))
        q = np.zeros((2, 34), dtype=np.uint8)
        q[:, :2] = np.array([0.5, 2.0], dtype="<f2").view(np.uint8).reshape(2, 2)
        q[:, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
        w.write_tensor("q8_0", q.tobytes())
        w.write_tensor("vec", np.ones(5, dtype=np.float32))
        w.close()

        r = gg.Reader(path)
        self.assertEqual(r.version, 3)
        self.assertEqual(r.alignment, 64)
        self.assertEqual(list(r.kv), list(w.kv))
        self.assertEqual(r.get("u64"), 2**64 - 1)
        self.assertEqual(r.get("i8"), -128)
        self.assertAlmostEqual(r.get("f32"), 0.1, places=6)
        self.assertIs(r.get("bool"), True)
        self.assertEqual(r.get("str"), "h\u00e9llo \u2581 \U0001F600")
        self.assertEqual(r.get("arr_str"), ["a", "", "\u2581b"])
        self.assertEqual(r.kv["arr_nested"], (gg.TYPE_ARRAY, (gg.TYPE_ARRAY, [
            (gg.TYPE_U8, r.kv["arr_nested"][1][1][0][1]), (gg.TYPE_STRING, ["x"])])))
        self.assertEqual(list(r.get("arr_bool")), [1, 0])
        self.assertEqual(r.tensors["f32"].shape, (3, 4))
        self.assertTrue(all(t.offset % 64 == 0 for t in r.tensors.values()))
        self.assertEqual(r.data_offset % 64, 0)
        np.testing.assert_array_equal(r.tensor("f32"), a32)
        np.testing.assert_allclose(r.tensor("f16"), a32, rtol=1e-3)
        np.testing.assert_allclose(r.tensor("bf16"), a32, rtol=1e-2)
        expect_q = np.concatenate([0.5 * np.arange(-16, 16), 2.0 * np.arange(-16, 16)])
        np.testing.assert_array_equal(r.tensor("q8_0").reshape(-1), expect_q)

        path2 = os.path.join(self.dir, "b.gguf")
        copy_gguf(path, path2)
        self.assertEqual(read_bytes(path), read_bytes(path2))

    @unittest.skipUnless(os.path.exists(STORIES), "needs ../shared (GGUF files)")
    def test_files_written_by_llama_cpp_copy_byte_exact(self):
        vocab_dir = os.path.dirname(SPM_VOCAB)
        paths = [STORIES] + [os.path.join(vocab_dir, f) for f in sorted(os.listdir(vocab_dir))
                             if f.endswith(".gguf")]
        for path in paths:
            with self.subTest(path=os.path.basename(path)):
                copy = os.path.join(self.dir, "copy.gguf")
                copy_gguf(path, copy)
                self.assertEqual(read_bytes(path), read_bytes(copy))

    def test_bf16_rounds_to_nearest_even(self):
        bits = np.array([0x3F800000,   # 1.0: exact
                         0x3F808000,   # halfway, even below -> down
                         0x3F818000,   # halfway, odd below -> up
                         0x3F808001,   # above halfway -> up
                         0x3F807FFF,   # below halfway -> down
                         0xBF818000,   # negative, halfway odd -> up in magnitude
                         0x7F7FFFFF],  # FLT_MAX -> inf
                        dtype=np.uint32)
        got = gg.f32_to_bf16(bits.view(np.float32))
        self.assertEqual([hex(x) for x in got],
                         ["0x3f80", "0x3f80", "0x3f82", "0x3f81", "0x3f80", "0xbf82", "0x7f80"])
        self.assertTrue(np.isnan(gg.bf16_to_f32(gg.f32_to_bf16(np.array([np.nan], np.float32))))[0])

    def test_reader_rejects_truncated_and_bad_files(self):
        path = os.path.join(self.dir, "m.gguf")
        run(MKMODEL, "--out", path, "--n-vocab", "300", "--dim", "32", "--ffn", "32")
        data = read_bytes(path)
        bad = os.path.join(self.dir, "bad.gguf")
        for cut in (3, 10, 24, 100, 1000, len(data) - 1):
            with open(bad, "wb") as f:
                f.write(data[:cut])
            with self.assertRaises(gg.GGUFError):
                gg.Reader(bad)
        with open(bad, "wb") as f:
            f.write(b"GGUF" + (99).to_bytes(4, "little") + data[8:])
        with self.assertRaises(gg.GGUFError):
            gg.Reader(bad)


ARCH_CASES = {
    "llama": ["--arch", "llama", "--type", "f32"],
    "llama-f16-tied": ["--arch", "llama", "--type", "f16", "--tied", "--kv-heads", "4"],
    "llama-bf16-extras": ["--arch", "llama", "--type", "bf16", "--rope-freqs", "--rope-dim", "8",
                          "--rope-scaling", "linear", "--rope-factor", "4",
                          "--sliding-window", "16"],
    "qwen2": ["--arch", "qwen2"],
    "qwen3": ["--arch", "qwen3", "--head-dim", "32"],
}


class TestMkmodel(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def make(self, name, args):
        path = os.path.join(self.dir, name + ".gguf")
        run(MKMODEL, "--out", path, "--n-vocab", "300", "--seed", "7", *args)
        return path

    def test_every_arch_has_the_right_keys_and_tensors_and_copies_exactly(self):
        for case, args in ARCH_CASES.items():
            with self.subTest(case=case):
                path = self.make(case, args)
                r = gg.Reader(path)
                arch = r.get("general.architecture")
                a = arch + "."
                hd = r.get(a + "attention.key_length")
                self.assertEqual(r.get_type(a + "attention.layer_norm_rms_epsilon"), gg.TYPE_F32)
                self.assertEqual(r.get_type(a + "block_count"), gg.TYPE_U32)
                self.assertEqual(r.get("general.alignment"), 32)
                self.assertEqual(len(r.get("tokenizer.ggml.tokens")), 300)
                dim = r.get(a + "embedding_length")
                n_head = r.get(a + "attention.head_count")
                n_kv = r.get(a + "attention.head_count_kv")
                t = r.tensors
                self.assertEqual(t["token_embd.weight"].ne, (dim, 300))
                self.assertEqual("output.weight" in t, "--tied" not in args)
                self.assertEqual(t["blk.1.attn_q.weight"].ne, (dim, n_head * hd))
                self.assertEqual(t["blk.1.attn_k.weight"].ne, (dim, n_kv * hd))
                self.assertEqual(t["blk.1.attn_output.weight"].ne, (n_head * hd, dim))
                self.assertEqual(t["blk.0.ffn_down.weight"].ne, (128, dim))
                self.assertEqual("blk.0.attn_q.bias" in t, arch == "qwen2")
                self.assertEqual("blk.0.attn_q_norm.weight" in t, arch == "qwen3")
                self.assertEqual(t["blk.0.attn_norm.weight"].ggml_type, gg.GGML_TYPE_F32)
                if "--rope-freqs" in args:
                    f = r.tensor("rope_freqs.weight")
                    self.assertEqual(f.shape, (4,))
                    self.assertTrue(((f >= 1) & (f <= 8)).all())
                    self.assertEqual(r.get(a + "rope.scaling.type"), "linear")
                    self.assertEqual(r.get(a + "attention.sliding_window"), 16)
                want_type = {"f16": 1, "bf16": 30}.get(args[args.index("--type") + 1]
                                                       if "--type" in args else "f32", 0)
                self.assertEqual(t["blk.0.ffn_up.weight"].ggml_type, want_type)
                copy = os.path.join(self.dir, case + ".copy.gguf")
                copy_gguf(path, copy)
                self.assertEqual(read_bytes(path), read_bytes(copy))

    def test_same_seed_same_file_and_tied_changes_no_other_tensor(self):
        a = self.make("a", [])
        b = self.make("b", [])
        c = self.make("c", ["--tied"])
        self.assertEqual(read_bytes(a), read_bytes(b))
        ra, rc = gg.Reader(a), gg.Reader(c)
        for name in rc.tensors:
            if name == "token_embd.weight":   # same values, classifier scale when tied
                ea, ec = ra.tensor(name), rc.tensor(name)
                np.testing.assert_allclose(ec, ea * (ec[0, 0] / ea[0, 0]), rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(ra.tensor(name), rc.tensor(name))

    def test_synthetic_vocab_pieces_are_reachable_by_bpe(self):
        mk = load_script("mkmodel")
        for n in (260, 261, 300, 512, 4000):
            tokens, scores, types = mk.synthetic_vocab(n)
            self.assertEqual(len(set(tokens)), n)
            self.assertEqual(tokens[:3], ["<unk>", "<s>", "</s>"])
            self.assertEqual(tokens[3 + 0x41], "<0x41>")
            self.assertEqual(types[:4], [2, 3, 3, 6])
            normal = [(t, s) for t, s, ty in zip(tokens, scores, types) if ty == 1]
            singles = {t for t, _ in normal if len(t) == 1}
            rank = {t: -s for t, s in normal if len(t) > 1}
            for piece, _ in normal:
                self.assertTrue(all(ch in singles for ch in piece))
                self.assertEqual(mk.bpe_merge(piece, rank), [piece])

    @unittest.skipUnless(os.path.exists(SPM_VOCAB), "needs ../shared (vocab files)")
    def test_vocab_keys_are_copied_in_order_with_types(self):
        path = os.path.join(self.dir, "v.gguf")
        run(MKMODEL, "--out", path, "--vocab", SPM_VOCAB, "--dim", "32", "--ffn", "32")
        src, dst = gg.Reader(SPM_VOCAB), gg.Reader(path)
        keys = [k for k in src.kv if k.startswith("tokenizer.")]
        self.assertEqual(keys, [k for k in dst.kv if k.startswith("tokenizer.")])
        for k in keys:
            (ts, vs), (td, vd) = src.kv[k], dst.kv[k]
            self.assertEqual(ts, td)
            if ts == gg.TYPE_ARRAY:
                self.assertEqual(vs[0], vd[0])
                self.assertTrue(np.array_equal(np.asarray(vs[1]), np.asarray(vd[1])))
            else:
                self.assertEqual(vs, vd)
        self.assertEqual(dst.tensors["token_embd.weight"].ne[1], len(src.get("tokenizer.ggml.tokens")))


class TestReference(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    @unittest.skipUnless(os.path.exists(STORIES), "needs ../shared (stories260K.gguf)")
    def test_stories260k_greedy_matches_llama2c_and_llamacpp(self):
        out = run(REFERENCE, "--model", STORIES, "--tokens", "1", "--greedy", "31")
        self.assertEqual(out.strip(), STORIES_GREEDY_31)

    def test_batched_equals_incremental_and_sequences_are_independent(self):
        ref = load_script("reference")
        for case, args in ARCH_CASES.items():
            with self.subTest(case=case):
                path = os.path.join(self.dir, case + ".gguf")
                run(MKMODEL, "--out", path, "--n-vocab", "300", "--seed", "3", *args)
                model = ref.Model(path)
                toks = list(np.random.default_rng(0).integers(0, 300, size=24))
                full = model.forward(toks, model.new_cache())
                cache = model.new_cache()
                step = np.concatenate([model.forward(toks[i:i + 5], cache)
                                       for i in range(0, 24, 5)])
                np.testing.assert_allclose(full, step, rtol=1e-9, atol=1e-9)
                # logits vary with the token and the context
                self.assertGreater(len(set(full.argmax(axis=1))), 8)

                out = os.path.join(self.dir, case + ".bin")
                s = ",".join(map(str, toks))
                run(REFERENCE, "--model", path, "--tokens", f"{s};{s[:s.index(',')]}", "--out", out)
                got = np.fromfile(out, "<f4").reshape(-1, 300)
                self.assertEqual(got.shape[0], 25)
                np.testing.assert_allclose(got[:24], full, rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(got[24], full[0], rtol=1e-5, atol=1e-5)

    def test_rope_matches_a_scalar_loop_for_both_layouts(self):
        ref = load_script("reference")
        args = ["--rope-dim", "8", "--rope-freqs", "--rope-scaling", "linear",
                "--rope-factor", "2", "--rope-theta", "500"]
        for arch in ("llama", "qwen2"):
            path = os.path.join(self.dir, arch + ".gguf")
            run(MKMODEL, "--out", path, "--n-vocab", "300", "--arch", arch, *args)
            m = ref.Model(path)
            freqs = m.w("rope_freqs.weight")
            x = np.random.default_rng(1).standard_normal((3, 2, 16))
            pos = np.array([0, 5, 17])
            got = m.rope(x, pos)
            want = x.copy()
            for t in range(3):
                for h in range(2):
                    for i in range(4):
                        theta = (pos[t] / 2.0) * 500.0 ** (-2.0 * i / 8) / freqs[i]
                        j0, j1 = (2 * i, 2 * i + 1) if arch == "llama" else (i, i + 4)
                        a, b = x[t, h, j0], x[t, h, j1]
                        want[t, h, j0] = a * np.cos(theta) - b * np.sin(theta)
                        want[t, h, j1] = a * np.sin(theta) + b * np.cos(theta)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

    def test_sliding_window_only_matters_past_the_window(self):
        ref = load_script("reference")
        paths = {}
        for w in (0, 6):
            paths[w] = os.path.join(self.dir, f"w{w}.gguf")
            run(MKMODEL, "--out", paths[w], "--n-vocab", "300", "--sliding-window", str(w))
        toks = list(range(10, 30))
        ma = ref.Model(paths[0])
        a = ma.forward(toks, ma.new_cache())
        mb = ref.Model(paths[6])
        b = mb.forward(toks, mb.new_cache())
        np.testing.assert_allclose(a[:6], b[:6], rtol=1e-12, atol=1e-12)
        self.assertGreater(np.abs(a[6:] - b[6:]).max(), 1e-3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
