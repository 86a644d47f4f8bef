"""Pack the MiniLM copy that ``../shared/tools/device_prep.sh`` makes (``model.q.safetensors``:
fp16 weights, word embeddings as int8 rows with fp16 scales) into byte planes compressed with xz,
for a device call whose working tree must stay under 64 MiB; unpack it there to a loadable fp32
checkpoint. Lossless with respect to that copy: the unpacked weights are exactly
``device_prep.sh``'s ``dequant.py`` output.

    python benchmarks/gpu/device_pack.py pack .devcarry/minilm .lacarry/minilm      # here
    python3 benchmarks/gpu/device_pack.py unpack .lacarry/minilm /tmp/minilm        # on the device

Run by path (it imports nothing of ``benchmarks``): the device scripts of the gpu and length
questions (``benchmarks/gpu/gpu_device.sh``, ``benchmarks/length/length_adaptive_device.sh``) call it so.

An fp16 tensor's high bytes (sign, exponent, top mantissa bits) are far more repetitive than its
low bytes; compressing the two planes apart takes the copy from 34.5 MB (30.8 MB as one xz stream)
to 29.8 MB. Needs numpy and safetensors (both in the device image), nothing of archsearch.
"""

from __future__ import annotations

import json
import lzma
import shutil
import sys
from pathlib import Path

PLANES = ("hi", "lo", "raw")  # fp16 high bytes, fp16 low bytes, every other tensor's bytes


def pack(src: Path, dst: Path) -> None:
    """``src``: device_prep.sh's minilm directory -> ``dst`` (tokenizer files copied,
    ``model.planes.json`` + ``model.{hi,lo,raw}.xz``)."""
    import numpy as np
    from safetensors.numpy import load_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.q.safetensors"))
    index, planes = [], {p: [] for p in PLANES}
    for name in sorted(tensors):
        v = np.ascontiguousarray(tensors[name])
        index.append({"name": name, "dtype": str(v.dtype), "shape": list(v.shape)})
        if v.dtype == np.float16:
            b = v.view(np.uint8).reshape(-1, 2)  # little-endian: column 0 low, column 1 high
            planes["lo"].append(b[:, 0].tobytes())
            planes["hi"].append(b[:, 1].tobytes())
        else:
            planes["raw"].append(v.tobytes())
    for p in PLANES:
        (dst / f"model.{p}.xz").write_bytes(lzma.compress(b"".join(planes[p]), preset=9))
    (dst / "model.planes.json").write_text(json.dumps(index))
    for f in src.iterdir():
        if f.name != "model.q.safetensors":
            shutil.copy(f, dst / f.name)


def unpack(src: Path, dst: Path) -> None:
    """``src``: a :func:`pack` directory -> ``dst`` with a fp32 ``model.safetensors`` (int8 rows
    times their scales, fp16 widened) and the tokenizer files."""
    import numpy as np
    from safetensors.numpy import save_file

    dst.mkdir(parents=True, exist_ok=True)
    index = json.loads((src / "model.planes.json").read_text())
    data = {p: memoryview(lzma.decompress((src / f"model.{p}.xz").read_bytes())) for p in PLANES}
    at = dict.fromkeys(PLANES, 0)
    q = {}
    for t in index:
        dtype, n = np.dtype(t["dtype"]), int(np.prod(t["shape"]))
        if dtype == np.float16:
            b = np.empty((n, 2), np.uint8)
            b[:, 0] = np.frombuffer(data["lo"][at["lo"]:at["lo"] + n], np.uint8)
            b[:, 1] = np.frombuffer(data["hi"][at["hi"]:at["hi"] + n], np.uint8)
            at["lo"] += n
            at["hi"] += n
            q[t["name"]] = b.reshape(-1).view(np.float16).reshape(t["shape"])
        else:
            size = n * dtype.itemsize
            q[t["name"]] = np.frombuffer(data["raw"][at["raw"]:at["raw"] + size], dtype).reshape(t["shape"])
            at["raw"] += size
    sd = {}
    for k, v in q.items():  # as device_prep.sh's dequant.py
        if k.endswith(".int8"):
            base = k[:-len(".int8")]
            sd[base] = np.ascontiguousarray(v.astype(np.float32) * q[base + ".scale"].astype(np.float32))
        elif not k.endswith(".scale"):
            sd[k] = np.ascontiguousarray(v.astype(np.float32))
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for f in src.iterdir():
        if not f.name.startswith("model."):
            shutil.copy(f, dst / f.name)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        raise SystemExit("usage: device_pack.py pack|unpack SRC DST")
    (pack if sys.argv[1] == "pack" else unpack)(Path(sys.argv[2]), Path(sys.argv[3]))
    print(f"{sys.argv[1]}: {sys.argv[3]}")
