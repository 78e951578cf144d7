"""Readers for the task CSV files: records, per-file read reports, the CS224N formats, task file names.

The CS224N files (see data/README.md) are tab-separated with an unnamed index
column first; nli-train.csv is comma-separated. Readers parse them with the
csv module, keep every valid row (synthetic Quora ids and index -1 included),
and record every row they skip with its 1-based file line and a reason in a
ReadReport, so nothing is ever dropped silently.

A file whose last record has no line end after it was most likely cut (an STS
score "0.8" cut to "0" still parses): that record is skipped and reported
("file ends without a newline: the last record may be cut") rather than the
file refused, so the rest of the file stays usable and the loss is on record.
No field of the course's files spans lines, so a record over several lines is an
unbalanced quote that swallowed the rows after it: each line it spans is
reported as a skipped row, and a record over more than MAX_RECORD_LINES (5)
lines refuses the whole file with a ValueError naming the line to fix.
A user's files (``FileFormat.multiline``) are read as CSV's standard says: a
quoted field may hold line ends (kept in its text: the tokenizer reads a line
end as a space), so a record over several lines is kept whole when it is
standard CSV (every quoted field closed right before a delimiter or a line end)
of the header's field count; any other is the unbalanced quote above.

Usage:
    examples, report = read_examples("data/ids-sst-dev.csv", ("sentence",), "sentiment", parse_label)
    triplets, report = load_nli("data")
    report.to_dict()   # {"file": ..., "rows": ..., "kept": ..., "skipped": ..., "reasons": {...}, ...}
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)


T = TypeVar("T")


CUT_RECORD = "file ends without a newline: the last record may be cut"


# The key under which ``_read_rows`` gives a parser the row's 1-based file line (no header can name it).
LINE = "\0line"


# No field of the course's files spans lines; a record of theirs over more lines than this, or a user's that is not
# standard CSV, is an unbalanced quote.
MAX_RECORD_LINES = 5


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


# What the course's files are, for the messages about them (a user's own files are named by their task file).
COURSE_FILES = "the CS224N format, see data/README.md"
COURSE_SOURCE = "data/README.md names its public source"


class DataFileMissing(FileNotFoundError):
    """A task file is not where it should be; the message says how to get it: ``about`` says whose file it is
    ("task file X names it"), else it is one of the course's files in --data-dir."""

    def __init__(self, path: str | os.PathLike[str], about: str | None = None) -> None:
        self.path = Path(path)
        super().__init__(
            f"data file not found: {self.path} ({about}); put the file there or correct the path" if about else
            f"data file not found: {self.path}: {course_remedy()}")


def course_remedy() -> str:
    """What to do when a course data file is not where a run looks: name its folder, and, in a checkout (where the
    set-up script is), link it there."""
    link = (" or link the files into data/ with `MINBERT_DATA=DIR bash setup.sh`"
            if (Path(__file__).resolve().parents[2] / "setup.sh").is_file() else "")
    return (f"point --data-dir at the folder holding the CS224N files (data/README.md names each one's public "
            f"source){link}")


@dataclass(frozen=True)
class FileFormat:
    """How a file's text is split into rows and fields.

    ``delimiter``: None reads a tab where the file's first line holds one, else a comma. ``quoting``: CSV quoting
    (a field in double quotes may hold the delimiter, ``""`` is a quote); None: on, except in a tab-separated
    file whose quotes do not pair up as CSV's (GLUE's MRPC: a lone ``"`` inside a sentence), which is read as
    plain text split at the tabs, as GLUE's own readers do. ``header``: the first line names the columns (read by
    name, or by 0-based position); else every line is a row and columns are positions. ``line_ends``: every record
    of the file ends with a line end, so a last one without is cut (the course's files; a user's last line may well
    lack one, as GLUE's CoLA dev file's does). ``multiline``: a quoted field may hold line ends, as CSV's standard
    allows (a user's files); else none does, and a record over several lines is an unbalanced quote (the course's
    files).
    """

    delimiter: str | None = None
    quoting: bool | None = None
    header: bool = True
    line_ends: bool = False
    multiline: bool = False

    def __post_init__(self) -> None:
        if self.delimiter is not None and (len(self.delimiter) != 1 or self.delimiter in "\"\r\n"):
            raise ValueError(f"a delimiter is one character (not a quote or a line end), got {self.delimiter!r}")


COURSE_FORMAT = FileFormat("\t", quoting=True, line_ends=True)  # the CS224N files: tab-separated, CSV quoting


def sniff_delimiter(text: str) -> str:
    """A tab where the first line holds one, else a comma."""
    return "\t" if "\t" in text.split("\n", 1)[0] else ","


def _quotes_pair_up(text: str, delimiter: str, multiline: bool = False) -> bool:
    """Whether CSV quoting reads ``text`` as written: no record runs over a line end (the course's files have no
    field that does), or, where fields may hold line ends (``multiline``), every record that does is standard CSV
    of the first line's field count (``_standard``)."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    lines: list[str] | None = None
    try:
        width = None
        for first, row, error, last in csv_records(reader):  # from line 1: the first record sets the width
            width = len(row) if width is None and row is not None else width
            if last == first:
                continue
            if not multiline or error is not None or len(row) != width:
                return False
            lines = lines if lines is not None else io.StringIO(text, newline="").readlines()
            if not _standard(lines, first, last, delimiter, row):
                return False
        return True
    except csv.Error:
        return False


def _standard(lines: Sequence[str], first: int, last: int, delimiter: str, row: list[str]) -> bool:
    """Whether the record on lines ``first``-``last`` (1-based) of a file's ``lines`` is standard CSV (each quote
    that opens a field closes right before a delimiter or the record's end) and reads as ``row``: a stray quote
    that swallowed the rows after it is not (the lenient reader takes text after a closing quote)."""
    try:
        return next(csv.reader(io.StringIO("".join(lines[first - 1:last]), newline=""), delimiter=delimiter,
                               strict=True)) == row
    except (csv.Error, StopIteration):
        return False


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
    stopped_at_limit: bool = False  # rows were left unread: the limit, not the file's end, ended the reading
    sha256: str = ""  # of the file's bytes: what a resume compares (the run read these data)

    def summary(self, max_listed: int = 10) -> str:
        """One line, e.g. 'data/quora-dev.csv: kept N of M rows; skipped 2: line 17: empty label; ...'."""
        text = f"{self.path}: kept {self.rows_kept} of {self.rows_total} rows"
        if self.stopped_at_limit:
            text += f" (stopped at limit={self.limit})"
        elif self.limit is not None:
            text += f" (the whole file: fewer rows than limit={self.limit})"
        for name, items in (("skipped", self.skipped), ("duplicate ids (kept)", self.duplicate_ids)):
            if items:
                listed = "; ".join(f"line {line}: {reason}" for line, reason in items[:max_listed])
                more = f"; ... and {len(items) - max_listed} more" if len(items) > max_listed else ""
                text += f"; {name} {len(items)}: {listed}{more}"
        return text

    def to_dict(self, max_listed: int = 10) -> dict:
        """The counts as plain JSON values, for a run's metrics.jsonl and config record.

        {"file", "rows" (seen), "kept", "skipped", "duplicate_ids", "limit",
        "reasons": {reason: count} with the row-specific values elided
        (``label '…' out of range 0..4``), "first_skipped": [{"line", "reason"}, ...]}.
        """
        reasons: dict[str, int] = {}
        for _, reason in self.skipped:
            kind = _reason_kind(reason)
            reasons[kind] = reasons.get(kind, 0) + 1
        return {
            "file": self.path, "rows": self.rows_total, "kept": self.rows_kept, "skipped": len(self.skipped),
            "duplicate_ids": len(self.duplicate_ids), "limit": self.limit, "stopped_at_limit": self.stopped_at_limit,
            "sha256": self.sha256, "reasons": reasons,
            "first_skipped": [{"line": line, "reason": reason} for line, reason in self.skipped[:max_listed]],
        }

    @property
    def clean(self) -> bool:
        """True when nothing was skipped and no id repeats (the loader then logs at INFO, not WARNING)."""
        return not self.skipped and not self.duplicate_ids


def _reason_kind(reason: str) -> str:
    """A skip reason without its row's values, so that equal problems count together."""
    reason = re.sub(r" \(record spans lines [^)]*\)$", "", reason)
    reason = re.sub(r"'[^']*'", "'…'", reason)
    return re.sub(r"\bline \d+", "line N", reason)


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


Column = str | int  # a column's header name, or its 0-based position (a file without a header names columns so)


def _read_rows(
    path: str | os.PathLike[str],
    fmt: FileFormat,
    columns: Sequence[Column],
    parse: Callable[[dict[Column, str]], T | str],
    limit: int | None,
    key: Callable[[T], str] | None = None,
    about: str | None = None,
) -> tuple[list[T], ReadReport]:
    """Shared loop of all readers: ``parse`` turns the fields of ``columns`` into an item or a skip reason (a str).

    Columns are looked up by header name, which is what makes the test-student
    header (two index columns ``0``, ```` before ``id``) and the unnamed index
    column harmless, or by 0-based position (an int: in a file without a header, ``fmt.header`` False, the only
    way). ``about`` says whose file it is for the messages (a user's task file); without it, one of the course's
    files.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileMissing(path, about)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of rows or None, got {limit}")
    report = ReadReport(path=str(path), limit=limit)
    items: list[T] = []
    first_line_of_id: dict[str, int] = {}
    data = path.read_bytes()
    report.sha256 = hashlib.sha256(data).hexdigest()
    text = decode_utf8(path, data)
    if not text.strip():
        raise ValueError(f"{path}: the file is empty; " + (f"put the task's rows there ({about})" if about else
                         f"copy the CS224N file there again ({COURSE_SOURCE})"))
    # A record is complete when a line end follows it; a file that stops without
    # one was most likely cut, possibly inside the last field ("0.8" -> "0").
    ends_with_newline = data.endswith((b"\n", b"\r"))
    delimiter = fmt.delimiter or sniff_delimiter(text)
    quoting = fmt.quoting if fmt.quoting is not None else delimiter != "\t" or _quotes_pair_up(text, delimiter,
                                                                                                   fmt.multiline)
    # newline="" lets csv handle quoted fields itself.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter,
                        quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE)
    if fmt.header:
        header = [h.strip() for h in next(reader)]
        beyond = [c for c in columns if isinstance(c, int) and not 0 <= c < len(header)]  # a position, header or not
        if beyond:
            raise ValueError(f"{path}: line 1: no column {beyond[0]} (0-based positions; the header has "
                             f"{len(header)} fields)" + (f"; {about}, and the column" if about else ""))
        missing = [c for c in columns if isinstance(c, str) and c not in header]
        if missing:
            raise ValueError(
                f"{path}: line 1: the header has no column {missing[0]!r} (it has {header}); " + (
                    f"{about}, and its columns {', '.join(map(repr, columns))}" if about else
                    f"this reader needs {', '.join(columns)} ({COURSE_FILES}): is this the right file?"))
        where = {c: c if isinstance(c, int) else header.index(c) for c in columns}
    else:
        first = next(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter,
                                quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE), [])
        header = [str(i) for i in range(len(first))]  # a row's expected fields: as many as the first line's
        beyond = [c for c in columns if not 0 <= c < len(first)]
        if beyond:
            raise ValueError(f"{path}: line 1: no column {beyond[0]} (0-based positions; the line has "
                             f"{len(first)} fields)" + (f"; {about}, and the column" if about else ""))
        where = {c: c for c in columns}
    lines: list[str] | None = None  # the file's lines, read where a user's record spans some
    for (line, row, error, last_line), is_last in _with_last(csv_records(reader)):
        if limit is not None and report.rows_kept >= limit:
            report.stopped_at_limit = True
            break
        whole = False  # a record over several lines that is standard CSV, in a file whose fields may span lines
        if fmt.multiline and last_line > line and error is None and len(row) == len(header):
            lines = lines if lines is not None else io.StringIO(text, newline="").readlines()
            whole = _standard(lines, line, last_line, delimiter, row)
        if last_line - line + 1 > MAX_RECORD_LINES and not whole:
            raise ValueError(
                f"{path}: line {line}: one record runs over lines {line}-{last_line}, most likely an unbalanced "
                "quote (" + ("no field in these files spans lines" if not fmt.multiline else "a field that spans lines "
                             "is quoted, its quote closed right before a delimiter or a line end") +
                f'); fix or delete the stray " on line {line}')
        report.rows_total += 1
        if error is not None:
            reason = f"unparseable CSV ({error})"
        elif is_last and not ends_with_newline and fmt.line_ends:
            reason = CUT_RECORD
        elif not row:
            reason = "blank line"
        elif len(row) != len(header):
            reason = f"expected {len(header)} fields, found {len(row)}"
        elif last_line > line and not whole and any(("\n" in f or "\r" in f) and delimiter in f for f in row):
            # A quote opened in one row and closed on a later one can leave the
            # right field count; a field holding a line end and the delimiter is
            # rows, not text.
            reason = "a quoted field holds line ends and the delimiter"
        else:
            parsed = parse({**{c: row[i] for c, i in where.items()}, LINE: str(line)})
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
        if last_line > line and not whole:
            # An unbalanced quote swallows the following rows into this record:
            # each line it took is a row lost, reported under its own number.
            reason += f" (record spans lines {line}-{last_line}: an unbalanced quote?)"
        report.skipped.append((line, reason))
        for swallowed in range(line + 1, last_line + 1 if not whole else line + 1):
            report.rows_total += 1
            report.skipped.append((swallowed, f"swallowed by the unbalanced quote of the record on line {line}"))
    if report.rows_total == 0:
        raise ValueError(f"{path}: has a header but no rows; " + (f"put the task's rows there ({about})" if about
                         else f"copy the CS224N file there again ({COURSE_SOURCE})"))
    return items, report


def decode_utf8(where: str | os.PathLike[str], data: bytes) -> str:
    """Text of ``data`` (utf-8-sig drops a BOM some editors add); other encodings are a ValueError naming
    ``where`` (a file, "stdin"), the line and the column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = e.object.count(b"\n", 0, e.start) + 1  # e.object: the bytes after any BOM
        column = e.start - e.object.rfind(b"\n", 0, e.start)
        raise ValueError(f"{where}: line {line}: bytes that are not UTF-8 (byte 0x{e.object[e.start]:02x} at "
                         f"column {column}); save the text as UTF-8") from None


def _with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """Each item with a flag that is True for the last one (one item of lookahead)."""
    it = iter(items)
    try:
        previous = next(it)
    except StopIteration:
        return
    for item in it:
        yield previous, False
        previous = item
    yield previous, True


_CONTROL = {c: None for c in (*range(0x20), *range(0x7F, 0xA0))}  # C0, DEL, C1


def blank(text: str) -> bool:
    """Whether ``text`` holds nothing but white space and control characters (NUL bytes, escapes): no text."""
    return not text.translate(_CONTROL).strip()


def _text(fields: dict[Column, str], column: Column, problems: list[str]) -> str:
    # The SST files put a space before every sentence; other files have stray
    # trailing spaces. Neither carries meaning.
    value = fields[column].strip()
    if blank(value):
        problems.append(f"empty {column}")
    return value


def class_label(raw: str, num_classes: int, problems: list[str]) -> int | None:
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


def read_examples(
    path: str | os.PathLike[str],
    text_columns: Sequence[Column],
    label_column: Column | None,
    parse_label: Callable[[str, list[str]], Any] | None,
    *,
    id_column: Column | None = "id",
    fmt: FileFormat = COURSE_FORMAT,
    limit: int | None = None,
    about: str | None = None,
) -> tuple[list[Example], ReadReport]:
    """Read a task file: one text column (a sentence) or two (a pair), and a label unless ``label_column`` is None.

    ``parse_label(raw, problems)`` gives a label or appends why it cannot (the row is then skipped and reported);
    ``id_column`` None numbers the rows by their file line. ``fmt``: how the file is split (the course's files':
    tab-separated with CSV quoting and a header); ``about``: whose file it is, for the messages.
    """
    if len(text_columns) not in (1, 2):
        raise ValueError(f"a task file has one text column or two, got {list(text_columns)}")

    def parse(fields: dict[Column, str]) -> Example | str:
        problems: list[str] = []
        ex_id = _text(fields, id_column, problems) if id_column is not None else fields[LINE]
        texts = [_text(fields, c, problems) for c in text_columns]
        y = parse_label(fields[label_column], problems) if label_column is not None else None
        return ", ".join(problems) if problems else Example(ex_id, texts[0], texts[1] if len(texts) == 2 else None, y)

    columns = ([id_column] if id_column is not None else []) + list(text_columns) + (
        [label_column] if label_column is not None else [])
    return _read_rows(path, fmt, columns, parse, limit, key=lambda e: e.id, about=about)


def read_labels(path: str | os.PathLike[str], label_column: Column, *, fmt: FileFormat = COURSE_FORMAT,
                about: str | None = None) -> tuple[list[tuple[int, str]], ReadReport]:
    """(1-based file line, label cell stripped) of every row with a label, read by the same loop as the examples
    (a user's task infers its kind and classes from them: tasks/task_file.py); an empty cell is a skipped row."""

    def parse(fields: dict[Column, str]) -> tuple[int, str] | str:
        raw = fields[label_column].strip()
        return (int(fields[LINE]), raw) if raw else "empty label"

    return _read_rows(path, fmt, [label_column], parse, None, about=about)


def read_nli(path: str | os.PathLike[str], *, limit: int | None = None) -> tuple[list[Triplet], ReadReport]:
    """Read nli-train.csv (comma-separated, csv quoting): sent0, sent1, hard_neg (may be empty -> None)."""

    def parse(fields: dict[str, str]) -> Triplet | str:
        problems: list[str] = []
        anchor = _text(fields, "sent0", problems)
        positive = _text(fields, "sent1", problems)
        negative = fields["hard_neg"].strip() or None
        return ", ".join(problems) if problems else Triplet(anchor, positive, negative)

    return _read_rows(path, FileFormat(",", quoting=True, line_ends=True), ["sent0", "sent1", "hard_neg"], parse,
                      limit)


NLI_FILE = "nli-train.csv"


def log_report(report: ReadReport) -> None:
    """The report's one-line summary in the log: info when nothing was skipped, else a warning."""
    if report.clean:
        logger.info(report.summary())
    else:
        logger.warning(report.summary())


def load_nli(data_dir: str | os.PathLike[str], limit: int | None = None, file: str = NLI_FILE
             ) -> tuple[list[Triplet], ReadReport]:
    """Read ``data_dir/file`` (the triplets a task declares: STS's nli-train.csv) and log its ReadReport (raises
    DataFileMissing when absent)."""
    triplets, report = read_nli(Path(data_dir) / file, limit=limit)
    log_report(report)
    return triplets, report

