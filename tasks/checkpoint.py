"""A training checkpoint: what its directory holds, written in one place and read back without pickle.

A checkpoint directory (``<out_dir>/checkpoints/last``, ``.../best``, ``.../swa``) holds:

    model.safetensors        MultitaskBert.state_dict(): the encoder under HF BERT names, then the heads
    objectives.safetensors   objectives' own state (queues, momentum encoders), keys "<objective>.<key>";
                             absent when no objective has state
    objectives.rank<r>.safetensors
                             under torchrun, rank r's (r ≥ 1) rank-local objective state (KNN-BERT's
                             queues: an objective's buffers); rank 0's is in objectives.safetensors.
                             Rank r writes it itself into rank 0's temporary directory before rank 0
                             swaps the directory in (tasks.training.trainer), so the swap stays atomic
                             for all ranks' files (a shared file system is assumed, as resuming does)
    optimizer.safetensors    AdamW state tensors, keys "<param index>.<name>" (exp_avg, exp_avg_sq, step)
    optimizer.json           param_groups (hyper-parameters + parameter indices) and the parameter
                             name of every index, checked on load
    state.json               where training stands: epoch and step of the next batch, global step,
                             best dev score, per-epoch history, running epoch loss sums, the RNG
                             states of torch / CUDA (base64) / python / numpy (lists), and the sha256
                             of every data file read (``data_sha256``: a resume compares them); "swa"
                             in an SWA average's (not a training position)
    config.json              the full run configuration (TrainConfig as plain JSON)
    <task>_prior.safetensors a task's prior probe (tasks/evaluation/priors.py; SST's sst_prior.safetensors),
                             once it was fitted
    encoder/                 a complete HF BERT + sentence-transformers directory of the encoder
                             (see save_encoder_files): AutoModel / SentenceTransformer load it as it is

``write_checkpoint`` writes it whole (tasks.storage.atomic_directory: a crash never
leaves a partial directory under the final name); ``load_model`` rebuilds the model
and objectives from it alone; ``resume_point`` reads what a resume continues, and
refuses, before any data is read, a checkpoint that is no training position;
``check_encoder`` checks, before any weights are loaded, the encoder a run or an
evaluation builds its model on: the checkpoint's encoder/, else --pretrained.

Usage:
    write_checkpoint(run_dir / "checkpoints" / "last", model=model, objectives=objectives, optimizer=opt,
                     param_names=names, state=state, config=cfg, tokenizer=tok)
    model, objectives, tokenizer, cfg = load_model(resolve_checkpoint(path), device)
    resume = resume_point(run_dir / "checkpoints" / "last")     # .checkpoint, .config, .state
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from minbert.bert import BertModel
from minbert.config import BertConfig
from minbert.pretrained import check_weights, resolve_model_dir
from minbert.tokenizer import BertTokenizer
from tasks.train_config import TrainConfig
from tasks.model import MultitaskBert
from tasks.objectives import Objective, ObjectiveFileError, build_objectives, registered_objectives
from tasks.storage import (
    OLD_SUFFIX,
    copy_directory,
    load_tensors,
    read_json,
    save_tensors,
    write_json,
)

logger = logging.getLogger(__name__)


CHECKPOINT_FORMAT = 1  # state.json's "format": bump it with a step of WEIGHT_UPGRADES when the weights' names change

# The chain that brings the weights (model.safetensors) of a checkpoint of format N to N + 1, as config_versions.py
# brings its settings (fairseq's ``upgrade_state_dict``): each step a function of the state dict, applied in order
# from the checkpoint's format to CHECKPOINT_FORMAT by ``read_weights``. No format has changed the weights yet.
WEIGHT_UPGRADES: dict[int, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {}


REQUIRED_FILES = ("model.safetensors", "state.json", "config.json")  # and OPTIMIZER_FILES unless MODEL_ONLY


def prior_file(task: str) -> str:
    """The file of a task's prior probe in a checkpoint (SST's: sst_prior.safetensors)."""
    return f"{task}_prior.safetensors"


# What every state.json holds (Trainer.state): a resume reads each of them.
MODEL_ONLY = "model_only"  # state.json: the optimizer state was deleted (keep_model_only); no resume from it
STATE_KEYS = ("format", "epoch", "step", "global_step", "best", "history", "elapsed_s", "epoch_sums", "rng")


def best_of(path: str | os.PathLike[str]) -> Path:
    """``path`` as a checkpoint to predict from: a run directory's best checkpoint (``<run>/checkpoints/best``),
    else ``path`` itself (a checkpoint directory), as the predict command, the Predictor and --eval-only take
    either."""
    path = Path(path).expanduser()
    run_best = path / "checkpoints" / "best"
    return run_best if run_best.is_dir() else path


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory at ``path``, checked to be complete (or its ``.old`` copy after a crash mid-swap)."""
    path = Path(path).expanduser()
    if not path.exists():
        old = path.with_name(path.name + OLD_SUFFIX)
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


def repair_best(resume: ResumePoint, best: Path) -> bool:
    """Copy ``ckpt`` to ``best`` again when a crash came between writing ``ckpt`` and copying it there.

    The state.json of ``resume``'s checkpoint ``ckpt`` names the best epoch and holds its score. When ``ckpt``
    is the end of that very epoch (step 0 of the next one) and ``best`` does not
    hold the same position and score, ``best`` is stale or missing: the best
    weights exist only in ``ckpt``, so they are copied before anything can
    overwrite it. Returns whether ``best`` was repaired.
    """
    ckpt, state = resume.checkpoint, resume.state
    mark = state.get("best")
    if not mark or "swa" in state or state["step"] != 0 or mark["epoch"] != state["epoch"]:
        return False
    try:
        held = read_json(resolve_checkpoint(best) / "state.json")
    except (OSError, ValueError):
        held = {}
    if (held.get("best"), held.get("epoch"), held.get("step")) == (mark, state["epoch"], 0):
        return False
    logger.warning("%s does not hold the best epoch %d that %s records (interrupted before it was copied): "
                   "copying it again from %s", best, mark["epoch"], ckpt, ckpt)
    copy_directory(ckpt, best)
    return True


def load_config(ckpt: Path, trust_modules: bool = False) -> TrainConfig:
    """The TrainConfig saved in checkpoint directory ``ckpt``: the one read of its config.json per command. A
    field it lacks is an error naming it (a resume must continue the run's settings, not today's defaults). The
    objective files the run recorded are imported only with ``trust_modules`` (``TrainConfig.from_dict``)."""
    path = ckpt / "config.json"
    saved = read_json(path)  # a damaged file: a ValueError naming it
    registered_objectives()  # the package's and MINBERT_PLUGINS' objectives first: an error of theirs is not the file's
    try:
        return TrainConfig.from_dict(saved, complete=True, trust_modules=trust_modules)
    except ObjectiveFileError as e:  # the run's objective file: not a damaged checkpoint
        raise ObjectiveFileError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path} is {e}" if str(e).startswith("not a complete") else f"{path}: {e}") from None


def verify_checkpoint(path: str | os.PathLike[str], trust_modules: bool = False) -> tuple[Path, TrainConfig]:
    """``resolve_checkpoint``, then its config (``load_config``, ``trust_modules`` its) and state files parsed and
    every safetensors header read (a truncated or corrupted file is a ValueError naming it; flipped bits inside
    tensor data are not detected). Returns the checkpoint and its config: the one read of its config.json."""
    ckpt, config, _ = _intact(path, trust_modules)
    return ckpt, config


def _intact(path: str | os.PathLike[str], trust_modules: bool = False) -> tuple[Path, TrainConfig, dict]:
    """``verify_checkpoint``'s work; returns the checkpoint, its config and its parsed state.json."""
    path = resolve_checkpoint(path)
    config = load_config(path, trust_modules)
    state = read_json(path / "state.json")
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing:
        raise ValueError(f"{path / 'state.json'} lacks {missing}: the checkpoint is damaged")
    if not state.get(MODEL_ONLY):
        missing = [f for f in OPTIMIZER_FILES if not (path / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{path} is not a complete checkpoint: missing {', '.join(missing)}")
        read_json(path / "optimizer.json")
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as f:
                f.keys()
        except SafetensorError as e:
            raise ValueError(f"{file} is truncated or corrupted ({e})") from e
    return path, config, state


def resumable_checkpoint(path: str | os.PathLike[str], trust_modules: bool = False
                         ) -> tuple[Path, TrainConfig, dict]:
    """(``path`` verified, its config, its state.json); when it is a run's damaged ``last`` (a weight, state or
    config file), an intact ``last.old`` or ``best`` beside it instead, with a warning (the epochs after it are
    trained again); else a ValueError saying what is wrong. A run that kept its model alone (--save-only-model:
    ``last`` deleted, ``best`` without its optimizer state) is that ValueError, with no fallback."""
    path = Path(path).expanduser()
    try:
        return _intact(path, trust_modules)
    except ObjectiveFileError:  # an objective file of the run's, not named again or not there: the same beside it
        raise
    except (OSError, ValueError) as e:
        if path.name != "last":
            raise
        for other in (path.with_name("last" + OLD_SUFFIX), path.with_name("best")):
            try:
                good = _intact(other, trust_modules)
            except ObjectiveFileError:  # intact, but its objective file is not named again: that is the answer
                raise
            except (OSError, ValueError):
                continue
            if good[2].get(MODEL_ONLY):
                raise ValueError(model_only_refusal(good[0])) from None
            logger.warning("%s; resuming from %s instead: training goes on from its position", e, good[0])
            return good
        raise ValueError(f"{e}; neither last.old nor best beside it is intact: mend the file it names (a run never "
                         "needs deleting to be resumed)") from e


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resume continues, read once (``resume_point``): where it is, its config, its state.json."""

    checkpoint: Path
    config: TrainConfig
    state: dict
    data_changed: bool = False  # the user says the data may differ from the run's (--data-changed)


def model_only_refusal(ckpt: Path) -> str:
    """Why a checkpoint that kept its model alone (--save-only-model) is not resumed, and what its run can do."""
    if ckpt.parent.name == "checkpoints":
        run = ckpt.parent.parent
        return (f"{run} kept its model alone (--save-only-model), so it cannot be resumed: evaluate it with "
                f"--eval-only --out-dir {run}, or train it again (another --out-dir, or --overwrite)")
    return (f"{ckpt} kept its model alone (--save-only-model), so it cannot be resumed: evaluate it with --eval-only "
            f"--checkpoint {ckpt}, or train again")


def resume_point(path: str | os.PathLike, data_changed: bool = False, trust_modules: bool = False) -> ResumePoint:
    """The checkpoint a resume continues (a damaged ``last``: an intact ``last.old`` or ``best``, warned), with the
    config and state saved in it, each read once (``trust_modules``: ``load_config``'s)."""
    ckpt, config, state = resumable_checkpoint(path, trust_modules)
    if "swa" in state:
        raise ValueError(f"{ckpt} holds SWA-averaged weights, not a training position: evaluate it with "
                         "--eval-only, or resume checkpoints/last (with --swa-epochs to redo the SWA phase)")
    if state.get("format") != CHECKPOINT_FORMAT:  # its weights load (read_weights); its optimizer's names may not
        raise ValueError(f"{ckpt}: a checkpoint of format {state.get('format')} (this code's: {CHECKPOINT_FORMAT}) "
                         "cannot be resumed; --eval-only and predict load its weights")
    if state.get(MODEL_ONLY):
        raise ValueError(model_only_refusal(ckpt))
    return ResumePoint(ckpt, config, state, data_changed)


def keep_model_only(ckpt: Path) -> int:
    """Delete a checkpoint's optimizer state, marking it in state.json first (a crash between leaves files that
    are ignored, never a checkpoint that claims to be resumable without them). Returns the bytes freed."""
    state = read_json(ckpt / "state.json")
    if not state.get(MODEL_ONLY):
        write_json(ckpt / "state.json", {**state, MODEL_ONLY: True})
    freed = 0
    for name in OPTIMIZER_FILES:
        if (ckpt / name).is_file():
            freed += (ckpt / name).stat().st_size
            (ckpt / name).unlink()
    return freed


OPTIMIZER_FILES = ("optimizer.safetensors", "optimizer.json")


def check_same_data(resume: ResumePoint, reports: dict[str, dict]) -> None:
    """The files a resume reads are those its run started with: each file's sha256 (ReadReport) against the one
    the checkpoint recorded (``data_sha256``). A changed file is a ValueError naming it, unless
    ``resume.data_changed``; a checkpoint without fingerprints is resumed with a warning."""
    saved = resume.state.get("data_sha256")
    if saved is None:
        logger.warning("%s records no fingerprints of its data (written before they were): this resume cannot check "
                       "that it reads the run's data", resume.checkpoint)
        return
    changed = [(reports[k], saved[k]) for k in sorted(saved) if k in reports and reports[k]["sha256"] != saved[k]]
    if changed and not resume.data_changed:
        report, old = changed[0]
        raise ValueError(f"{report['file']}: not the file the run started with (sha256 {report['sha256'][:12]}..., "
                         f"the run's {old[:12]}...{f'; and {len(changed) - 1} more' if len(changed) > 1 else ''}): "
                         "resume on the run's data, or pass --data-changed to continue on these")
    for report, _ in changed:
        logger.warning("--data-changed: %s differs from the file the run started with; training goes on with it",
                       report["file"])


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


def _storages(module: nn.Module) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}


def objectives_state(objectives: Sequence[nn.Module], model: nn.Module,
                     rank_local_only: bool = False) -> dict[str, torch.Tensor]:
    """Objectives' own tensors (queues, momentum encoders) keyed "<name>.<key>".

    Tensors that live in the model (an objective holding a reference to the
    encoder) are left out: model.safetensors has them. ``rank_local_only``: only
    the entries that differ between torchrun ranks, what ranks r ≥ 1 save to
    ``rank_objectives_file(r)``: an objective's buffers, which each rank fills
    from its own shard (KNN-BERT's queues). Its parameters, trained from
    all-reduced gradients, and what it derives from them (a momentum key model)
    are the same on every rank.
    """
    shared = _storages(model)
    out: dict[str, torch.Tensor] = {}
    for o in objectives:
        buffers = {name for name, _ in o.named_buffers()}
        for k, v in o.state_dict(keep_vars=True).items():
            if rank_local_only and k not in buffers:
                continue
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in shared:
                out[f"{o.name}.{k}"] = v.detach()
    return out


def rank_objectives_file(rank: int) -> str:
    """The file of rank ``rank``'s (≥ 1) rank-local objective state in a checkpoint directory."""
    return f"objectives.rank{rank}.safetensors"


def load_objectives_state(objectives: Sequence[nn.Module], model: nn.Module, ckpt: Path,
                          device: torch.device, rank: int = 0) -> None:
    """Inverse of ``objectives_state``. Missing tensors (other than the model's own) and extra ones are errors.

    A torchrun rank r ≥ 1 then takes its own rank-local entries from
    ``rank_objectives_file(r)``; where the checkpoint has none for it (written by
    fewer processes) it keeps rank 0's, with a warning.
    """
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
    if rank == 0:
        return
    expected = set(objectives_state(objectives, model, rank_local_only=True))
    if not expected:
        return
    path = ckpt / rank_objectives_file(rank)
    if not path.is_file():
        logger.warning("rank %d: %s has no %s (written by fewer processes): this rank starts from rank 0's %s",
                       rank, ckpt, path.name, ", ".join(sorted(expected)[:3]))
        return
    own = load_tensors(path, device)
    if set(own) != expected:
        raise ValueError(f"{path}: rank-local objective state does not match: missing "
                         f"{sorted(expected - set(own))[:5]}, unexpected {sorted(set(own) - expected)[:5]}")
    for o in objectives:
        o.load_state_dict({k[len(o.name) + 1:]: v for k, v in own.items() if k.startswith(o.name + ".")},
                          strict=False)


def save_encoder_files(directory: Path, encoder: nn.Module, tokenizer: Any, *, max_length: int,
                       pooling: str) -> None:
    """The encoder as a plain Hugging Face BERT directory that sentence-transformers loads too.

    Writes config.json (flat HF BertConfig, model_type "bert", architectures
    ["BertModel"]), model.safetensors (the encoder's tensors under HF BertModel
    names), vocab.txt and the tokenizer's files (tokenizer_config.json,
    special_tokens_map.json, and tokenizer.json when the pretrained directory
    has one), and for sentence-transformers modules.json,
    sentence_bert_config.json (max_seq_length = ``max_length``) and
    1_Pooling/config.json matching ``pooling``: mean -> mean over tokens,
    cls -> the raw [CLS] state, both equal to the embedding our heads read.
    pooling "pooler" also maps to CLS, but our heads read the pooler's
    tanh(dense([CLS])), which sentence-transformers' CLS pooling does not apply:
    its embedding is then the raw [CLS] state, and transformers' pooler_output
    is what our heads read.
    """
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", encoder.config.to_hf_dict())
    save_tensors(directory / "model.safetensors", encoder.state_dict(), metadata={"format": "pt"})
    vocab = Path(tokenizer.vocab_file)
    shutil.copyfile(vocab, directory / "vocab.txt")
    if (vocab.parent / "tokenizer.json").is_file():
        shutil.copyfile(vocab.parent / "tokenizer.json", directory / "tokenizer.json")
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]"}
    source_cfg = vocab.parent / "tokenizer_config.json"
    tok_cfg = read_json(source_cfg) if source_cfg.is_file() else {}
    tok_cfg.update({"do_lower_case": tokenizer.do_lower_case, "strip_accents": tokenizer.strip_accents,
                    "tokenize_chinese_chars": tokenizer.tokenize_chinese_chars,
                    "model_max_length": max_length, "tokenizer_class": "BertTokenizer", **special})
    write_json(directory / "tokenizer_config.json", tok_cfg)
    write_json(directory / "special_tokens_map.json", special)
    write_json(directory / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    write_json(directory / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    (directory / "1_Pooling").mkdir(exist_ok=True)
    write_json(directory / "1_Pooling" / "config.json", {
        "word_embedding_dimension": encoder.config.hidden_size, "pooling_mode_cls_token": pooling != "mean",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False})


def write_training_state(directory: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                         param_names: list[str], state: dict) -> None:
    """The files of every checkpoint a training loop resumes (tasks.training.trainer.Loop: fine-tuning's and MLM
    pretraining's): model.safetensors, optimizer.safetensors and optimizer.json, state.json."""
    save_tensors(directory / "model.safetensors", model.state_dict())
    tensors, meta = optimizer_state(optimizer, param_names)
    save_tensors(directory / "optimizer.safetensors", tensors)
    write_json(directory / "optimizer.json", meta)
    write_json(directory / "state.json", state)


def checkpoint_format(ckpt: Path, state: dict | None = None) -> int:
    """The format of checkpoint ``ckpt`` (its state.json's, ``state`` when the caller has read it; every checkpoint
    since the first has one)."""
    state = state if state is not None else read_state(ckpt)
    found = state.get("format", 1) if state is not None else 1
    if not isinstance(found, int) or found < 1:
        raise ValueError(f"{ckpt / 'state.json'}: \"format\" is {found!r}, not a checkpoint format: the file was edited "
                         "or damaged; use another checkpoint")
    if found > CHECKPOINT_FORMAT:
        raise ValueError(f"{ckpt} is a checkpoint of format {found}, newer than this code reads ({CHECKPOINT_FORMAT}): "
                         "update the code (git pull) to load it")
    return found


def read_weights(ckpt: Path, device: torch.device | str = "cpu", state: dict | None = None
                 ) -> dict[str, torch.Tensor]:
    """Checkpoint ``ckpt``'s model.safetensors as today's model names its weights: an older format's brought up
    through ``WEIGHT_UPGRADES``, step by step (``state``: its state.json, when the caller has read it)."""
    weights = load_tensors(ckpt / "model.safetensors", device)
    for version in range(checkpoint_format(ckpt, state), CHECKPOINT_FORMAT):
        weights = WEIGHT_UPGRADES[version](weights)
    return weights


def load_weights(model: nn.Module, ckpt: Path, device: torch.device | str = "cpu", state: dict | None = None
                 ) -> None:
    """Checkpoint ``ckpt``'s weights (``read_weights``) into ``model``."""
    model.load_state_dict(read_weights(ckpt, device, state))


def load_training_state(ckpt: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, param_names: list[str],
                        state: dict, device: torch.device | str = "cpu") -> None:
    """The weights and the optimizer state ``write_training_state`` wrote, into ``model`` and ``optimizer`` (its
    parameters named ``param_names``: they must be the checkpoint's); ``state``: its state.json, read where the
    checkpoint is checked (``resume_point``, ``read_state``)."""
    load_weights(model, ckpt, device, state)
    load_optimizer_state(optimizer, load_tensors(ckpt / "optimizer.safetensors", device),
                         read_json(ckpt / "optimizer.json"), param_names)


def read_state(ckpt: Path) -> dict | None:
    """The state.json of checkpoint directory ``ckpt``; None when there is none (no checkpoint there yet)."""
    path = ckpt / "state.json"
    return read_json(path) if path.is_file() else None


def write_checkpoint(directory: Path, *, model: MultitaskBert, objectives: Sequence[nn.Module],
                     optimizer: torch.optim.Optimizer, param_names: list[str], state: dict, config: TrainConfig,
                     tokenizer: Any, priors: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
    """Write every file of a checkpoint (the module docstring) into ``directory``, a fresh folder the caller
    swaps in (``atomic_directory``); ``priors``: the tasks' probes (tasks/evaluation/priors.py) fitted so far."""
    write_training_state(directory, model=model, optimizer=optimizer, param_names=param_names, state=state)
    obj_state = objectives_state(objectives, model)
    if obj_state:
        save_tensors(directory / "objectives.safetensors", obj_state)
    write_json(directory / "config.json", config.to_dict())
    for task, probe in (priors or {}).items():
        save_tensors(directory / prior_file(task), probe)
    save_encoder_files(directory / "encoder", model.encoder, tokenizer, max_length=config.max_length,
                       pooling=config.model.pooling)


def check_encoder(cfg: TrainConfig, ckpt: Path | None = None, eval_only: bool = False) -> None:
    """The encoder a run or an evaluation starts from, checked without loading it: a training run's --pretrained
    weights read (their header: a truncated file is named now, not at model building), and --max-length within
    the position embeddings and --reinit-layers within its layers (config.json of the checkpoint's encoder/ when
    there is one, else of --pretrained)."""
    if not eval_only:  # training loads --pretrained first (a resume then overwrites it with the checkpoint's)
        try:
            check_weights(resolve_model_dir(cfg.pretrained))
        except ValueError as e:
            raise ValueError(f"--pretrained {cfg.pretrained}: {e}: use an intact checkpoint directory") from None
    own = ckpt / "encoder" if ckpt is not None else None
    source = own if own is not None and (own / "config.json").is_file() else resolve_model_dir(cfg.pretrained)
    encoder = BertConfig.from_json_file(source / "config.json")
    positions = encoder.max_position_embeddings
    if cfg.max_length > positions:
        raise ValueError(f"--max-length {cfg.max_length} is more than the {positions} positions of the encoder in "
                         f"{source} (max_position_embeddings): pass --max-length {positions} or less")
    if cfg.reinit_layers > encoder.num_hidden_layers:
        raise ValueError(f"--reinit-layers {cfg.reinit_layers}: the encoder in {source} has "
                         f"{encoder.num_hidden_layers} layers")


def load_model(ckpt: Path, device: torch.device | str = "cpu", cfg: TrainConfig | None = None
               ) -> tuple[MultitaskBert, list[Objective], BertTokenizer, TrainConfig]:
    """Rebuild (model, objectives, tokenizer, config) from checkpoint directory ``ckpt`` (resolved) alone.

    ``cfg``, when the caller has read it (``load_config``), is used as it is: the objectives are built from its
    options (an evaluation config may change their inference options, tasks.train_config.eval_config)."""
    cfg = cfg if cfg is not None else load_config(ckpt)
    enc_dir = ckpt / "encoder"
    encoder = BertModel(BertConfig.from_json_file(enc_dir / "config.json"))
    tokenizer = BertTokenizer.from_pretrained(enc_dir)
    state = read_weights(ckpt)
    # the heads the weights hold (an evaluation may ask for some of the trained tasks only)
    held = {key.split(".")[0] for key in state}
    heads = [t for t in cfg.entries if held & {f"{t}_head", f"{t}_own", f"{t}_bias"}]
    model = MultitaskBert(encoder, cfg.model, heads, cfg.entries)
    model.load_state_dict(state)
    model.to(device)
    objectives = build_objectives(cfg.objectives, model)
    for o in objectives:
        o.to(device)
    load_objectives_state(objectives, model, ckpt, torch.device(device))
    return model, objectives, tokenizer, cfg
