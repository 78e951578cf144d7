"""Test helpers that tests call directly: tiny configs, models, batches and data files, small fakes.

Fixtures (``tiny_env``, ``minilm``, ``one_thread``, ...) live in tests/conftest.py; this is a plain module
(``from tests.helpers import tiny_train_config``), not a test module.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from minbert.bert import BertModel
from minbert.config import BertConfig
from tasks.train_config import NESTED, TrainConfig
from tasks.config_versions import (NESTED_SETTINGS, PER_STREAM_PHRASES, PER_TASK_PRIORS, PHRASES_6, PHRASES_STREAM,
                                  SOFTWARE_KEYS)
from tasks.data.datasets import PairDataset, SentenceDataset
from tasks.data.readers import Example
from tasks.evaluation.ensembling import predict, runs_entries
from tasks.predictions import Predictions, write_logits
from tasks.model import ModelConfig, MultitaskBert
from tasks.objectives import registered_objectives
from tasks.task_file import read_task_file
from tasks.training.loop import Control, Hook, Step, TrainingState

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def tiny_config(**overrides) -> BertConfig:
    """HF's test-size BERT: hidden 32, 2 layers, 4 heads, vocab 99."""
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)
    kw.update(overrides)
    return BertConfig(**kw)


def read_column(name: str, columns: tuple[str, ...], n: int) -> list[tuple[str, ...]]:
    """First n rows of a data/ file (tab-separated), or skip when setup.sh has not linked it."""
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} missing: run `bash setup.sh` to link the data files")
    with open(path, newline="", encoding="utf-8") as f:
        rows = [tuple(r[c].strip() for c in columns) for r in csv.DictReader(f, delimiter="\t")]
    return rows[:n]


class WordTokenizer:
    """Whitespace 'tokenizer' whose ids fit tiny_config's vocabulary of 99 (encode_ids / pad API)."""

    pad_token_id, cls_id, sep_id = 0, 2, 3

    def _words(self, text: str) -> list[int]:
        return [5 + zlib.crc32(w.encode()) % 90 for w in text.split()]

    def encode_ids(self, texts, pairs=None, max_length=None):
        all_ids, all_types = [], []
        for i, text in enumerate(texts):
            ids = [self.cls_id, *self._words(text), self.sep_id]
            types = [0] * len(ids)
            if pairs is not None:
                second = [*self._words(pairs[i]), self.sep_id]
                ids, types = ids + second, types + [1] * len(second)
            if max_length is not None:
                ids, types = ids[:max_length], types[:max_length]
            all_ids.append(ids)
            all_types.append(types)
        return all_ids, all_types

    def pad(self, ids, type_ids=None, pad_to=None):
        width = pad_to if pad_to is not None else max(len(x) for x in ids)
        out = {k: torch.zeros(len(ids), width, dtype=torch.long)
               for k in ("input_ids", "token_type_ids", "attention_mask")}
        for r, seq in enumerate(ids):
            out["input_ids"][r, : len(seq)] = torch.tensor(seq)
            out["attention_mask"][r, : len(seq)] = 1
            if type_ids is not None:
                out["token_type_ids"][r, : len(seq)] = torch.tensor(type_ids[r])
        return out


# ---- tiny_env: a tiny pretrained checkpoint and synthetic task files ----------------------------------------


POSITIVE = ["good", "great", "fun", "superb", "lovely"]
NEGATIVE = ["bad", "awful", "dull", "boring", "poor"]
NEUTRAL = ["movie", "film", "plot", "story", "actor", "scene", "the", "a", "is", "was", "very", "quite"]
QUESTION = ["how", "what", "why", "do", "i", "learn", "cook", "python", "rice", "code", "fast", "best", "way", "to"]
WORDS = POSITIVE + NEGATIVE + NEUTRAL + QUESTION + ["?", ".", "cat", "dog", "sits", "runs", "on", "mat", "park"]


def write_tiny_model(directory: Path) -> Path:
    """A HF-style BERT directory: config.json, model.safetensors (random tiny BERT), vocab.txt (99 tokens)."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config()
    torch.manual_seed(1234)
    model = BertModel(cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    cfg.to_json_file(directory / "config.json")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    vocab += [f"[unused{i}]" for i in range(cfg.vocab_size - len(vocab))]
    assert len(vocab) == cfg.vocab_size
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


def _sentence(rng: random.Random, label: int) -> str:
    """A sentence whose sentiment words say its label (0 = very negative ... 4 = very positive)."""
    pos, neg = {0: (0, 3), 1: (0, 1), 2: (0, 0), 3: (1, 0), 4: (3, 0)}[label]
    words = rng.sample(NEUTRAL, 4) + rng.choices(POSITIVE, k=pos) + rng.choices(NEGATIVE, k=neg)
    rng.shuffle(words)
    return " ".join(words) + " ."


def _question(rng: random.Random) -> str:
    return " ".join(rng.sample(QUESTION, 5)) + " ?"


def write_tiny_data(directory: Path, n_train: int = 48, n_dev: int = 24, n_test: int = 16,
                    quora_test: bool = False) -> Path:
    """CS224N-format task files (tab-separated, unnamed index column) and an NLI file, all synthetic."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)

    def write(name: str, header: list[str], rows: list[list]) -> None:
        lines = ["\t".join(header)] + ["\t".join(str(x) for x in row) for row in rows]
        (directory / name).write_text("\n".join(lines) + "\n")

    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_test)):
        labels = [i % 5 for i in range(n)]
        sst = [[i, f"sst-{split}-{i}", " " + _sentence(rng, y)] + ([y] if split != "test" else [])
               for i, y in enumerate(labels)]
        para, sts = [], []
        for i in range(n):
            a = _question(rng)
            dup = i % 2
            b = a.replace("?", "") + " ?" if dup else _question(rng)
            para.append([i, f"para-{split}-{i}", a, b] + ([f"{float(dup)}"] if split != "test" else []))
            s1 = _sentence(rng, i % 5)
            overlap = i % 6
            s2 = " ".join(s1.split()[:overlap] + rng.sample(NEUTRAL, max(1, 5 - overlap))) + " ."
            sts.append([i, f"sts-{split}-{i}", s1, s2] + ([f"{float(overlap * 5 / 5)}"] if split != "test" else []))
        if split == "test":
            write("ids-sst-test-student.csv", ["0", "", "id", "sentence"], [[i, float(i), *r[1:]] for i, r in enumerate(sst)])
            if quora_test:
                write("quora-test-student.csv", ["", "id", "sentence1", "sentence2"], para)
            write("sts-test-student.csv", ["", "id", "sentence1", "sentence2"], sts)
        else:
            write(f"ids-sst-{split}.csv", ["", "id", "sentence", "sentiment"], sst)
            write(f"quora-{split}.csv", ["", "id", "sentence1", "sentence2", "is_duplicate"], para)
            write(f"sts-{split}.csv", ["", "id", "sentence1", "sentence2", "similarity"], sts)
    phrases = []  # sst-phrases-train.csv: 1 to 4 words, the sentiment words saying the label
    for i in range(2 * n_train):
        y = i % 5
        words = _sentence(rng, y).split()[: 1 + i % 4]
        phrases.append([i, f"phrase-{i}", " ".join(words), y])
    write("sst-phrases-train.csv", ["", "id", "sentence", "sentiment"], phrases)
    nli = ["sent0,sent1,hard_neg"] + [f"{_sentence(rng, 4)},{_sentence(rng, 3)},{_sentence(rng, 0)}"
                                      for _ in range(n_train)]
    (directory / "nli-train.csv").write_text("\n".join(nli) + "\n")
    return directory


def run_tasks(run_dir: Path):
    """The tasks a saved run resolves (tasks.task.Tasks: the package's and its config.json's own)."""
    return runs_entries([run_dir])


def tiny_train_config(env: tuple[Path, Path], out_dir: Path, **overrides) -> TrainConfig:
    """A fast CPU config on the tiny model: 2 epochs of ~15 steps, dropout on (so RNG state matters). Pairs are
    scored in one order without the STS and SST priors and without the SST phrases (the fixtures' best epochs were
    found so; tests of their own cover --symmetric-eval, --sts-prior, --sst-prior and --sst-phrases). A nested
    config given as a mapping (``swa={"epochs": 2}``) sets the fields it names; ``task_files`` declare their tasks
    as --task-file does."""
    pretrained, data = env
    kw = dict(pretrained=str(pretrained), data_dir=str(data), out_dir=str(out_dir), epochs=2, batch_size=8,
              eval_batch_size=16, max_length=32, max_train_examples={}, dev_max_examples={}, lr=1e-3,
              symmetric_eval=False, prior_weights={"sts": 0.0, "sst": 0.0},
              stream_files={"phrases": None}, lr_schedule="warmup_linear", warmup=0.1, log_every=5,
              device="cpu", bf16=False, model=ModelConfig(arch="b1", pair_encoding="cross", fcn_size=16,
                                                          head_dropout=0.1))
    for name, value in overrides.items():
        nested = name in NESTED and isinstance(value, dict)
        kw[name] = dataclasses.replace(kw.get(name, getattr(TrainConfig(), name)), **value) if nested else value
    if kw.get("task_files") and "user_tasks" not in kw:  # as the command line declares them (tasks.arguments)
        kw["user_tasks"] = [read_task_file(f) for f in kw["task_files"]]
    return TrainConfig(**kw)


def phrases(file: str | None = "sst-phrases-train.csv", **settings) -> dict:
    """tiny_train_config's overrides that train the SST phrases as --sst-phrases FILE --sst-phrases-<x> would:
    each setting (``per_epoch``, ``batch_size``, ``min_words``, ``weight``, ``order``) its item of the per-stream
    map that holds it."""
    return {PER_STREAM_PHRASES[k]: {PHRASES_STREAM: v} for k, v in {"file": file, **settings}.items()}


def unversioned(saved: dict) -> dict:
    """A config.json of today (``TrainConfig.to_dict()``) as a run saved before config.json recorded its version
    wrote it: no version, every setting a field of its own ("sts_prior", not "priors": {"sts_weight"}; "sst_phrases",
    not "stream_files": {"phrases"})."""
    old = {k: v for k, v in saved.items() if k not in ("config_version", "prior_weights", "prior_models",
                                                       "stream_files", "stream_min_words", "stream_orders",
                                                       *SOFTWARE_KEYS)}
    for name in set(PER_STREAM_PHRASES.values()) & set(old):
        old[name] = {k: v for k, v in old[name].items() if k != PHRASES_STREAM}
    for flat, (name, field) in NESTED_SETTINGS.items():
        if name == "priors":  # per task since version 6
            path, task = PER_TASK_PRIORS[field]
            old[flat] = saved[path].get(task)
        elif name == "sst_phrases":  # per stream since version 7 (an item left out: SST's declared, as then)
            old[flat] = saved[PER_STREAM_PHRASES[field]].get(PHRASES_STREAM, PHRASES_6[field])
        else:
            old[flat] = saved[name][field]
    for name in {name for name, _ in NESTED_SETTINGS.values()} - {"sst_phrases", "priors"}:
        del old[name]
    spans = old["model"].pop("spans")  # STS's alone then: its own field
    old["model"] = {**old["model"], "sts_scale": spans["sts"]}
    return old


class Interrupt(Exception):
    pass


class StopAt(Hook):
    """Raises after global step ``step`` (mid-epoch) or after epoch ``epoch`` ended: a crash mid-run."""

    def __init__(self, step: int | None = None, epoch: int | None = None):
        self.at_step, self.at_epoch = step, epoch

    def on_step_end(self, state: TrainingState, control: Control, step: Step) -> None:
        if state.global_step == self.at_step:
            raise Interrupt

    def on_epoch_end(self, state: TrainingState, control: Control, record: dict) -> None:
        if state.epoch == self.at_epoch:
            raise Interrupt


# ---- tiny models, batches and datasets ---------------------------------------------------------------------


def make_model(arch: str = "baseline", pair_encoding: str = "siamese", dropout: float | None = None,
               **config) -> MultitaskBert:
    """A tiny random MultitaskBert; ``dropout`` (when given) sets both encoder dropouts."""
    torch.manual_seed(0)
    over = {} if dropout is None else dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    config.setdefault("fcn_size", 16)
    model = MultitaskBert(BertModel(tiny_config(**over)), ModelConfig(arch=arch, pair_encoding=pair_encoding, **config))
    # The real init (std 0.02) through b1's three layers leaves logits within ~1e-6 of
    # each other, where order and equality checks would pass vacuously; spread them.
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and not name.startswith("encoder."):
                m.weight.normal_(0.0, m.in_features ** -0.5)
                m.bias.normal_(0.0, 0.1)
    return model


def tiny_model(arch: str = "baseline", pair_encoding: str = "cross", seed: int = 0, init: float = 0.02,
               **model_config) -> MultitaskBert:
    """A tiny random MultitaskBert without dropout (deterministic forward passes)."""
    torch.manual_seed(seed)
    encoder = BertModel(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    initializer_range=init))
    return MultitaskBert(encoder, ModelConfig(arch=arch, pair_encoding=pair_encoding, fcn_size=16,
                                              head_dropout=0.0, **model_config))


def make_batch(task: str, pair_encoding: str = "cross", n: int = 8, width: int = 7, seed: int = 0) -> dict:
    """A collated-looking batch of n examples with random ids in tiny_config's vocabulary and some padding."""
    g = torch.Generator().manual_seed(seed)

    def side(w: int) -> dict:
        ids = torch.randint(5, 99, (n, w), generator=g)
        ids[:, 0] = 2  # [CLS]
        lengths = torch.randint(3, w + 1, (n,), generator=g)
        lengths[0] = w
        mask = (torch.arange(w)[None, :] < lengths[:, None]).long()  # (n, w)
        return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}

    labels = torch.arange(n) % 5 if task == "sst" else (torch.arange(n) % 2).float()
    if task == "sst" or pair_encoding == "cross":
        batch = side(width)
    else:
        batch = {f"{k}_1": v for k, v in side(width).items()} | {f"{k}_2": v for k, v in side(width - 2).items()}
    batch["labels"] = labels
    return batch


TOK = WordTokenizer()
EVAL_WORDS = "good bad film plot actor slow funny dull script scene music long short great awful".split()


def sentences(n: int, seed: int) -> list[str]:
    """n random sentences of 1..20 words, so that length-sorting reorders them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 21, (n,), generator=g).tolist()
    return [" ".join(EVAL_WORDS[int(i)] for i in torch.randint(len(EVAL_WORDS), (k,), generator=g)) for k in lengths]


def make_dataset(task: str, n: int = 23, labeled: bool = True, mode: str = "siamese"):
    """A tiny tokenized dataset for ``task`` with ids 'x0'..'x{n-1}' in order."""
    a, b = sentences(n, 1), sentences(n, 2)
    if task == "sst":
        return SentenceDataset([Example(f"x{i}", a[i], None, i % 5 if labeled else None) for i in range(n)], TOK)
    label = (lambda i: float(i % 2)) if task == "para" else (lambda i: (i * 7 % 11) / 2.0)
    ex = [Example(f"x{i}", a[i], b[i], label(i) if labeled else None) for i in range(n)]
    return PairDataset(ex, TOK, mode=mode)


# Options that let an objective run on the tiny data (16 examples per task); every other registered objective,
# a new one included, runs with its defaults. None: the test supplies them (distill's teacher files).
TINY_OPTIONS = {
    "distill": None,
    "knn_bert": {"m_most": 2, "m_least": 2, "queue_size": 20, "knn_k": 5},
}
OBJECTIVE_SETTINGS = {name: TINY_OPTIONS.get(name, {}) for name in sorted(registered_objectives())}


# ---- run directories and files ----------------------------------------------------------------------------


def dead_pid() -> int:
    """The pid of a process that has exited (reaped, so nothing runs under it now)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def bad_data(env, tmp: Path, name: str, edit) -> Path:
    data = tmp / "data"
    shutil.copytree(env[1], data)
    path = data / name
    path.write_bytes(edit(path.read_bytes()))
    return data


# ---- MLM checkpoints -------------------------------------------------------------------------------------------


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab_dir(tmp_path, vocab_size=99):
    d = tmp_path / "vocab"
    d.mkdir(exist_ok=True)
    (d / "vocab.txt").write_text("\n".join(SPECIALS + [f"w{i}" for i in range(vocab_size - 5)]) + "\n")
    return d


def hf_config_dict(cfg):
    return {k: v for k, v in cfg.to_dict().items() if k not in ("extra", "attn_implementation")}


def write_hf_checkpoint(tmp_path, state, cfg, name="ckpt"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_config_dict(cfg)))
    (d / "vocab.txt").write_text((write_vocab_dir(tmp_path, cfg.vocab_size) / "vocab.txt").read_text())
    save_file({k: v.contiguous() for k, v in state.items()}, str(d / "model.safetensors"))
    return d


# ---- ensemble members: saved logits of fake runs ---------------------------------------------------------------


ENSEMBLE_N = 400


def ensemble_labels(task, n=ENSEMBLE_N, seed=0):
    g = torch.Generator().manual_seed(seed)
    if task == "sst":
        return torch.randint(0, 5, (n,), generator=g).double()
    if task == "para":
        return torch.randint(0, 2, (n,), generator=g).double()
    return torch.rand(n, generator=g, dtype=torch.float64) * 5


def model_logits(task, labels, quality, seed):
    """quality 1: informative logits with noise; 0: pure noise."""
    g = torch.Generator().manual_seed(seed)
    n = labels.shape[0]
    if task == "sst":
        return quality * 2.0 * torch.nn.functional.one_hot(labels.long(), 5).double() + torch.randn(
            n, 5, generator=g, dtype=torch.float64) * (1.0 if quality else 3.0)
    if task == "para":
        return quality * 2.0 * (2 * labels - 1) + torch.randn(n, generator=g, dtype=torch.float64) * (1.0 if quality else 3.0)
    return quality * labels + torch.randn(n, generator=g, dtype=torch.float64) * (0.7 if quality else 2.0) + 2.5 * (1 - quality)


def write_run_logits(root, name, task, split, ids, logits):
    d = root / name
    preds = predict(task, logits)
    write_logits(d, task, split, Predictions(list(ids), logits.float(), preds.float() if task == "sts" else preds))
    return d


def write_dev_files(data, labels):
    data.mkdir()
    rows = "".join(f"{i}\tsst{i}\ta sentence\t{int(v)}\n" for i, v in enumerate(labels["sst"].tolist()))
    (data / "ids-sst-dev.csv").write_text("\tid\tsentence\tsentiment\n" + rows)
    rows = "".join(f"{i}\tpara{i}\ta\tb\t{float(v)}\n" for i, v in enumerate(labels["para"].tolist()))
    (data / "quora-dev.csv").write_text("\tid\tsentence1\tsentence2\tis_duplicate\n" + rows)
    rows = "".join(f"{i}\tsts{i}\ta\tb\t{v:.3f}\n" for i, v in enumerate(labels["sts"].tolist()))
    (data / "sts-dev.csv").write_text("\tid\tsentence1\tsentence2\tsimilarity\n" + rows)


def make_runs(tmp_path, nested=False):
    """Three runs (two informative, one noise) with dev logits for every task and test logits but para's;
    ``nested``: as a training run lays them out, under run/predictions/."""
    labels = {t: ensemble_labels(t, n=60, seed=10 + k) for k, t in enumerate(("sst", "para", "sts"))}
    labels["sts"] = (labels["sts"] * 1000).round() / 1000  # as written to the data file
    write_dev_files(tmp_path / "data", labels)
    runs = []
    for r, quality in enumerate((1, 1, 0)):
        name = f"run{r}/predictions" if nested else f"run{r}"
        for task in ("sst", "para", "sts"):
            ids = [f"{task}{i}" for i in range(60)]
            x = model_logits(task, labels[task], quality, seed=100 * r + len(task))
            if r == 1:  # another row order: aligned by id
                ids, x = ids[::-1], x.flip(0)
            write_run_logits(tmp_path, name, task, "dev", ids, x)
            if task != "para":  # no quora test file in the shared data
                write_run_logits(tmp_path, name, task, "test", [f"t{i}" for i in range(7)], x[:7])
        runs.append(str(tmp_path / f"run{r}"))
    return runs


# ---- tiny batches of the objective tests (MNR, SimCSE, SMART; SCL, Match-Tuning) --------------------------------

OBJECTIVE_B, OBJECTIVE_T = 6, 7  # batch size, sequence length


def siamese_model(arch: str = "b1", dropout: float = 0.1) -> MultitaskBert:
    torch.manual_seed(0)
    enc = BertModel(tiny_config(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    return MultitaskBert(enc, ModelConfig(arch=arch, fcn_size=16, head_dropout=0.0))


def sides_seq(suffix: str, g: torch.Generator, n: int = OBJECTIVE_B) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 99, (n, OBJECTIVE_T), generator=g)
    mask = torch.ones(n, OBJECTIVE_T, dtype=torch.long)
    mask[0, 4:] = 0  # one padded row: masking is exercised
    ids[mask == 0] = 0
    return {"input_ids" + suffix: ids, "attention_mask" + suffix: mask,
            "token_type_ids" + suffix: torch.zeros(n, OBJECTIVE_T, dtype=torch.long)}


def siamese_batch(task: str, seed: int = 0) -> dict:
    """A hand-made collated batch with the data module's keys."""
    g = torch.Generator().manual_seed(seed)
    ids = [str(i) for i in range(OBJECTIVE_B)]
    if task == "sst":
        return {**sides_seq("", g), "labels": torch.randint(0, 5, (OBJECTIVE_B,), generator=g), "ids": ids}
    if task == "para":
        return {**sides_seq("_1", g), **sides_seq("_2", g), "labels": torch.tensor([1., 0., 1., 1., 0., 0.]), "ids": ids}
    if task == "sts":
        return {**sides_seq("_1", g), **sides_seq("_2", g), "labels": torch.rand(OBJECTIVE_B, generator=g) * 5, "ids": ids}
    if task == "nli":
        return {**sides_seq("_1", g), **sides_seq("_2", g), **sides_seq("_3", g), "ids": ids}
    raise ValueError(task)


def contrast_model(arch: str = "baseline", pair_encoding: str = "siamese") -> MultitaskBert:
    torch.manual_seed(0)
    return MultitaskBert(BertModel(tiny_config()), ModelConfig(arch=arch, pair_encoding=pair_encoding, fcn_size=16))


def _labeled_seq(g: torch.Generator, suffix: str = "", pair: bool = False) -> dict[str, torch.Tensor]:
    """Random ids in tiny_config's vocabulary; row r padded after 4 + r % 3 tokens; token types 0/1 for a pair."""
    ids = torch.randint(5, 99, (OBJECTIVE_B, OBJECTIVE_T), generator=g)
    mask = torch.zeros(OBJECTIVE_B, OBJECTIVE_T, dtype=torch.long)
    for r in range(OBJECTIVE_B):
        mask[r, : 4 + r % 3] = 1
    types = torch.zeros(OBJECTIVE_B, OBJECTIVE_T, dtype=torch.long)
    if pair:
        types[:, 3:] = 1
    return {"input_ids" + suffix: ids * mask, "attention_mask" + suffix: mask, "token_type_ids" + suffix: types * mask}


def labeled_batch(task: str, pair_encoding: str = "siamese") -> dict[str, torch.Tensor]:
    """A labeled batch of B examples: SST classes with repeats, para 0/1 floats, STS scores."""
    g = torch.Generator().manual_seed(1)
    if task == "sst" or pair_encoding == "cross":
        batch = _labeled_seq(g, pair=task != "sst")
    else:
        batch = {**_labeled_seq(g, "_1"), **_labeled_seq(g, "_2")}
    batch["labels"] = {"sst": torch.tensor([0, 1, 0, 2, 1, 4]),
                       "para": torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 0.0]),
                       "sts": torch.linspace(0.0, 5.0, OBJECTIVE_B)}[task]
    return batch


def mlm_batch(n: int = 400, t: int = 40, vocab: int = 1000, seed: int = 0) -> torch.Tensor:
    """Token ids for the MLM tests: [CLS] tokens [SEP] [PAD]... (ids 0..4 are PAD, UNK, CLS, SEP, MASK, as in
    write_vocab_dir), random lengths, token ids 5..vocab-1, one [UNK] in the first row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, t), generator=g)
    lengths = torch.randint(3, t + 1, (n,), generator=g)
    for i, length in enumerate(lengths.tolist()):
        ids[i, 0], ids[i, length - 1] = 2, 3
        ids[i, length:] = 0
    ids[0, 1] = 1
    return ids


# ---- a user's own task: its files and its task file ----

CLASS_WORDS = {0: "awful dull", 1: "fine okay", 2: "great moving"}  # a class is said by its words


def write_csv(path: Path, header: list[str], rows: list[list], delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def three_class_task(folder: Path, n: int = 48, name: str = "topic", labels=None) -> Path:
    """A user's three-class sentence CSV (comma-separated, no id column) and its task file."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in (("train", n), ("dev", n // 2), ("test", n // 4)):
        rows = [[f"the film was {CLASS_WORDS[i % 3]} {i}"] + ([labels(i) if labels else i % 3] if split != "test" else [])
                for i in range(size)]
        write_csv(folder / f"{name}-{split}.csv", ["text"] + (["label"] if split != "test" else []), rows)
    spec = {"name": name, "train": f"{name}-train.csv", "dev": f"{name}-dev.csv", "test": f"{name}-test.csv",
            "text": "text", "label": "label"}
    (folder / f"{name}.json").write_text(json.dumps(spec))
    return folder / f"{name}.json"


def user_task(folder: Path, spec: dict, rows: dict[str, list[list]], header: list | None, delimiter: str = ",",
              suffix: str = "csv", bom: bool = False) -> Path:
    """A user's task as it comes: a file per split (``rows``; ``header`` None: no header line), written with
    ``delimiter`` without CSV quoting (a quote is text) and the task file declaring ``spec``; returns the task
    file's path. The split files are ``<name>-<split>.<suffix>``, named in the spec unless it names them."""
    folder.mkdir(parents=True, exist_ok=True)
    name = spec["name"]
    for split, split_rows in rows.items():
        lines = ([delimiter.join(map(str, header))] if header is not None else []) + [
            delimiter.join(map(str, r)) for r in split_rows]
        text = "\n".join(lines) + "\n"
        (folder / f"{name}-{split}.{suffix}").write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
        spec = {split: f"{name}-{split}.{suffix}", **spec}
    (folder / f"{name}.json").write_text(json.dumps(spec))
    return folder / f"{name}.json"


def tiny_flags(env: tuple[Path, Path], out_dir: Path) -> list[str]:
    """train_multitask.py's flags of a fast run on the tiny model and data (the priors and phrases off)."""
    pretrained, data = env
    return ["--pretrained", str(pretrained), "--data-dir", str(data), "--out-dir", str(out_dir), "--device", "cpu",
            "--no-bf16", "--batch-size", "8", "--eval-batch-size", "16", "--max-length", "32", "--fcn-size", "16",
            "--lr", "1e-3", "--log-every", "2", "--sst-prior", "0", "--sts-prior", "0", "--sst-phrases", "none",
            "--epochs", "1"]
