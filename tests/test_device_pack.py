"""benchmarks/gpu/device_pack.py: the byte-plane packing of the device carry's MiniLM copy is lossless
(the unpacked fp32 checkpoint is exactly what device_prep.sh's dequant.py rebuilds)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import load_benchmark


def test_pack_then_unpack_gives_the_dequantised_weights(tmp_path):
    from safetensors.numpy import load_file, save_file

    pack = load_benchmark("gpu.device_pack")
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(50, 8)).astype(np.float32)
    scale = (np.abs(emb).max(1, keepdims=True) / 127).astype(np.float16)
    q = {"embeddings.word_embeddings.weight.int8": np.round(emb / scale.astype(np.float32)).astype(np.int8),
         "embeddings.word_embeddings.weight.scale": scale,
         "encoder.layer.0.attention.self.query.weight": rng.normal(size=(8, 8)).astype(np.float16),
         "encoder.layer.0.attention.self.query.bias": rng.normal(size=(8,)).astype(np.float16)}
    src, packed, out = tmp_path / "src", tmp_path / "packed", tmp_path / "out"
    src.mkdir()
    save_file(q, str(src / "model.q.safetensors"))
    (src / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    pack.pack(src, packed)
    assert not (packed / "model.q.safetensors").exists() and (packed / "vocab.txt").exists()
    pack.unpack(packed, out)
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == {"embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight",
                        "encoder.layer.0.attention.self.query.bias"}
    assert all(v.dtype == np.float32 for v in got.values())
    want = q["embeddings.word_embeddings.weight.int8"].astype(np.float32) * scale.astype(np.float32)
    assert np.array_equal(got["embeddings.word_embeddings.weight"], want)
    for k in ("encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.query.bias"):
        assert np.array_equal(got[k], q[k].astype(np.float32))
    # a plane cut short is not silently padded
    (packed / "model.lo.xz").write_bytes(__import__("lzma").compress(b"\0" * 10))
    with pytest.raises(ValueError):
        pack.unpack(packed, tmp_path / "bad")
