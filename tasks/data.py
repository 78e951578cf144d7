"""Data for the multitask tasks: CSV readers, tokenized datasets, dynamic-padding collate, length buckets.

The CS224N files (see data/README.md) are tab-separated with an unnamed index
column first; nli-train.csv is comma-separated. Readers parse them with the
csv module, keep every valid row (synthetic Quora ids and index -1 included),
and record every row they skip with its 1-based file line and a reason in a
ReadReport, so nothing is ever dropped silently. Datasets tokenize once up
front; ``collate(indices)`` only pads, to the longest sequence of the batch.

Usage:
    examples, report = load_split("sst", "train", "data")
    ds = SentenceDataset(examples, tokenizer, max_length=128)
    for indices in length_bucketed_batches(ds.lengths, 32, shuffle=True, generator=g):
        batch = move_batch(ds.collate(indices), device)
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypeVar

import torch

logger = logging.getLogger(__name__)

T = TypeVar("T")

# ---- records ------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One row of a task file: a sentence (text_b None) or a sentence pair; label None when unlabeled."""

    id: str
    text_a: str
    text_b: str | None = None
    label: int | float | None = None


@dataclass(frozen=True)
class Triplet:
    """One NLI row: anchor, an entailed sentence, and an optional contradiction (hard negative)."""

    anchor: str
    positive: str
    negative: str | None


class DataFileMissing(FileNotFoundError):
    """A task file is not where it should be; the message says how to get it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        super().__init__(
            f"data file not found: {self.path}. Run `bash setup.sh` to link ../shared/data "
            f"(or set MINBERT_DATA=/dir/with/csvs before running it), or copy the CS224N file to {self.path}."
        )
        # OSError.filename stays unset: setting it would replace this message in str(err).


@dataclass
class ReadReport:
    """What a reader did with a file: rows seen, rows kept, and each skipped row with its reason.

    ``skipped`` and ``duplicate_ids`` hold (1-based file line, reason). Duplicate
    ids are kept (the row itself is valid) but reported, because prediction
    files are keyed by id.
    """

    path: str
    rows_total: int = 0
    rows_kept: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)
    duplicate_ids: list[tuple[int, str]] = field(default_factory=list)
    limit: int | None = None

    def summary(self, max_listed: int = 10) -> str:
        """One line, e.g. 'data/quora-dev.csv: kept 20212 of 20214 rows; skipped 2: line 2577: empty label; ...'."""
        text = f"{self.path}: kept {self.rows_kept} of {self.rows_total} rows"
        if self.limit is not None:
            text += f" (stopped at limit={self.limit})"
        for name, items in (("skipped", self.skipped), ("duplicate ids (kept)", self.duplicate_ids)):
            if items:
                listed = "; ".join(f"line {line}: {reason}" for line, reason in items[:max_listed])
                more = f"; ... and {len(items) - max_listed} more" if len(items) > max_listed else ""
                text += f"; {name} {len(items)}: {listed}{more}"
        return text

    @property
    def clean(self) -> bool:
        """True when nothing was skipped and no id repeats (the loader then logs at INFO, not WARNING)."""
        return not self.skipped and not self.duplicate_ids


# ---- CSV reading ------------------------------------------------------------------


def csv_records(reader) -> Iterator[tuple[int, list[str] | None, str | None, int]]:
    """(first line, row, csv error, last line) for each record after the header, lines 1-based.

    A record starts on the line after the previous one ended: quoted fields may
    span lines, so ``reader.line_num`` alone is only the record's last line. A
    record the csv module cannot parse comes as (line, None, error text, line).
    """
    end_of_previous = reader.line_num
    while True:
        line = end_of_previous + 1
        try:
            row, error = next(reader), None
        except StopIteration:
            return
        except csv.Error as e:
            row, error = None, str(e)
        end_of_previous = reader.line_num
        yield line, row, error, end_of_previous


def _read_rows(
    path: str | os.PathLike[str],
    delimiter: str,
    columns: Sequence[str],
    parse: Callable[[dict[str, str]], T | str],
    limit: int | None,
    key: Callable[[T], str] | None = None,
) -> tuple[list[T], ReadReport]:
    """Shared loop of all readers: ``parse`` turns the named fields into an item or a skip reason (a str).

    Columns are looked up by header name, which is what makes the test-student
    header (two index columns ``0``, ```` before ``id``) and the unnamed index
    column harmless.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    report = ReadReport(path=str(path), limit=limit)
    items: list[T] = []
    first_line_of_id: dict[str, int] = {}
    # newline="" lets csv handle quoted fields itself; utf-8-sig drops a BOM some editors add.
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ValueError(f"{path}: the file is empty; expected a header row") from None
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}: header {header} lacks the column(s) {missing}; is this the right file?")
        where = {c: header.index(c) for c in columns}
        for line, row, error, last_line in csv_records(reader):
            if limit is not None and report.rows_kept >= limit:
                break
            if error is not None:
                reason = f"unparseable CSV ({error})"
            report.rows_total += 1
            if row is None:
                pass
            elif not row:
                reason = "blank line"
            elif len(row) != len(header):
                reason = f"expected {len(header)} fields, found {len(row)}"
            else:
                parsed = parse({c: row[i] for c, i in where.items()})
                if not isinstance(parsed, str):
                    items.append(parsed)
                    report.rows_kept += 1
                    if key is not None:
                        k = key(parsed)
                        if k in first_line_of_id:
                            report.duplicate_ids.append((line, f"id {k} also on line {first_line_of_id[k]}"))
                        else:
                            first_line_of_id[k] = line
                    continue
                reason = parsed
            if last_line > line:
                # An unbalanced quote can swallow the following rows into this
                # record; naming the span shows which rows went with it.
                reason += f" (record spans lines {line}-{last_line})"
            report.skipped.append((line, reason))
    return items, report


def _text(fields: dict[str, str], column: str, problems: list[str]) -> str:
    # The SST files put a space before every sentence; other files have stray
    # trailing spaces. Neither carries meaning.
    value = fields[column].strip()
    if not value:
        problems.append(f"empty {column}")
    return value


def _class_label(raw: str, num_classes: int, problems: list[str]) -> int | None:
    raw = raw.strip()
    if not raw:
        problems.append("empty label")
        return None
    try:
        value = float(raw)  # the Quora files write classes as "0.0" / "1.0"
    except ValueError:
        problems.append(f"label {raw!r} is not a number")
        return None
    if not math.isfinite(value) or value != int(value):
        problems.append(f"label {raw!r} is not an integer class")
        return None
    if not 0 <= value < num_classes:
        problems.append(f"label {raw!r} out of range 0..{num_classes - 1}")
        return None
    return int(value)


def _similarity_label(raw: str, problems: list[str]) -> float | None:
    raw = raw.strip()
    if not raw:
        problems.append("empty label")
        return None
    try:
        value = float(raw)
    except ValueError:
        problems.append(f"label {raw!r} is not a number")
        return None
    if not 0.0 <= value <= 5.0:  # also rejects nan
        problems.append(f"label {raw!r} out of range [0, 5]")
        return None
    return value


def read_sentences(
    path: str | os.PathLike[str],
    labeled: bool,
    num_classes: int,
    *,
    label_column: str = "sentiment",
    limit: int | None = None,
) -> tuple[list[Example], ReadReport]:
    """Read a single-sentence file (SST: num_classes=5, CFIMDB: 2); columns id, sentence[, sentiment]."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes}")

    def parse(fields: dict[str, str]) -> Example | str:
        problems: list[str] = []
        ex_id = _text(fields, "id", problems)
        text = _text(fields, "sentence", problems)
        label = _class_label(fields[label_column], num_classes, problems) if labeled else None
        return ", ".join(problems) if problems else Example(ex_id, text, None, label)

    columns = ["id", "sentence"] + ([label_column] if labeled else [])
    return _read_rows(path, "\t", columns, parse, limit, key=lambda e: e.id)


_PAIR_LABEL_COLUMN = {"binary": "is_duplicate", "similarity": "similarity"}


def read_pairs(
    path: str | os.PathLike[str],
    label: Literal["binary", "similarity"] | None,
    *,
    label_column: str | None = None,
    limit: int | None = None,
) -> tuple[list[Example], ReadReport]:
    """Read a sentence-pair file: Quora (label="binary", 0/1 int) or STS ("similarity", float in [0, 5]).

    ``label=None`` reads an unlabeled (test-student) file. Columns: id,
    sentence1, sentence2 and the label column (is_duplicate / similarity by default).
    """
    if label not in (None, "binary", "similarity"):
        raise ValueError(f"label must be 'binary', 'similarity' or None, got {label!r}")
    if label is not None and label_column is None:
        label_column = _PAIR_LABEL_COLUMN[label]

    def parse(fields: dict[str, str]) -> Example | str:
        problems: list[str] = []
        ex_id = _text(fields, "id", problems)
        a = _text(fields, "sentence1", problems)
        b = _text(fields, "sentence2", problems)
        y: int | float | None = None
        if label == "binary":
            y = _class_label(fields[label_column], 2, problems)
        elif label == "similarity":
            y = _similarity_label(fields[label_column], problems)
        return ", ".join(problems) if problems else Example(ex_id, a, b, y)

    columns = ["id", "sentence1", "sentence2"] + ([label_column] if label is not None else [])
    return _read_rows(path, "\t", columns, parse, limit, key=lambda e: e.id)


def read_nli(path: str | os.PathLike[str], *, limit: int | None = None) -> tuple[list[Triplet], ReadReport]:
    """Read nli-train.csv (comma-separated, csv quoting): sent0, sent1, hard_neg (may be empty -> None)."""

    def parse(fields: dict[str, str]) -> Triplet | str:
        problems: list[str] = []
        anchor = _text(fields, "sent0", problems)
        positive = _text(fields, "sent1", problems)
        negative = fields["hard_neg"].strip() or None
        return ", ".join(problems) if problems else Triplet(anchor, positive, negative)

    return _read_rows(path, ",", ["sent0", "sent1", "hard_neg"], parse, limit)


# ---- task files ----------------------------------------------------------------------

TASK_FILES: dict[str, dict[str, str]] = {
    "sst": {"train": "ids-sst-train.csv", "dev": "ids-sst-dev.csv", "test": "ids-sst-test-student.csv"},
    "para": {"train": "quora-train.csv", "dev": "quora-dev.csv", "test": "quora-test-student.csv"},
    "sts": {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test-student.csv"},
    "cfimdb": {"train": "ids-cfimdb-train.csv", "dev": "ids-cfimdb-dev.csv", "test": "ids-cfimdb-test-student.csv"},
}
NLI_FILE = "nli-train.csv"
SPLITS = ("train", "dev", "test")


def _log_report(report: ReadReport) -> None:
    if report.clean:
        logger.info(report.summary())
    else:
        logger.warning(report.summary())


def load_split(
    task: str, split: str, data_dir: str | os.PathLike[str], limit: int | None = None
) -> tuple[list[Example], ReadReport] | None:
    """Read one task split from ``data_dir`` and log its ReadReport.

    Test files are unlabeled (``*-test-student.csv``). A missing train/dev file
    raises DataFileMissing; a missing test file returns None after a warning,
    so that writing predictions skips that task instead of crashing (there is
    no quora-test-student.csv in the shared data). ``limit`` keeps the first N
    valid rows, for smoke runs.
    """
    if task not in TASK_FILES:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASK_FILES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    path = Path(data_dir) / TASK_FILES[task][split]
    if split == "test" and not path.is_file():
        logger.warning("no test file for task %r at %s; its test predictions will be skipped", task, path)
        return None
    labeled = split != "test"
    if task == "sst":
        result = read_sentences(path, labeled, 5, limit=limit)
    elif task == "cfimdb":
        result = read_sentences(path, labeled, 2, limit=limit)
    elif task == "para":
        result = read_pairs(path, "binary" if labeled else None, limit=limit)
    else:
        result = read_pairs(path, "similarity" if labeled else None, limit=limit)
    _log_report(result[1])
    return result


def load_nli(data_dir: str | os.PathLike[str], limit: int | None = None) -> tuple[list[Triplet], ReadReport]:
    """Read ``data_dir/nli-train.csv`` and log its ReadReport (raises DataFileMissing when absent)."""
    triplets, report = read_nli(Path(data_dir) / NLI_FILE, limit=limit)
    _log_report(report)
    return triplets, report


# ---- tokenized datasets -------------------------------------------------------------------


class TokenizerLike(Protocol):
    """The part of minbert.tokenizer.BertTokenizer the datasets use."""

    pad_token_id: int

    def encode_ids(
        self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None
    ) -> tuple[list[list[int]], list[list[int]]]: ...

    def pad(
        self, ids: list[list[int]], type_ids: list[list[int]] | None = None, pad_to: int | None = None
    ) -> dict[str, torch.Tensor]: ...


def _labels_tensor(labels: Sequence[int | float | None], dtype: torch.dtype) -> torch.Tensor | None:
    present = [y is not None for y in labels]
    if not any(present):
        return None
    if not all(present):
        # Half-labeled data would silently train on a subset; a reader never produces it.
        raise ValueError(f"{present.count(False)} of {len(labels)} examples lack a label; label all or none")
    return torch.tensor(labels, dtype=dtype)  # (N,)


class _TokenizedDataset(torch.utils.data.Dataset):
    """Common parts: example ids, labels, lengths, padding.

    Items are their own indices, so ``DataLoader(ds, batch_sampler=batches,
    collate_fn=ds.collate)`` works; the token ids live in the dataset and
    ``collate`` only pads.
    """

    ids: list[str]
    lengths: list[int]
    labels: torch.Tensor | None

    def __init__(self, tokenizer: TokenizerLike, pad_to_multiple_of: int | None) -> None:
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be positive or None, got {pad_to_multiple_of}")
        self.tokenizer = tokenizer
        self.pad_to_multiple_of = pad_to_multiple_of

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> int:
        return index

    def _pad(self, ids: list[list[int]], type_ids: list[list[int]], suffix: str = "") -> dict[str, torch.Tensor]:
        pad_to = None
        if self.pad_to_multiple_of is not None:
            # Tensor cores like widths that are multiples of 8; costs a few pad tokens.
            longest = max(len(x) for x in ids)
            pad_to = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        padded = self.tokenizer.pad(ids, type_ids, pad_to=pad_to)
        return {f"{k}{suffix}": v for k, v in padded.items()}

    def _start_batch(self, indices: Sequence[int]) -> tuple[list[int], dict[str, object]]:
        idx = [int(i) for i in indices]
        if not idx:
            raise ValueError("collate got an empty batch")
        batch: dict[str, object] = {"ids": [self.ids[i] for i in idx]}
        if self.labels is not None:
            batch["labels"] = self.labels[idx]  # (B,)
        return idx, batch


class SentenceDataset(_TokenizedDataset):
    """Single sentences (SST, CFIMDB), tokenized once.

    Batch keys: ids (list[str]), input_ids, attention_mask, token_type_ids
    (B, T) long, labels (B,) of ``label_dtype`` (absent when unlabeled).
    """

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: TokenizerLike,
        max_length: int | None = None,
        label_dtype: torch.dtype = torch.long,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        super().__init__(tokenizer, pad_to_multiple_of)
        self.ids = [e.id for e in examples]
        self.input_ids, self.type_ids = tokenizer.encode_ids([e.text_a for e in examples], max_length=max_length)
        self.labels = _labels_tensor([e.label for e in examples], label_dtype)
        self.lengths = [len(x) for x in self.input_ids]

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        idx, batch = self._start_batch(indices)
        batch.update(self._pad([self.input_ids[i] for i in idx], [self.type_ids[i] for i in idx]))
        return batch


class PairDataset(_TokenizedDataset):
    """Sentence pairs (Quora, STS), tokenized once.

    mode="siamese": each side encoded alone; batch keys input_ids_1,
    attention_mask_1, token_type_ids_1 and the same with _2.
    mode="cross": one "[CLS] a [SEP] b [SEP]" encoding with token types 0/1;
    batch keys input_ids, attention_mask, token_type_ids.
    Both add ids and labels (float by default: BCE targets for Quora, scores
    for STS). ``lengths`` is the longer side for siamese, the pair for cross.
    """

    def __init__(
        self,
        examples: Sequence[Example],
        tokenizer: TokenizerLike,
        mode: Literal["siamese", "cross"] = "siamese",
        max_length: int | None = None,
        label_dtype: torch.dtype = torch.float32,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if mode not in ("siamese", "cross"):
            raise ValueError(f"mode must be 'siamese' or 'cross', got {mode!r}")
        no_pair = [e.id for e in examples if e.text_b is None]
        if no_pair:
            raise ValueError(f"{len(no_pair)} examples have no second sentence (first: {no_pair[0]!r})")
        super().__init__(tokenizer, pad_to_multiple_of)
        self.mode = mode
        self.ids = [e.id for e in examples]
        a = [e.text_a for e in examples]
        b = [e.text_b for e in examples]
        if mode == "siamese":
            self.input_ids_1, self.type_ids_1 = tokenizer.encode_ids(a, max_length=max_length)
            self.input_ids_2, self.type_ids_2 = tokenizer.encode_ids(b, max_length=max_length)
            self.lengths = [max(len(x), len(y)) for x, y in zip(self.input_ids_1, self.input_ids_2)]
        else:
            self.input_ids, self.type_ids = tokenizer.encode_ids(a, pairs=b, max_length=max_length)
            self.lengths = [len(x) for x in self.input_ids]
        self.labels = _labels_tensor([e.label for e in examples], label_dtype)

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        idx, batch = self._start_batch(indices)
        if self.mode == "siamese":
            batch.update(self._pad([self.input_ids_1[i] for i in idx], [self.type_ids_1[i] for i in idx], "_1"))
            batch.update(self._pad([self.input_ids_2[i] for i in idx], [self.type_ids_2[i] for i in idx], "_2"))
        else:
            batch.update(self._pad([self.input_ids[i] for i in idx], [self.type_ids[i] for i in idx]))
        return batch


class TripletDataset(_TokenizedDataset):
    """NLI triplets, tokenized once: _1 anchor, _2 positive, _3 hard negative.

    The _3 keys appear only when every triplet of the batch has a negative, so
    an objective can rely on them being complete. ids are the row positions.
    """

    def __init__(
        self,
        triplets: Sequence[Triplet],
        tokenizer: TokenizerLike,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        super().__init__(tokenizer, pad_to_multiple_of)
        self.ids = [str(i) for i in range(len(triplets))]
        self.labels = None
        self.input_ids_1, self.type_ids_1 = tokenizer.encode_ids([t.anchor for t in triplets], max_length=max_length)
        self.input_ids_2, self.type_ids_2 = tokenizer.encode_ids([t.positive for t in triplets], max_length=max_length)
        have_neg = [i for i, t in enumerate(triplets) if t.negative is not None]
        neg_ids, neg_types = tokenizer.encode_ids([triplets[i].negative for i in have_neg], max_length=max_length)
        self.input_ids_3: list[list[int] | None] = [None] * len(triplets)
        self.type_ids_3: list[list[int] | None] = [None] * len(triplets)
        for i, ids, types in zip(have_neg, neg_ids, neg_types):
            self.input_ids_3[i], self.type_ids_3[i] = ids, types
        self.lengths = [
            max(len(a), len(p), len(n) if n is not None else 0)
            for a, p, n in zip(self.input_ids_1, self.input_ids_2, self.input_ids_3)
        ]

    def collate(self, indices: Sequence[int]) -> dict[str, object]:
        idx, batch = self._start_batch(indices)
        batch.update(self._pad([self.input_ids_1[i] for i in idx], [self.type_ids_1[i] for i in idx], "_1"))
        batch.update(self._pad([self.input_ids_2[i] for i in idx], [self.type_ids_2[i] for i in idx], "_2"))
        if all(self.input_ids_3[i] is not None for i in idx):
            batch.update(self._pad([self.input_ids_3[i] for i in idx], [self.type_ids_3[i] for i in idx], "_3"))
        return batch


def move_batch(batch: dict[str, object], device: torch.device | str) -> dict[str, object]:
    """Tensors to ``device`` (non_blocking, overlaps with compute from pinned memory); other values as they are."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ---- length bucketing -----------------------------------------------------------------


def length_bucketed_batches(
    lengths: Sequence[int],
    batch_size: int,
    shuffle: bool,
    generator: torch.Generator | None = None,
    bucket_batches: int = 50,
) -> list[list[int]]:
    """Batches of indices in which examples of similar length share a batch.

    shuffle=True (training): random permutation; within each chunk of
    ``bucket_batches * batch_size`` examples sort by length and cut into
    batches; then shuffle the batch order. The batches stay random in
    composition across chunks and epochs but carry far less padding.
    ``bucket_batches=1`` is plain random batching. ``generator=None`` uses
    torch's global RNG.

    shuffle=False (evaluation): all indices sorted by length, longest first
    (ties by index, so deterministic); callers restore the file order through
    the batch "ids". Every index appears exactly once either way.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if bucket_batches < 1:
        raise ValueError(f"bucket_batches must be at least 1 (1 = no bucketing), got {bucket_batches}")
    n = len(lengths)
    if not shuffle:
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
        return [order[s : s + batch_size] for s in range(0, n, batch_size)]
    perm = torch.randperm(n, generator=generator).tolist()
    chunk = bucket_batches * batch_size
    batches: list[list[int]] = []
    for c in range(0, n, chunk):
        # Chunks are a whole number of batches, so only the very last batch can be short.
        part = sorted(perm[c : c + chunk], key=lambda i: lengths[i]) if bucket_batches > 1 else perm[c : c + chunk]
        batches.extend(part[s : s + batch_size] for s in range(0, len(part), batch_size))
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]


def padding_ratio(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Pad tokens / real tokens when each batch is padded to its longest example (0.0 = no waste)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches if b)
    return (padded - real) / real if real else 0.0
