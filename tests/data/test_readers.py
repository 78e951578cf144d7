"""Tests of tasks/data/readers.py: the CSV readers, their per-file reports, and the clear errors on bad files."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from tasks.task import get_task, load_split
from tasks.data.readers import (
    MAX_RECORD_LINES,
    DataFileMissing,
    Example,
    FileFormat,
    Triplet,
    read_examples,
    read_nli,
)
from tests.helpers import DATA as REAL_DATA


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---- readers ---------------------------------------------------------------------


def test_doubled_quotes_leading_spaces_and_float_labels(tmp_path):
    """CSV doubled quotes become one quote, leading/trailing spaces are stripped, '3.0' reads as class 3."""
    path = write(
        tmp_path / "sst.csv",
        [
            "\tid\tsentence\tsentiment",
            "0\ta1\t It 's a lovely film .\t3.0",
            '1\ta2\t"""Which is correct? Do I need """"the"""" here?"""\t4',
            '2\ta3\t" """""" I vaguely remember Ben ."\t0',
        ],
    )
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [e.text_a for e in examples] == [
        "It 's a lovely film .",
        '"Which is correct? Do I need ""the"" here?"',
        '""" I vaguely remember Ben .',
    ]
    assert [e.label for e in examples] == [3, 4, 0]
    assert all(type(e.label) is int for e in examples)
    assert report.rows_kept == report.rows_total == 3 and report.skipped == []


def test_malformed_rows_reported_with_file_line_numbers(tmp_path):
    """Each bad row is skipped with its 1-based file line and reason; kept + skipped == total; summary lists them."""
    path = write(
        tmp_path / "ids-sst-dev.csv",
        [
            "\tid\tsentence\tsentiment",  # line 1
            "0\ta1\tgood one\t3",  # 2 kept
            "1\ta2\tmissing label column",  # 3 too few fields
            "2\ta3\tempty label\t",  # 4
            "3\ta4\tout of range\t7",  # 5
            '4\ta5\t"a quoted field that spans\ntwo lines"\t2.0',  # 6-7 kept
            "5\ta6\tnot a number\tx",  # 8
            "6\ta7\t   \t1",  # 9 empty sentence
            "7\ta8\thalf a class\t2.5",  # 10
        ],
    )
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [e.id for e in examples] == ["a1", "a5"]
    assert examples[1].text_a == "a quoted field that spans\ntwo lines"
    assert [line for line, _ in report.skipped] == [3, 4, 5, 8, 9, 10]
    reasons = dict(report.skipped)
    assert "expected 4 fields, found 3" in reasons[3]
    assert reasons[4] == "empty label"
    assert "out of range" in reasons[5]
    assert "not a number" in reasons[8]
    assert reasons[9] == "empty sentence"
    assert "not an integer class" in reasons[10]
    assert report.rows_kept + len(report.skipped) == report.rows_total == 8
    summary = report.summary()
    assert summary.startswith(f"{path}: kept 2 of 8 rows; skipped 6: line 3: ")
    assert "line 4: empty label" in summary and "line 10: " in summary


def test_unbalanced_quote_reports_each_swallowed_line(tmp_path):
    """A quote that never closes swallows the next rows: every line it spans is a skipped row with its own number."""
    path = write(
        tmp_path / "broken.csv",
        ["\tid\tsentence\tsentiment", "0\ta\tok\t1", '1\tb\t"unterminated\t4', "2\tc\tswallowed\t0", "3\td\tlast\t2"],
    )
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [e.id for e in examples] == ["a"]
    assert [line for line, _ in report.skipped] == [3, 4, 5]
    assert report.rows_total == 4 and report.rows_kept + len(report.skipped) == report.rows_total
    reasons = dict(report.skipped)
    assert "record spans lines 3-5" in reasons[3]
    assert reasons[4] == reasons[5] == "swallowed by the unbalanced quote of the record on line 3"


def test_swallowed_rows_that_happen_to_parse_are_not_kept(tmp_path):
    """A stray quote closed on a later line can leave the right field count: a field that holds a line end and
    the delimiter is swallowed rows, not text, so both lines are skipped."""
    path = write(
        tmp_path / "broken.csv",
        ["\tid\tsentence\tsentiment", '1\tb\t"stray\t4', '2\tc\tclosed here"\t0', "3\td\tfine\t2"],
    )
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [e.id for e in examples] == ["d"]
    assert [line for line, _ in report.skipped] == [2, 3] and report.rows_total == 3


def test_record_swallowing_more_than_five_lines_refuses_the_file(tmp_path):
    """One record over more than 5 physical lines is an unbalanced quote, not data: ValueError naming file and line."""
    rows = ["\tid\tsentence\tsentiment", "0\ta\tok\t1", '1\tb\t"unterminated\t4']
    rows += [f"{i}\tr{i}\tswallowed\t0" for i in range(2, 7)]  # lines 4-8: the record spans 3-8, six lines
    path = write(tmp_path / "ids-sst-dev.csv", rows)
    with pytest.raises(ValueError) as err:
        get_task("sst").read("train", ".", path=path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "line 3" in message and "quote" in message
    five = write(tmp_path / "five.csv", rows[:7])  # spans lines 3-7: five lines, reported, not refused
    assert [line for line, _ in get_task("sst").read("train", ".", path=five)[1].skipped] == [3, 4, 5, 6, 7]


def test_label_ranges_per_task(tmp_path):
    """CFIMDB accepts only 0/1, Quora only 0/1, STS only floats in [0, 5]; violations are skipped with a reason."""
    cf = write(tmp_path / "cf.csv", ["\tid\tsentence\tsentiment", "0\tc1\tok\t1", "1\tc2\tbad\t2"])
    examples, report = get_task("cfimdb").read("train", ".", path=cf)
    assert [e.label for e in examples] == [1] and report.skipped == [(3, "label '2' out of range 0..1")]

    q = write(
        tmp_path / "q.csv",
        ["\tid\tsentence1\tsentence2\tis_duplicate", "0\tq1\ta\tb\t1.0", "1\tq2\ta\tb\t0.0", "2\tq3\ta\tb\t2.0"],
    )
    examples, report = get_task("para").read("train", ".", path=q)
    assert [e.label for e in examples] == [1, 0] and [line for line, _ in report.skipped] == [4]

    s = write(
        tmp_path / "s.csv",
        [
            "\tid\tsentence1\tsentence2\tsimilarity",
            "0\ts1\ta\tb\t0.0",
            "1\ts2\ta\tb\t4.6",
            "2\ts3\ta\tb\t5.0",
            "3\ts4\ta\tb\t5.5",
            "4\ts5\ta\tb\t-0.1",
            "5\ts6\ta\tb\tnan",
        ],
    )
    examples, report = get_task("sts").read("train", ".", path=s)
    assert [e.label for e in examples] == [0.0, 4.6, 5.0]
    assert [line for line, _ in report.skipped] == [5, 6, 7]
    assert all("out of range" in reason for _, reason in report.skipped)


def test_test_student_header_with_two_index_columns(tmp_path):
    """The SST/CFIMDB test-student header ('0', '', 'id', 'sentence') reads by column name; no labels."""
    path = write(
        tmp_path / "ids-sst-test-student.csv",
        ["0\t\tid\tsentence", "1\t0.0\tb757\t Effective but too-tepid biopic", "2\t1.0\td17a\t If you like fun ."],
    )
    examples, report = get_task("sst").read("test", ".", path=path)
    assert examples == [Example("b757", "Effective but too-tepid biopic"), Example("d17a", "If you like fun .")]
    assert report.rows_total == report.rows_kept == 2


def test_quora_synthetic_ids_kept_duplicates_reported(tmp_path):
    """Rows with index -1 (synthetic ids) are kept; a duplicate id is kept but reported with both lines."""
    path = write(
        tmp_path / "quora.csv",
        [
            "\tid\tsentence1\tsentence2\tis_duplicate",
            "-1\tcb06\tHow can I fix a leak?\tHow can you fix a leak?\t1.0",
            "-1\t8fff\tWhy so many?\tWhy so many medals?\t0.0",
            "7\tcb06\tA?\tB?\t0.0",
        ],
    )
    examples, report = get_task("para").read("train", ".", path=path)
    assert [e.id for e in examples] == ["cb06", "8fff", "cb06"]
    assert report.skipped == [] and report.duplicate_ids == [(4, "id cb06 also on line 2")]
    assert "duplicate ids (kept) 1: line 4: id cb06 also on line 2" in report.summary()


def test_unlabeled_pairs_and_nli(tmp_path):
    """Unlabeled pair files read with label None; NLI is comma-separated and an empty hard_neg becomes None."""
    sts = write(tmp_path / "sts-test.csv", ["\tid\tsentence1\tsentence2", "735\tcc\tA band plays.\tA band sings. "])
    examples, _ = get_task("sts").read("test", ".", path=sts)
    assert examples == [Example("cc", "A band plays.", "A band sings.", None)]

    nli = write(
        tmp_path / "nli.csv",
        [
            "sent0,sent1,hard_neg",
            '"Two sunbathers, a man and a woman.",Sunbathers.,People are fighting.',
            "A man plays.,A man is playing.,",
            ",missing anchor,x",
        ],
    )
    triplets, report = read_nli(nli)
    assert triplets == [
        Triplet("Two sunbathers, a man and a woman.", "Sunbathers.", "People are fighting."),
        Triplet("A man plays.", "A man is playing.", None),
    ]
    assert report.skipped == [(4, "empty sent0")]


def test_missing_files(tmp_path, caplog):
    """A missing train/dev file raises DataFileMissing naming the path and setup.sh; a missing test file gives None."""
    with pytest.raises(DataFileMissing) as err:
        load_split("sst", "train", tmp_path)
    assert str(tmp_path / "ids-sst-train.csv") in str(err.value) and "setup.sh" in str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    with caplog.at_level(logging.WARNING, logger="tasks.data.readers"):
        assert load_split("para", "test", tmp_path) is None
    assert "quora-test-student.csv" in caplog.text and "skipped" in caplog.text
    with pytest.raises(ValueError, match="unknown task"):
        load_split("nope", "train", tmp_path)


def test_load_split_limit_and_logged_summary(tmp_path, caplog):
    """limit keeps the first N valid rows; a file with skipped rows logs its summary as a warning."""
    rows = ["\tid\tsentence1\tsentence2\tsimilarity"] + [f"{i}\ts{i}\ta\tb\t{i % 6}.0" for i in range(10)]
    rows.insert(3, "99\tbad\ta\tb\t")
    write(tmp_path / get_task("sts").files["dev"], rows)
    with caplog.at_level(logging.WARNING, logger="tasks.data.readers"):
        examples, report = load_split("sts", "dev", tmp_path)
    assert len(examples) == 10 and report.rows_total == 11
    assert "line 4: empty label" in caplog.text
    examples, report = load_split("sts", "dev", tmp_path, limit=4)
    assert [e.id for e in examples] == ["s0", "s1", "s2", "s3"]
    assert report.rows_kept == 4 and report.rows_total == 5
    assert report.summary().endswith("kept 4 of 5 rows (stopped at limit=4); skipped 1: line 4: empty label")


def test_a_limit_the_file_does_not_reach_is_not_said_to_have_stopped_it(tmp_path):
    """A file that ends before --limit is reported as read whole, not as stopped at the limit."""
    write(tmp_path / get_task("sts").files["dev"], ["\tid\tsentence1\tsentence2\tsimilarity", "0\ts0\ta\tb\t1.0"])
    report = load_split("sts", "dev", tmp_path, limit=64)[1]
    assert report.summary().endswith("kept 1 of 1 rows (the whole file: fewer rows than limit=64)")
    assert report.to_dict()["stopped_at_limit"] is False


def test_each_report_fingerprints_the_bytes_it_read(tmp_path):
    """The report's sha256 is that of the file's bytes: a run records it, and a resume compares it."""
    path = write(tmp_path / get_task("sts").files["dev"], ["\tid\tsentence1\tsentence2\tsimilarity", "0\ts0\ta\tb\t1.0"])
    report = load_split("sts", "dev", tmp_path)[1]
    assert report.to_dict()["sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_real_quora_dev_has_exactly_two_malformed_rows():
    """The real quora-dev.csv keeps 20212 of 20214 rows and reports the 2 malformed rows the data README mentions."""
    path = REAL_DATA / "quora-dev.csv"
    if not path.is_file():
        pytest.skip(f"{path} absent (run `bash setup.sh` to link the data)")
    examples, report = get_task("para").read("train", ".", path=path)
    assert report.rows_total == 20214 and report.rows_kept == len(examples) == 20212
    assert len(report.skipped) == 2 and all("empty label" in reason for _, reason in report.skipped)
    assert report.duplicate_ids == []


# ---- cut, swallowed and unreadable files ---------------------------------------------------

CUT_REASON = "file ends without a newline: the last record may be cut"


def test_last_record_without_newline_is_skipped_and_reported(tmp_path):
    """A file cut inside its last field ('0.8' -> '0', no final newline) skips that row, naming its line."""
    rows = ["\tid\tsentence1\tsentence2\tsimilarity", "0\ts0\ta\tb\t4.2", "1\ts1\ta\tb\t0"]
    cut = tmp_path / "sts-dev.csv"
    cut.write_text("\n".join(rows), encoding="utf-8")  # no newline after the last record
    examples, report = get_task("sts").read("train", ".", path=cut)
    assert [e.id for e in examples] == ["s0"]
    assert report.skipped == [(3, CUT_REASON)] and report.rows_total == 2
    assert f"line 3: {CUT_REASON}" in report.summary() and str(cut) in report.summary()
    whole = write(tmp_path / "whole.csv", rows)  # the same rows with the final newline: all kept
    assert [e.id for e in get_task("sts").read("train", ".", path=whole)[0]] == ["s0", "s1"]
    crlf = tmp_path / "crlf.csv"
    crlf.write_bytes(("\r\n".join(rows) + "\r\n").encode())  # Windows line ends count as ending the record
    assert get_task("sts").read("train", ".", path=crlf)[1].skipped == []
    examples, report = get_task("sts").read("train", ".", 1, path=cut)  # stopped before the last record: nothing to say
    assert [e.id for e in examples] == ["s0"] and report.skipped == []


def test_real_nli_file_reports_its_unterminated_last_row():
    """The shared nli-train.csv lacks a final newline: its last of 27,560 rows is skipped and reported, not kept."""
    path = REAL_DATA / "nli-train.csv"
    if not path.is_file():
        pytest.skip(f"{path} absent (run `bash setup.sh` to link the data)")
    triplets, report = read_nli(path)
    assert report.rows_total == 27560 and len(triplets) == report.rows_kept == 27559
    assert report.skipped == [(27561, CUT_REASON)]


@pytest.mark.parametrize("content,expected", [
    (b"", ["is empty", "data/README.md"]),
    (b"\n\n", ["is empty", "data/README.md"]),
    (b"\tid\tsentence\tsentiment\n", ["has a header but no rows", "data/README.md"]),
    (b"\tid\ttext\tsentiment\n0\ta\tgood\t1\n", ["line 1", "no column 'sentence'", "data/README.md"]),
    (b"\tid\tsentence\tsentiment\n0\ta\tgood\t1\n1\tb\tna\xefve\xff\t2\n", ["line 3", "not UTF-8 (byte 0xef at column 7)", "save the text as UTF-8"]),
])
def test_unreadable_files_raise_one_line_naming_file_and_fix(tmp_path, content, expected):
    """Non-UTF-8 bytes, an empty file, a header-only file and a missing column each raise a one-line ValueError
    that names the file (and line) and says what to do."""
    path = tmp_path / "ids-sst-dev.csv"
    path.write_bytes(content)
    with pytest.raises(ValueError) as err:
        get_task("sst").read("train", ".", path=path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for part in expected:
        assert part in message, message


def test_report_to_dict_counts_rows_and_reasons_per_file(tmp_path):
    """ReadReport.to_dict(): per-file counts and reasons grouped with their values elided, JSON-able as it is."""
    rows = ["\tid\tsentence\tsentiment", "0\ta\tok\t1", "1\tb\tno label\t", "2\tc\tno label\t",
            "3\td\thigh\t7", "4\te\thigher\t9", "5\ta\tsame id\t2", '6\tf\t"stray\t1', '7\tg\tclosed"\t2',
            "8\th\tcut\t3"]
    path = tmp_path / "ids-sst-train.csv"  # a training file keeps a repeated id, reported
    path.write_text("\n".join(rows), encoding="utf-8")  # no final newline: the last record counts as cut
    _, report = load_split("sst", "train", tmp_path)
    d = report.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["file"] == str(path) and d["rows"] == 9 and d["kept"] == 2 and d["skipped"] == 7
    assert d["duplicate_ids"] == 1 and d["limit"] is None
    assert d["reasons"] == {"empty label": 2, "label '…' out of range 0..4": 2, CUT_REASON: 1,
                            "a quoted field holds line ends and the delimiter": 1,
                            "swallowed by the unbalanced quote of the record on line N": 1}
    assert d["first_skipped"][0] == {"line": 3, "reason": "empty label"} and len(d["first_skipped"]) == 7
    assert load_split("sst", "train", tmp_path, limit=1)[1].to_dict()["limit"] == 1


def test_a_text_of_control_characters_alone_is_skipped_like_a_blank_one(tmp_path):
    """A text that is empty once control characters go is skipped and reported ("empty sentence"), as a blank one
    is, rather than trained with its label or predicted from empty text; a text with a control character among
    words is kept as it is."""
    path = write(tmp_path / "ids-sst-dev.csv", ["\tid\tsentence\tsentiment", "0\ta1\t\x00\x00\x00\t3",
                                                "1\ta2\t \x07\x1b \t2", "2\ta3\tgood\x00 film\t4"])
    examples, report = get_task("sst").read("train", ".", path=path)
    assert [e.text_a for e in examples] == ["good\x00 film"]
    assert report.skipped == [(2, "empty sentence"), (3, "empty sentence")]
    pairs = write(tmp_path / "sts-dev.csv", ["\tid\tsentence1\tsentence2\tsimilarity", "0\tp1\ta cat\t\x00\t3.0"])
    assert dict(get_task("sts").read("train", ".", path=pairs)[1].skipped) == {2: "empty sentence2"}


@pytest.mark.parametrize("split", ["dev", "test"])
def test_duplicate_ids_in_a_file_that_is_predicted_are_refused_naming_file_and_lines(tmp_path, split):
    """Prediction files are keyed by id, so a dev or test file repeating an id is refused where it is read, naming
    the file, both lines and what to do (its logits could not be ensembled); a training file keeps its rows
    (reported)."""
    label = "\t3.0" if split == "dev" else ""
    header = "\tid\tsentence1\tsentence2" + ("\tsimilarity" if split == "dev" else "")
    write(tmp_path / get_task("sts").files[split], [header, f"0\tx1\ta\tb{label}", f"1\tx2\tc\td{label}",
                                                f"2\tx1\te\tf{label}"])
    with pytest.raises(ValueError, match=rf"sts-{split}(-student)?\.csv: line 4: id x1 also on line 2: .*give each "
                                         "row its own id"):
        load_split("sts", split, tmp_path)
    write(tmp_path / get_task("sts").files["train"], [header.replace("\tsimilarity", "") + "\tsimilarity",
                                                  "0\tx1\ta\tb\t3.0", "1\tx1\tc\td\t2.0"])
    assert len(load_split("sts", "train", tmp_path)[0]) == 2


# ---- a user's files: CSV as the standard writes it ------------------------------------------------------------


def _words(raw: str, problems: list[str]) -> str:
    return raw.strip() or problems.append("empty label")


@pytest.mark.parametrize("delimiter, quoting", [(",", None), ("\t", None), (",", True)])
def test_a_quoted_line_end_in_a_users_file_is_part_of_its_field(tmp_path, delimiter, quoting):
    """A user's file (``multiline``) is read as CSV's standard says: a quoted field may hold line ends, its record is
    kept whole (the text keeps its line end; a record of more lines than MAX_RECORD_LINES too), the rows after it are
    rows; a tab-separated file whose quotes pair up that way is read with quoting."""
    d = delimiter
    long = "\n".join(f"paragraph {k}" for k in range(MAX_RECORD_LINES + 2))
    path = tmp_path / "mine.csv"
    path.write_text(f'text{d}y\n"a review{d}\nover two lines"{d}good\nnext{d}bad\n"{long}"{d}good\nlast{d}bad\n')
    examples, report = read_examples(path, ("text",), "y", _words, id_column=None,
                                     fmt=FileFormat(d, quoting, multiline=True))
    assert [(e.id, e.text_a, e.label) for e in examples] == [
        ("2", f"a review{d}\nover two lines", "good"), ("4", "next", "bad"), ("5", long, "good"),
        (str(6 + MAX_RECORD_LINES + 1), "last", "bad")]
    assert report.clean and report.rows_total == 4


def test_a_stray_quote_in_a_users_file_is_still_an_unbalanced_quote(tmp_path):
    """In a user's file a record over several lines that is not standard CSV (a quote that never closes, or one
    closed with text after it) is the unbalanced quote it is in the course's files: the lines it swallowed are
    reported, and over MAX_RECORD_LINES lines the file is refused naming the line."""
    fmt = FileFormat(",", multiline=True)
    path = write(tmp_path / "stray.csv", ["text,y", "ok,good", '"stray,good', "b,bad", '"fine" then,good', "d,bad"])
    examples, report = read_examples(path, ("text",), "y", _words, id_column=None, fmt=fmt)
    assert [e.text_a for e in examples] == ["ok", "d"]
    assert [line for line, _ in report.skipped] == [3, 4, 5]
    assert "record spans lines 3-5: an unbalanced quote?" in dict(report.skipped)[3]
    never = write(tmp_path / "never.csv", ["text,y", '"never closed,good'] + [f"r{k},bad" for k in range(6)])
    with pytest.raises(ValueError, match=r"never.csv: line 2: one record runs over lines 2-8, most likely an "
                                         r"unbalanced quote"):
        read_examples(never, ("text",), "y", _words, id_column=None, fmt=fmt)
