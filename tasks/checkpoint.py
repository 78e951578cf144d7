"""Training checkpoints: a directory of safetensors and JSON files, written atomically, read without pickle.

A checkpoint directory (``<out_dir>/checkpoints/last`` and ``.../best``) holds:

    model.safetensors        MultitaskBert.state_dict(): the encoder under HF BERT names, then the heads
    objectives.safetensors   objectives' own state (queues, momentum encoders), keys "<objective>.<key>";
                             absent when no objective has state
    optimizer.safetensors    AdamW state tensors, keys "<param index>.<name>" (exp_avg, exp_avg_sq, step)
    optimizer.json           param_groups (hyper-parameters + parameter indices) and the parameter
                             name of every index, checked on load
    state.json               where training stands: epoch and step of the next batch, global step,
                             best dev score, per-epoch history, running epoch loss sums, and the RNG
                             states of torch / CUDA (base64) / python / numpy (lists)
    config.json              the full run configuration (TrainConfig as plain JSON)
    encoder/                 config.json (BertConfig), vocab.txt, tokenizer_config.json: what is
                             needed to rebuild the encoder and tokenizer without the pretrained dir

Nothing is pickled: tensors go through safetensors, everything else through
JSON. ``atomic_directory`` writes into a temporary sibling directory, fsyncs
every file and the directory, then swaps it in with ``os.replace``, so a
crash never leaves a partial directory under the final name.

Usage:
    with atomic_directory(run_dir / "checkpoints" / "last") as tmp:
        save_tensors(tmp / "model.safetensors", model.state_dict())
        write_json(tmp / "state.json", {"epoch": 1})
    state = read_json(resolve_checkpoint(path) / "state.json")
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from minbert.config import BertConfig
from tasks import distributed

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1
REQUIRED_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json", "state.json", "config.json")
_OLD_SUFFIX = ".old"


# ---- atomic directories -------------------------------------------------------------------


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


def temporary_prefix(name: str, pid: int | None = None) -> str:
    """The name start of a temporary sibling of checkpoint ``name``: its writer's pid and host, so that
    ``remove_stale_temporaries`` can tell a dead writer's leftovers from a live writer's work."""
    return f".{name}.tmp-{os.getpid() if pid is None else pid}@{socket.gethostname()}-"


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)@(?P<host>.+)-[^-]+$")


def process_alive(pid: int, host: str) -> bool:
    """Whether process ``pid`` on ``host`` may be running (another host's processes cannot be checked: yes)."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


def remove_stale_temporaries(directory: Path) -> None:
    """Delete the temporary checkpoint folders that writers which died mid-write left in ``directory``."""
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        m = _TEMPORARY.match(entry.name)
        if m and entry.is_dir() and not process_alive(int(m["pid"]), m["host"]):
            logger.warning("removing %s, left by process %s on %s that died while writing it",
                           entry, m["pid"], m["host"])
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``final``; on success it replaces ``final``.

    The swap is two renames (old ``final`` -> ``final.old``, temporary ->
    ``final``) after an fsync of every file; then the old copy is removed. An
    exception inside the block removes the temporary directory and leaves
    ``final`` as it was. A crash between the two renames leaves the previous
    version at ``final.old``, which ``resolve_checkpoint`` finds. A process
    killed mid-write leaves its temporary (named by ``temporary_prefix``): the
    next write into the same folder deletes it.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(final.name), dir=final.parent))
    try:
        yield tmp
        _fsync_tree(tmp)
        old = final.with_name(final.name + _OLD_SUFFIX)
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_path(final.parent)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def link_or_copy_directory(src: Path, final: Path) -> None:
    """Atomically make ``final`` a copy of checkpoint ``src`` (hard links: the files are never modified in place)."""
    with atomic_directory(final) as tmp:
        for path in sorted(src.rglob("*")):
            target = tmp / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory at ``path``, checked to be complete (or its ``.old`` copy after a crash mid-swap)."""
    path = Path(path).expanduser()
    if not path.exists():
        old = path.with_name(path.name + _OLD_SUFFIX)
        if old.is_dir():
            logger.warning("%s is missing but %s exists (interrupted while replacing it); using that", path, old)
            path = old
        else:
            raise FileNotFoundError(f"no checkpoint at {path}: pass a directory written by training "
                                    f"(e.g. runs/<name>/checkpoints/best or .../last)")
    if not path.is_dir():
        raise NotADirectoryError(f"{path} is a file; a checkpoint is a directory ({', '.join(REQUIRED_FILES)})")
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{path} is not a complete checkpoint: missing {', '.join(missing)}")
    return path


def repair_best(ckpt: Path, best: Path) -> bool:
    """Re-link ``best`` from ``ckpt`` when a crash came between writing ``ckpt`` and linking ``best``.

    ``ckpt``'s state.json names the best epoch and holds its score. When ``ckpt``
    is the end of that very epoch (step 0 of the next one) and ``best`` does not
    hold the same position and score, ``best`` is stale or missing: the best
    weights exist only in ``ckpt``, so they are linked before anything can
    overwrite it. Returns whether ``best`` was repaired.
    """
    state = read_json(ckpt / "state.json")
    mark = state.get("best")
    if not mark or "swa" in state or state["step"] != 0 or mark["epoch"] != state["epoch"]:
        return False
    try:
        held = read_json(resolve_checkpoint(best) / "state.json")
    except (OSError, ValueError):
        held = {}
    if (held.get("best"), held.get("epoch"), held.get("step")) == (mark, state["epoch"], 0):
        return False
    logger.warning("%s does not hold the best epoch %d that %s records (interrupted before it was linked): "
                   "re-linking it from %s", best, mark["epoch"], ckpt, ckpt)
    link_or_copy_directory(ckpt, best)
    return True


# ---- files --------------------------------------------------------------------------------


def write_json(path: Path, obj: Any) -> None:
    """Plain JSON (no NaN/Infinity tokens: a non-finite float is an error, never silently written)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True, allow_nan=False)
        f.write("\n")


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a truncated or corrupted file is a ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is truncated or corrupted ({e}): it is not valid JSON") from e


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """safetensors file of CPU copies (the encoder's split q/k/v views share storage; copies do not)."""
    save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}, str(path),
              metadata=metadata)


def load_tensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of safetensors file ``path``; a truncated or corrupted file is a ValueError naming it."""
    try:
        return load_file(str(path), device=str(device))
    except SafetensorError as e:
        raise ValueError(f"{path} is truncated or corrupted ({e})") from e


def verify_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``resolve_checkpoint``, then every JSON file parsed and every safetensors header read (a truncated or
    corrupted file is a ValueError naming it; flipped bits inside tensor data are not detected)."""
    path = resolve_checkpoint(path)
    for name in ("config.json", "state.json", "optimizer.json"):
        read_json(path / name)
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as f:
                f.keys()
        except SafetensorError as e:
            raise ValueError(f"{file} is truncated or corrupted ({e})") from e
    return path


def resumable_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` verified; when it is a run's damaged ``last``, an intact ``last.old`` or ``best`` beside it
    instead, with a warning (the epochs after it are trained again); else a ValueError saying what is wrong."""
    path = Path(path).expanduser()
    try:
        return verify_checkpoint(path)
    except (OSError, ValueError) as e:
        if path.name != "last":
            raise
        for other in (path.with_name("last" + _OLD_SUFFIX), path.with_name("best")):
            try:
                good = verify_checkpoint(other)
            except (OSError, ValueError):
                continue
            logger.warning("%s; resuming from %s instead: training goes on from its position", e, good)
            return good
        raise ValueError(f"{e}; neither last.old nor best beside it is intact: start afresh (--overwrite)") from e


# ---- optimizer state ------------------------------------------------------------------------


def optimizer_state(optimizer: torch.optim.Optimizer, param_names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, JSON metadata) of an optimizer whose parameters, in group order, are named ``param_names``."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for idx, entry in sd["state"].items():
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {idx}.{key} is a {type(value).__name__}, not a tensor; "
                                "only tensor state can be checkpointed without pickle")
            tensors[f"{idx}.{key}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    n_params = sum(len(g["params"]) for g in groups)
    if n_params != len(param_names):
        raise ValueError(f"optimizer has {n_params} parameters but {len(param_names)} names were given")
    return tensors, {"param_groups": groups, "param_names": param_names}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict,
                         param_names: list[str]) -> None:
    """Inverse of ``optimizer_state``: the parameter names must match index for index."""
    if meta["param_names"] != param_names:
        saved, now = set(meta["param_names"]), set(param_names)
        raise ValueError("the checkpoint's optimizer was built over other parameters: "
                         f"only in checkpoint {sorted(saved - now)[:5]}, only in model {sorted(now - saved)[:5]}"
                         + ("" if saved != now else " (same names, different order)"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


# ---- objectives' state and the encoder's files -------------------------------------------------------------


def _storages(module: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


def objectives_state(objectives: Sequence[nn.Module], model: nn.Module) -> dict[str, torch.Tensor]:
    """Objectives' own tensors (queues, momentum encoders) keyed "<name>.<key>".

    Tensors that live in the model (an objective holding a reference to the
    encoder) are left out: model.safetensors has them.
    """
    shared = _storages(model)
    out: dict[str, torch.Tensor] = {}
    for o in objectives:
        for k, v in o.state_dict(keep_vars=True).items():
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in shared:
                out[f"{o.name}.{k}"] = v.detach()
    return out


def load_objectives_state(objectives: Sequence[nn.Module], model: nn.Module, ckpt: Path,
                          device: torch.device) -> None:
    """Inverse of ``objectives_state``. Missing tensors (other than the model's own) and extra ones are errors."""
    path = ckpt / "objectives.safetensors"
    saved = load_tensors(path, device) if path.is_file() else {}
    names = {o.name for o in objectives}
    stray = sorted(k for k in saved if k.split(".", 1)[0] not in names)
    if stray:
        raise ValueError(f"{ckpt}: objectives.safetensors holds state of objectives this config does not use: "
                         f"{stray[:5]}")
    shared = _storages(model)
    for o in objectives:
        mine = {k[len(o.name) + 1:]: v for k, v in saved.items() if k.startswith(o.name + ".")}
        result = o.load_state_dict(mine, strict=False)  # not strict: tensors of the model are not in the file
        in_model = {k for k, v in o.state_dict(keep_vars=True).items()
                    if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in shared}
        missing = sorted(set(result.missing_keys) - in_model)
        if missing or result.unexpected_keys:
            raise ValueError(f"{ckpt}: objective {o.name!r} state does not match: missing {missing[:5]}, "
                             f"unexpected {sorted(result.unexpected_keys)[:5]}")


def save_encoder_files(directory: Path, config: BertConfig, source_dir: Path) -> None:
    """The encoder's BertConfig and tokenizer files: enough to rebuild both without the pretrained directory."""
    directory.mkdir(parents=True, exist_ok=True)
    config.to_json_file(directory / "config.json")
    for name in ("vocab.txt", "tokenizer_config.json"):
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, directory / name)


def check_writable_dir(path: Path, flag: str) -> None:
    """``path`` is, or can be made, a writable directory (NotADirectoryError / PermissionError naming ``flag``)."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} is a file: pass a directory (it is created when missing)")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise NotADirectoryError(f"{flag} {path}: {existing} is a file, so the directory cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"{flag} {path} is not writable ({existing} is not): fix its permissions or pick "
                              "another directory")


# ---- locks --------------------------------------------------------------------------------------------------


def _lock_owner(lock: Path) -> dict | None:
    """{"pid", "host"} of ``lock``'s owner; None when it cannot be read (gone, or garbled: stale)."""
    try:
        text = lock.read_text()
    except FileNotFoundError:
        return None
    try:
        owner = json.loads(text)
        return {"pid": int(owner["pid"]), "host": str(owner["host"])}
    except (ValueError, KeyError, TypeError):
        return {"pid": int(text), "host": socket.gethostname()} if text.strip().isdigit() else None  # bare pid


def take_lock(lock: Path, what: str, *, reentrant: bool = True) -> None:
    """Create ``lock`` naming this process (pid, host). A live owner is refused (FileExistsError, one line);
    a lock of a dead process is taken over with a warning; this process's own lock is kept when ``reentrant``
    (a Trainer built twice in one process, as tests and notebooks do), refused otherwise."""
    me = {"pid": os.getpid(), "host": socket.gethostname()}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner == me and reentrant:
                return
            if owner is not None and process_alive(owner["pid"], owner["host"]):
                raise FileExistsError(f"{what} is in use by process {owner['pid']} on {owner['host']} ({lock}): "
                                      f"wait for it to finish or pick another --out-dir; if that process is gone, "
                                      f"delete {lock}") from None
            logger.warning("taking over %s left by %s (no longer running)", lock, owner or "an unreadable owner")
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise FileExistsError(f"could not take {lock}: another process keeps creating it; pick another --out-dir")


def release_lock(lock: Path) -> None:
    """Remove ``lock`` if this process owns it."""
    if _lock_owner(lock) == {"pid": os.getpid(), "host": socket.gethostname()}:
        lock.unlink(missing_ok=True)


# ---- the run directory ---------------------------------------------------------------------------------------

RUN_FILES = ("checkpoints", "metrics.jsonl", "predictions", "config.json", "data.json", "training.png")


def _holds_results(path: Path) -> bool:
    """A non-empty file, or a folder with an entry that is not a hidden temporary."""
    if path.is_dir():
        return any(not p.name.startswith(".") for p in path.iterdir())
    return path.is_file() and path.stat().st_size > 0


class RunDir:
    """A run directory: config.json, metrics.jsonl, training.png and checkpoints/. Only the main process writes.

    ``start`` locks it (``run.lock``: pid and host of the owner) until ``close``.
    ``--overwrite`` moves the previous run's files into ``.replaced-<time>-<pid>/``;
    ``checkpoint_written`` deletes them once the new run has its first
    checkpoint, and ``close(failed=True)`` before that puts them back.
    """

    def __init__(self, path: str | os.PathLike, writer: bool = True) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"
        self.lock = self.path / "run.lock"
        self.writer = writer
        self.replaced: Path | None = None

    def start(self, cfg: Any, *, resume: Path | None = None, overwrite: bool = False) -> None:
        """Lock the directory; a fresh run refuses an earlier run's files unless ``overwrite``; write config.json.

        A resume from checkpoint ``resume`` first repairs ``best`` when a crash
        came between writing that checkpoint and linking best (``repair_best``).
        Under torchrun rank 0 checks and locks; every rank raises, or none.
        """
        error: OSError | None = None
        if self.writer:
            try:
                self._prepare(resume, overwrite)
            except OSError as e:
                error = e
        message = distributed.broadcast_from_main(None if error is None else str(error))
        if error is not None:
            raise error
        if message is not None:
            raise FileExistsError(message)
        if self.writer:
            write_json(self.path / "config.json", cfg.to_dict())

    def _prepare(self, resume: Path | None, overwrite: bool) -> None:
        check_writable_dir(self.path, "--out-dir")
        self.path.mkdir(parents=True, exist_ok=True)
        take_lock(self.lock, f"run directory {self.path}")
        atexit.register(release_lock, self.lock)
        try:
            remove_stale_temporaries(self.checkpoints)
            for aside in self.path.glob(".replaced-*-*"):
                pid = aside.name.rsplit("-", 1)[1]
                if pid.isdigit() and not process_alive(int(pid), socket.gethostname()):
                    logger.warning("%s holds a run that an --overwrite killed before its first checkpoint moved "
                                   "aside: move its files back into %s, or delete it", aside, self.path)
            if resume is not None:
                repair_best(resume, self.checkpoints / "best")
                return
            held = [p for p in (self.checkpoints, self.metrics, self.path / "predictions") if _holds_results(p)]
            if held and not overwrite:
                raise FileExistsError(f"{held[0]} holds an earlier run: resume it (--resume), pick another "
                                      "--out-dir, or pass --overwrite to replace it")
            present = [self.path / n for n in RUN_FILES if (self.path / n).exists()]
            if overwrite and held:
                self.replaced = self.path / f".replaced-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
                self.replaced.mkdir()
                for p in present:
                    os.replace(p, self.replaced / p.name)
                logger.info("--overwrite: the previous run waits in %s until this one writes its first checkpoint",
                            self.replaced)
            else:
                self.metrics.unlink(missing_ok=True)  # an empty file of a run that never finished an epoch
        except BaseException:
            release_lock(self.lock)
            raise

    def record_data(self, data: dict[str, dict] | None) -> None:
        """data.json: ``{"files": {"<task> <split>": ReadReport.to_dict()}}`` of the files this process read."""
        if self.writer and data is not None:
            write_json(self.path / "data.json", {"files": data})

    def checkpoint_written(self) -> None:
        """The new run has its first checkpoint: the run that --overwrite moved aside is deleted."""
        if self.replaced is not None:
            shutil.rmtree(self.replaced, ignore_errors=True)
            logger.info("--overwrite: the previous run (%s) is deleted", self.replaced)
            self.replaced = None

    def close(self, *, failed: bool = False) -> None:
        """Release the lock; a run that ``failed`` before its first checkpoint puts an overwritten run back."""
        if not self.writer:
            return
        if failed and self.replaced is not None:
            for name in RUN_FILES:
                new = self.path / name
                if new.is_dir():
                    shutil.rmtree(new)
                else:
                    new.unlink(missing_ok=True)
            for p in self.replaced.iterdir():
                os.replace(p, self.path / p.name)
            self.replaced.rmdir()
            logger.warning("the new run failed before its first checkpoint: the previous run is back in %s",
                           self.path)
            self.replaced = None
        release_lock(self.lock)

    def end_epoch(self, record: dict, history: list[dict], improved: bool) -> None:
        """After ``last`` is saved: link ``best`` when the epoch ``improved``, append the record, plot."""
        if improved:
            link_or_copy_directory(self.checkpoints / "last", self.checkpoints / "best")
        self.append(record)
        from tasks.plots import plot_history  # matplotlib loads only when a run reaches its first plot

        plot_history(history, self.path / "training.png")

    def append(self, record: dict) -> None:
        """One record more in metrics.jsonl."""
        if self.writer:
            with open(self.metrics, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, allow_nan=False) + "\n")

    def rewrite(self, records: Sequence[dict]) -> None:
        """metrics.jsonl holding exactly ``records`` (a resumed run drops the records after its checkpoint)."""
        if self.writer:
            with open(self.metrics, "w", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record, allow_nan=False) + "\n")
