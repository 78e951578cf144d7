"""How everything this project writes reaches the disk: JSON, safetensors, and one atomic writer for files, one
for directories and one for several files into a folder that holds others.

Nothing is pickled: tensors go through safetensors, everything else through JSON
(finite numbers only). A file is written whole or not at all (``atomic_file``: a
temporary sibling, fsynced, then ``os.replace``; ``write_text`` for a whole
text); so is a directory (``atomic_directory``: a temporary sibling, every file
and the directory fsynced, then swapped in); so are several files written
together into a folder that keeps its other files (``staged_files``: a
temporary folder inside it, every file fsynced, then each moved into place).
All give the new file or folder the mode the user's umask gives (0644 / 0755
under umask 022), not the private 0600 / 0700 of a temporary file, so a shared
results folder stays readable.

Usage:
    with atomic_file(Path("runs/x/predictions/sst-dev-output.csv")) as tmp:
        tmp.write_text(text)
    write_text(Path("runs/x/results.json"), text)   # the same, for a whole text
    with atomic_directory(Path("runs/x/checkpoints/last")) as tmp:
        save_tensors(tmp / "model.safetensors", model.state_dict())
        write_json(tmp / "state.json", {"epoch": 1})
    with staged_files(Path("runs/ensemble")) as tmp:   # several files into a folder that keeps its others
        write_json(tmp / "ensemble.json", summary)
    state = read_json(path)                     # a damaged file: a ValueError naming it
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tasks.outdir import process_alive

logger = logging.getLogger(__name__)


# ---- JSON and safetensors ----


def write_json(path: Path, obj: Any) -> None:
    """Plain JSON (no NaN/Infinity tokens: a non-finite float is an error, raised before a byte is written, so
    no half-written file is left behind)."""
    text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a truncated or corrupted file is a ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is truncated or corrupted ({e}): it is not valid JSON") from e


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """safetensors file of CPU copies (the encoder's split q/k/v views share storage; copies do not).

    A failed write (safetensors says "I/O error: ... (os error N)", e.g. a full disk) is raised as
    the OSError it is, naming ``path``, so it is reported as that and not as a corrupted file.
    """
    try:
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(path),
                  metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from e


def load_tensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of safetensors file ``path``; a truncated or corrupted file is a ValueError naming it."""
    try:
        return load_file(str(path), device=str(device))
    except SafetensorError as e:
        raise ValueError(f"{path} is truncated or corrupted ({e})") from e


# ---- atomic writes ----


def _umask() -> int:
    """The process's umask, read without changing it for other threads (from /proc where there is one)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return 0o022


def _public(root: Path) -> None:
    """Folders 0o777 and files 0o666 less the umask: mkdtemp's 0700 (and safetensors' 0600 files) would hide a
    shared run's results from the others who read it."""
    umask = _umask()
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~umask)
        for name in filenames:
            os.chmod(Path(dirpath) / name, 0o666 & ~umask)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def disk_use(path: Path) -> int:
    """Bytes of the files under ``path`` (or of the file), links not followed."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a new empty hidden file beside ``path`` to write; on success it replaces ``path`` (fsynced first),
    on an exception it is removed and ``path`` stays as it was. Its folder is created when missing.

    The temporary file is created with mode 0o666, so the kernel applies the umask as for any file the user
    makes; no umask is read or changed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{path.parent}: no free temporary name for {path.name} after 100 tries")
    try:
        yield tmp
        _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8, newlines as given) as the whole of file ``path``, through ``atomic_file``."""
    with atomic_file(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)


OLD_SUFFIX = ".old"


def temporary_prefix(name: str, pid: int | None = None) -> str:
    """The name start of a temporary sibling of directory ``name``: its writer's pid and host, so that
    ``remove_stale_temporaries`` can tell a dead writer's leftovers from a live writer's work."""
    return f".{name}.tmp-{os.getpid() if pid is None else pid}@{socket.gethostname()}-"


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)@(?P<host>.+)-[^-]+$")


def _dead_writers(entry: Path) -> bool:
    """Whether ``entry`` is a temporary folder (``temporary_prefix``) whose writer died (said in the log)."""
    m = _TEMPORARY.match(entry.name)
    if m and entry.is_dir() and not process_alive(int(m["pid"]), m["host"]):
        logger.warning("removing %s, left by process %s on %s that died while writing it", entry, m["pid"], m["host"])
        return True
    return False


def remove_stale_temporaries(directory: Path, keep: Path | None = None) -> None:
    """Delete what writers that died left in ``directory``: temporary folders written mid-way, and a previous
    version ``X.old`` whose swap completed (``X`` is in place: ``atomic_directory``), unless it is ``keep`` (a
    resume from a damaged ``last``'s ``last.old``)."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if _dead_writers(entry):
            shutil.rmtree(entry, ignore_errors=True)
        elif (entry.name.endswith(OLD_SUFFIX) and entry.is_dir() and entry.with_suffix("").is_dir()
              and (keep is None or entry.resolve() != keep.resolve())):
            logger.info("removing %s, the previous version of %s, whose replacement completed",
                        entry, entry.with_suffix(""))
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike[str], *, user_folder: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``final``; on success it replaces ``final``.

    The swap is two renames (old ``final`` -> ``final.old``, temporary ->
    ``final``) after an fsync of every file; then the old copy is removed. An
    exception inside the block removes the temporary directory and leaves
    ``final`` as it was. A crash between the two renames leaves the previous
    version at ``final.old`` (a reader of checkpoints finds it there). A process
    killed mid-write leaves its temporary (named by ``temporary_prefix``): the
    next write into the same folder deletes it.

    ``user_folder``: ``final``'s folder is the user's (a command's --out-dir), where a ``final.old`` or a
    temporary-looking name may be the user's own: nothing there but ``final`` is touched (no clean-up of other
    writers' leftovers), and the previous version waits under a fresh hidden name while the two renames run.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if not user_folder:
        remove_stale_temporaries(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(final.name), dir=final.parent))
    aside: Path | None = None
    try:
        yield tmp
        _public(tmp)
        _fsync_tree(tmp)
        if user_folder:
            aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=OLD_SUFFIX, dir=final.parent))
            old = aside / final.name
        else:
            old = final.with_name(final.name + OLD_SUFFIX)
            if old.exists():
                shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_path(final.parent)
        if old.exists():
            shutil.rmtree(old)
        if aside is not None:
            aside.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if aside is not None and aside.is_dir() and not any(aside.iterdir()):
            aside.rmdir()  # a previous version swapped aside stays there
        raise


@contextlib.contextmanager
def staged_files(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary folder inside ``directory`` to write several files into; on success every one is
    fsynced and moved to the same place under ``directory`` (a file of that name replaced, the folder's other
    files kept), with the umask's modes. An exception inside leaves ``directory`` as it was, and removes it
    again when the block created it; a writer killed mid-way leaves its temporary (``temporary_prefix``),
    which the next ``staged_files`` into the same folder deletes. For outputs that share a folder with others
    (an ensemble's --out-dir), where ``atomic_directory`` would replace the whole folder."""
    directory = Path(directory)
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if _dead_writers(entry):
            shutil.rmtree(entry, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(prefix=temporary_prefix("staged"), dir=directory))
    try:
        yield stage
        _public(stage)
        _fsync_tree(stage)
        for path in sorted(stage.rglob("*")):  # a folder before the files in it
            target = directory / path.relative_to(stage)
            if path.is_dir():
                target.mkdir(exist_ok=True)
            else:
                os.replace(path, target)
        for folder in {directory, *(directory / p.relative_to(stage) for p in stage.rglob("*") if p.is_dir())}:
            _fsync_path(folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    shutil.rmtree(stage)


def copy_directory(src: Path, final: Path) -> None:
    """Atomically make ``final`` a copy of directory ``src``: its own files, so that damage to one (a disk
    error, an editor) never reaches the other."""
    with atomic_directory(final) as tmp:
        for path in sorted(src.rglob("*")):
            target = tmp / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
