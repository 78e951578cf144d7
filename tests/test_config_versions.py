"""Tests of tasks/config_versions.py: a saved run of every config.json format this project has written loads as it
ran, evaluates and resumes; a field added to a config without a new version and its migration fails here.

tests/saved_configs/ holds one config.json of a tiny run per format, as the code of that format wrote it (the
file named v0-<commit> by TrainConfig.to_dict at that commit, v<N> by version N's), its machine's paths written
<pretrained>, <data> and <out> (a user's task file <task_file>, in <task_dir>). Version 0 is every file written
before config.json recorded its version.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from tasks import train as cli
from tasks.train_config import TrainConfig
from tasks.config_versions import (CONFIG_VERSION, MIGRATIONS, PER_STREAM_PHRASES, PHRASES_6, UNVERSIONED_ADDITIONS,
                                   UNVERSIONED_FIELDS, fields_of, objective_options, upgrade)
from tasks.objectives import registered_objectives
from tasks.task import ENTRY_FORMAT, ENTRY_KEYS, Task, upgrade_entry
from tests.helpers import three_class_task, unversioned

SAVED = Path(__file__).parent / "saved_configs"


def _version(path: Path) -> int:
    return int(path.stem.split("-")[0][1:])


FIXTURES = sorted(SAVED.glob("v*.json"), key=lambda p: (_version(p), p.stem))
ENTRIES = Path(__file__).parent / "saved_entries"  # a user's task entry as each format saved it (format-N.json)


def _saved(path: Path, env: tuple[Path, Path], out: Path) -> dict:
    """A fixture's config.json with this machine's paths (a user's task file: written beside ``out``)."""
    pretrained, data = env
    text = path.read_text().replace("<pretrained>", str(pretrained)).replace("<data>", str(data))
    if "<task_file>" in text:
        task_file = three_class_task(out.parent / "task")
        text = text.replace("<task_file>", str(task_file)).replace("<task_dir>", str(task_file.parent))
    return json.loads(text.replace("<out>", str(out)))


def _paths(d: dict, version: int) -> set[str]:
    """The field paths of a config.json of ``version`` (its nested configs' fields dotted), without the marker and
    the versions."""
    fields = MIGRATIONS[max(version, 1) - 1].fields
    out = set()
    for key, value in d.items():
        if key in ("model_type", "objective_versions") or key.endswith("_version"):
            continue
        nested = any(f.startswith(f"{key}.") for f in fields)
        out |= {f"{key}.{k}" for k in value} if nested else {key}
    return out


def test_trainconfig_has_the_fields_of_the_version_it_writes():
    """TrainConfig's fields (nested configs' dotted) are the fields of the last version in the migration table: a
    field added, renamed or removed without a new version and its migration fails here."""
    assert CONFIG_VERSION == len(MIGRATIONS)
    assert fields_of(TrainConfig) == MIGRATIONS[-1].fields, (
        "TrainConfig's fields differ from config.json version "
        f"{CONFIG_VERSION}'s: added {sorted(fields_of(TrainConfig) - MIGRATIONS[-1].fields)}, gone "
        f"{sorted(MIGRATIONS[-1].fields - fields_of(TrainConfig))}; add a version to tasks/config_versions.py "
        "(a migration that upgrades the last version's files to it, and its fixture in tests/saved_configs/)")


def test_each_objective_has_the_options_of_its_own_version():
    """Every objective that declares option_names has exactly those Config fields at its options_version: an option
    added, renamed or removed without a new version of that objective (and its upgrade_options step) fails here;
    the run config's version does not change for it. The objectives config version 2 recorded declare them, and
    their version 1 is that record; an objective added since (under tasks/objectives/ or from a file) versions its
    own options from 1 and needs no edit here (tests/objectives/test_init.py adds README's to a copy of the
    package and runs this test there)."""
    registry = registered_objectives()
    recorded = {key.split(".")[0] for key in MIGRATIONS[1].objective_options}
    for name, cls in registry.items():
        if name in recorded:
            assert cls.option_names is not None, f"{name} declares no option_names"
        if cls.option_names is not None:
            have = {f.name for f in dataclasses.fields(cls.Config)}
            assert have == cls.option_names, (f"objective {name!r}'s options differ from its version "
                                              f"{cls.options_version}'s: added {sorted(have - cls.option_names)}, "
                                              f"gone {sorted(cls.option_names - have)}; give it a new version")
    at_1 = frozenset(f"{n}.{o}" for n, cls in registry.items() if n in recorded and cls.options_version == 1
                     for o in cls.option_names)
    assert set(registry) >= recorded
    assert objective_options({n: registry[n] for n in recorded}) == MIGRATIONS[1].objective_options == at_1


def test_there_is_a_fixture_of_every_version_and_each_holds_its_versions_fields():
    """Every version has its fixture; a versioned one holds exactly its version's fields, an unversioned one the
    first TrainConfig's and some of those added before versions were recorded."""
    assert {_version(p) for p in FIXTURES} == set(range(CONFIG_VERSION + 1))
    for path in FIXTURES:
        d = json.loads(path.read_text())
        version = d.pop("config_version", 0)
        assert version == _version(path), path.name
        if version == 0:
            assert UNVERSIONED_FIELDS <= _paths(d, 0) <= MIGRATIONS[0].fields, path.name
        else:
            assert _paths(d, version) == MIGRATIONS[version - 1].fields, path.name


def test_today_writes_the_last_versions_fixture(tiny_env, tmp_path):
    """The fixture of the last version is what TrainConfig.to_dict writes today for the same settings (but the
    software versions): a change of the written format needs a new version."""
    last = [p for p in FIXTURES if _version(p) == CONFIG_VERSION]
    saved = _saved(last[0], tiny_env, tmp_path / "run")
    written = TrainConfig.from_dict(saved, complete=True).to_dict()
    drop = ("minbert_multitask_version", "torch_version")
    saved["user_tasks"] = {name: upgrade_entry(e) for name, e in saved["user_tasks"].items()}  # their own chain
    assert json.loads(json.dumps({k: v for k, v in written.items() if k not in drop})) == \
        {k: v for k, v in saved.items() if k not in drop}


@pytest.mark.parametrize("path", [p for p in FIXTURES if _version(p) == 0], ids=lambda p: p.stem)
def test_a_run_saved_before_versions_loads_as_it_ran(path, tiny_env, tmp_path):
    """A config.json without a version holds its own values, and every field added after it was written takes
    the value the run trained with: each such field came in off (LP-FT, SWA, priors, phrases, ...), the fused
    AdamW step and per-layer learning rates too, and the STS prior's encoder was --pretrained's."""
    saved = _saved(path, tiny_env, tmp_path / "run")
    cfg = TrainConfig.from_dict(saved, complete=True)
    loaded = unversioned(cfg.to_dict())  # in the names of the file's time
    assert {k: loaded[k] for k in saved if k != "model_type"} == {k: v for k, v in saved.items() if k != "model_type"}
    absent = set(MIGRATIONS[0].fields) - _paths(saved, 0)
    expected = {"lp_epochs": 0, "lp_lr": None, "swa_epochs": 0, "swa_lr": 1e-5, "predict_train": False,
                "final_dev": "full", "fused_adamw": False, "gradient_checkpointing": False, "deterministic": False,
                "layer_lr_decay": 1.0, "head_lr_scale": 1.0, "train_subsets": "fresh", "pair_swap": 0.0,
                "symmetric_eval": False, "sts_prior": 0.0, "sts_prior_model": saved["pretrained"], "sst_prior": 0.0,
                "sst_prior_model": None, "report_to": [], "sst_phrases": None, "sst_phrases_per_epoch": 8544,
                "sst_phrases_batch_size": None, "sst_phrases_min_words": 1, "sst_phrases_weight": 1.0,
                "sst_phrases_order": "mixed", "save_only_model": False, "reinit_layers": 0, "task_files": [],
                "freeze_encoder": False}
    assert set(expected) == set(UNVERSIONED_ADDITIONS) | {"sts_prior_model"}
    assert {k: loaded[k] for k in absent} == {k: expected[k] for k in absent}


def test_a_file_of_some_fields_takes_todays_defaults(tmp_path):
    """A file without a version that lacks fields every saved run holds is one's own --config: nothing is filled
    in for it; what it leaves out takes today's defaults, and a checkpoint's config may not be such a file."""
    cfg = TrainConfig.from_dict({"epochs": 5, "lr": 1e-3})
    assert dataclasses.replace(cfg, epochs=2, lr=1e-4) == TrainConfig()
    almost = json.loads((SAVED / "v0-3cf84b3.json").read_text())
    del almost["seed"]
    cfg = TrainConfig.from_dict(almost)
    assert (cfg.prior_weights, cfg.fused_adamw) == ({"sst": 0.5, "sts": 0.5}, True)  # today's defaults
    with pytest.raises(ValueError, match=r"not a complete run configuration: missing \[.*'seed'"):
        TrainConfig.from_dict(almost, complete=True)


@pytest.mark.parametrize("version, message", [
    (CONFIG_VERSION + 1, f"config_version {CONFIG_VERSION + 1} was written by a newer minbert-multitask"),
    ("1", "config_version: '1' is not a version"), (-1, "config_version: -1 is not a version"),
    (True, "config_version: True is not a version")])
def test_a_version_this_code_cannot_read_is_refused_naming_it(version, message):
    saved = {**TrainConfig().to_dict(), "config_version": version}
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(saved)


def test_a_saved_run_names_what_wrote_it():
    """config.json records its format's version and the package's and torch's (as transformers_version)."""
    import torch

    d = TrainConfig().to_dict()
    assert d["config_version"] == CONFIG_VERSION and d["torch_version"] == torch.__version__
    assert TrainConfig.from_dict(d) == TrainConfig()


# ---- end to end: load, evaluate, resume ---------------------------------------------------------------------------

END_TO_END = [p for p in FIXTURES if p.stem in ("v0-3cf84b3", "v0-15ee338") or _version(p) > 0]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("path", END_TO_END, ids=lambda p: p.stem)
def test_a_saved_run_of_each_version_evaluates_and_resumes(path, tiny_env, tmp_path):
    """A run whose config.json files are the fixture's (the weights trained here from the same settings):
    --eval-only re-predicts its best checkpoint byte for byte, and --resume trains a second epoch from it."""
    run, saved = tmp_path / "run", tmp_path / "config.json"
    saved.write_text(json.dumps(_saved(path, tiny_env, run)))
    cli.main(["--config", str(saved)])
    for where in (run, run / "checkpoints" / "best", run / "checkpoints" / "last"):
        shutil.copyfile(saved, where / "config.json")  # the run as the fixture's version left it

    cli.main(["--eval-only", "--out-dir", str(tmp_path / "eval"), "--checkpoint", str(run / "checkpoints" / "best")])
    for name in sorted(p.name for p in (run / "predictions").iterdir()):
        assert (tmp_path / "eval" / "predictions" / name).read_bytes() == (run / "predictions" / name).read_bytes()

    final = cli.main(["--resume", "--out-dir", str(run), "--epochs", "2"])
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if not r.get("final")] == [1, 2] and "dev" in final
    resumed = json.loads((run / "checkpoints" / "last" / "config.json").read_text())
    assert resumed["config_version"] == CONFIG_VERSION and resumed["epochs"] == 2
    assert TrainConfig.from_dict(resumed) == dataclasses.replace(TrainConfig.from_dict(json.loads(
        saved.read_text())), epochs=2)


# ---- version 2: settings of one feature nested --------------------------------------------------------------------


def test_one_run_saved_by_each_version_since_the_last_unversioned_loads_to_one_config(tiny_env, tmp_path):
    """The last unversioned fixture, version 1's and version 2's hold the same run: they load to the same
    TrainConfig (version 1's flat priors, phrases, LP-FT and SWA settings nested by the migration)."""
    loaded = [TrainConfig.from_dict(_saved(SAVED / name, tiny_env, tmp_path), complete=True)
              for name in ("v0-15ee338.json", "v1.json", "v2.json")]
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[2].prior_weights["sts"] == 0.0 and "phrases" not in loaded[2].resolve().extra
    assert loaded[2].swa.lr == 1e-5


def test_a_version_5_runs_priors_and_span_load_per_task(tiny_env, tmp_path):
    """Version 6 sets the SST and STS priors and STS's span per task, as any task's (prior_weights, prior_models,
    model.spans): a run saved at version 5 ("priors": {"sts_weight", "sts_model", "sst_weight", "sst_model"},
    "model": {"sts_scale"}) loads to the config of the same run saved at 6, each setting its task's item (an encoder
    of None left out: the declared one); a user's regression saved at version 2, which took STS's span, keeps it."""
    v5, v6 = (TrainConfig.from_dict(_saved(SAVED / f"v{n}.json", tiny_env, tmp_path / "run"), complete=True)
              for n in (5, 6))
    assert v5 == v6 and v6.prior_weights == {"sst": 0.0, "sts": 0.0} and v6.prior_models == {}
    saved = {**_saved(SAVED / "v5.json", tiny_env, tmp_path / "run"),
             "priors": {"sts_weight": 0.25, "sts_model": None, "sst_weight": 0.5, "sst_model": "enc"}}
    cfg = TrainConfig.from_dict(saved, complete=True)
    assert (cfg.prior_weights, cfg.prior_models) == ({"sts": 0.25, "sst": 0.5}, {"sst": "enc"})
    v5 = _saved(SAVED / "v5.json", tiny_env, tmp_path / "run")
    v5["model"]["sts_scale"] = 3.0
    v5["user_tasks"]["topic"]["span_option"] = "sts_scale"  # as version 2 declared a user's regression
    assert upgrade(v5)["model"]["spans"] == {"sts": 3.0, "topic": 3.0}
    with pytest.raises(ValueError, match=r"priors\.sts_scale is not a setting"):
        TrainConfig.from_dict({"priors": {"sts_scale": 2}})
    with pytest.raises(ValueError, match="priors and prior_weights / prior_models set the same priors"):
        TrainConfig.from_dict({"priors": {"sts_weight": 0.1}, "prior_weights": {"sts": 0.2}})


def test_a_version_6_runs_phrases_load_per_stream(tiny_env, tmp_path):
    """Version 7 sets SST's phrases per stream, as any declared stream's (stream_files, max_train_examples,
    task_batch_size, stream_min_words, loss_weights, stream_orders): a run saved at version 6 ("sst_phrases":
    {"file", "per_epoch", "batch_size", "min_words", "weight", "order"}) loads to the config of the same run saved
    at 7, each setting the item "phrases" of its map (what a run of today leaves out left out: a batch size of null,
    a weight of 1, the declared fewest words and order); an item its map already named stays, as version 6 read it
    first; a file of some fields keeps the defaults of the maps it does not name."""
    v6, v7 = (TrainConfig.from_dict(_saved(SAVED / f"v{n}.json", tiny_env, tmp_path / "run"), complete=True)
              for n in (6, 7))
    assert v6 == v7 and "phrases" not in v7.resolve().extra and v7.stream_files == {"phrases": None}
    saved = {**_saved(SAVED / "v6.json", tiny_env, tmp_path / "run"), "loss_weights": {"phrases": 3.0},
             "sst_phrases": {"file": "p.csv", "per_epoch": 100, "batch_size": None, "min_words": 2, "weight": 0.5,
                             "order": "first"}}
    cfg = TrainConfig.from_dict(saved, complete=True)
    assert (cfg.stream_files, cfg.max_train_examples, cfg.task_batch_size, cfg.loss_weights, cfg.stream_min_words,
            cfg.stream_orders) == ({"phrases": "p.csv"}, {"phrases": 100}, {"phrases": None}, {"phrases": 3.0},
                                   {"phrases": 2}, {"phrases": "first"})
    assert cfg.resolve().batch_sizes["phrases"] == cfg.batch_size
    same = {**saved["sst_phrases"], "per_epoch": 17088, "batch_size": 64, "min_words": 1, "weight": 1.0,
            "order": "mixed"}
    cfg = TrainConfig.from_dict({**saved, "loss_weights": {}, "sst_phrases": same}, complete=True)
    assert (cfg.max_train_examples, cfg.task_batch_size, cfg.loss_weights, cfg.stream_min_words,
            cfg.stream_orders) == ({}, {}, {}, {}, {})  # SST's declared (tasks/cs224n/sst.json), as then
    assert (cfg.resolve().caps["phrases"], cfg.resolve().batch_sizes["phrases"]) == (17088, 64)
    assert TrainConfig.from_dict({"sst_phrases": {"per_epoch": 5}}).max_train_examples == {"para": 23000,
                                                                                          "phrases": 5}
    assert TrainConfig.from_dict({"sst_phrases_batch_size": None}).task_batch_size == {"phrases": None}
    assert TrainConfig.from_dict({"sst_phrases": {"order": "first"}}) == TrainConfig(stream_orders={"phrases": "first"})
    with pytest.raises(ValueError, match=r"sst_phrases\.rate is not a setting \(sst_phrases: file, per_epoch"):
        upgrade({"sst_phrases": {"rate": 2}})
    with pytest.raises(ValueError, match=r"task_batch_size: 8 is not a mapping"):
        upgrade({"sst_phrases": {"batch_size": 4}, "task_batch_size": 8})


def test_a_file_of_some_fields_names_a_setting_flat_or_nested_but_once():
    """A --config file of one's own may name a nested setting as version 1 did ("swa_epochs") or as today's
    ("swa": {"epochs"}); naming it both ways is refused naming both."""
    flat = TrainConfig.from_dict({"sts_prior": 0.25, "swa_epochs": 2, "sst_phrases": "none", "lp_epochs": 1})
    nested = TrainConfig.from_dict({"priors": {"sts_weight": 0.25}, "swa": {"epochs": 2},
                                    "sst_phrases": {"file": None}, "lpft": {"epochs": 1}})
    assert flat == nested == TrainConfig(prior_weights={"sts": 0.25, "sst": 0.5}, swa={"epochs": 2},
                                         stream_files={"phrases": None}, lpft={"epochs": 1})
    assert TrainConfig.from_dict({"sst_phrases_weight": 2.0, "sst_phrases": {"order": "first"}}) == \
        TrainConfig(loss_weights={"phrases": 2.0}, stream_orders={"phrases": "first"})
    with pytest.raises(ValueError, match=r"swa_lr and swa\.lr are one setting: give it once"):
        TrainConfig.from_dict({"swa_lr": 1e-4, "swa": {"lr": 1e-3}})
    with pytest.raises(ValueError, match=r"unknown SwaConfig field\(s\) \['rate'\]"):
        TrainConfig.from_dict({"swa": {"rate": 1e-3}})
    with pytest.raises(ValueError, match=r"priors\.sts_weight: 'x' is not a number"):
        TrainConfig.from_dict({"sts_prior": "x"})
    with pytest.raises(ValueError, match=r"priors\.sts_model: 'none' is not a value of this setting"):
        TrainConfig.from_dict({"priors": {"sts_model": "none"}})
    with pytest.raises(ValueError, match=r"model\.sts_scale: 'abc' is not a number"):
        TrainConfig.from_dict({"model": {"sts_scale": "abc"}})


def test_a_nested_setting_in_a_config_file_is_one_line_and_exit_2(tmp_path, capsys):
    """A --config file naming a setting both ways ends in the command's one error line naming the file and the
    setting, exit 2, no traceback."""
    from tasks.arguments import config_for

    (tmp_path / "both.json").write_text('{"swa_epochs": 1, "swa": {"epochs": 2}}')
    with pytest.raises(ValueError, match=r"--config .*both\.json: swa_epochs and swa\.epochs are one setting"):
        config_for(["--config", str(tmp_path / "both.json")])
    with pytest.raises(SystemExit) as refused:
        cli.main(["--config", str(tmp_path / "both.json"), "--out-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("train_multitask.py: error: --config ")


# ---- version 3: a run keeps its own tasks' entries ----------------------------------------------------------------


def test_a_version_2_run_of_a_users_task_keeps_the_task_it_trained(tiny_env, tmp_path):
    """A run of version 2 read its task file again whenever it loaded, by that version's rules: classes 0 to the
    largest label, the course's prediction format, every task in the overall. The migration reads the file once
    more by those rules, into the entry the run keeps since; with the file gone it says to put it back."""
    saved = _saved(SAVED / "v2-usertask.json", tiny_env, tmp_path / "run")
    cfg = TrainConfig.from_dict(saved, complete=True)
    entry = cfg.user_tasks["topic"]
    assert (entry["kind"], entry["classes"], entry["output"]["starter"], entry["output"]["column"]) == (
        "sentence-classification", ["0", "1", "2"], True, "Predicted_topic")
    assert cfg.best_metric == ("sst", "topic")  # version 2's overall: over every task of the run
    Path(saved["task_files"][0]).unlink()
    with pytest.raises(ValueError, match="the task file of a run saved before version 3 .*: not found; the run reads "
                                         "its task there: put the file back to load it"):
        TrainConfig.from_dict(saved, complete=True)


def test_a_saved_run_that_lost_its_version_is_named_and_never_told_to_delete(tiny_env, tmp_path, capsys):
    """A version-2 run whose config.json lost "config_version" is not read as version 0 (and refused for another
    setting): the message names the missing key and the version its settings are written in; --resume on it
    says to mend the file, never --overwrite (which would delete its intact checkpoints)."""
    saved = _saved(SAVED / "v2.json", tiny_env, tmp_path / "run")
    del saved["config_version"]
    with pytest.raises(ValueError, match='config_version is missing, .* version 2 writes them: put back '
                                         '"config_version": 2'):
        TrainConfig.from_dict(saved, complete=True)
    for version in (5, 6):  # each names the version it is (6 holds no model.sts_scale, which version 0 did)
        saved_at = _saved(SAVED / f"v{version}.json", tiny_env, tmp_path / "run")
        del saved_at["config_version"]
        with pytest.raises(ValueError, match=f'put back "config_version": {version}$'):
            TrainConfig.from_dict(saved_at, complete=True)
    run = tmp_path / "run"
    cli.main(["--config", str(_write(tmp_path / "config.json", _saved(SAVED / "v2.json", tiny_env, run)))])
    for where in (run / "checkpoints" / "best", run / "checkpoints" / "last"):
        _write(where / "config.json", saved)
    with pytest.raises(SystemExit) as e:
        cli.main(["--resume", "--out-dir", str(run)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and 'put back "config_version": 2' in err and "--overwrite" not in err, err


def _write(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d))
    return path


# ---- version 4: a task's positive class, labels alike but for case, line ends inside fields --------------------------


def _entry_of_version_3(**changes) -> dict:
    """The entry of a two-class pair task of words as version 3 saved it, with ``changes``."""
    layout = {"text": ["a", "b"], "label": "y", "id": None, "delimiter": None, "quoting": None, "header": True,
              "line_ends": False}
    return {"name": "dup", "kind": "pair-classification", "classes": ["different", "same"], "score_range": None,
            "checks_range": False, "metrics": ["acc", "f1", "mcc"], "files": {"train": "/gone/dup-train.csv"},
            "layout": layout, "split_layouts": {"dev": {**layout, "id": "id"}}, "output_column": "label",
            "starter_format": False, "positive": "paraphrase", "symmetric": False, "span_option": "", "stream": None,
            "prior": None, "origin": {"file": "/gone/dup.json", "declaration": {}, "inferred": ["kind", "classes"]},
            **changes}


def test_a_version_3_entry_reads_as_it_ran(tiny_env, tmp_path):
    """Version 3's entries: "positive" was a word for what class 1 means (F1 was class 1's), now it names the class F1
    is on: a word that names no class reads as no "positive" (F1 the second class's, class 1's, as it was), one
    that names a class as that class; their labels were matched in their case ("label_case": "exact") and their
    files read with no field over lines ("multiline" false), as the run read them."""
    saved = _saved(SAVED / "v3.json", tiny_env, tmp_path / "run")
    entries = {"dup": _entry_of_version_3(), "dup2": _entry_of_version_3(name="dup2", positive="different"),
               "dup3": _entry_of_version_3(name="dup3", positive="")}
    cfg = TrainConfig.from_dict({**saved, "tasks": ["sst", "dup", "dup2", "dup3"], "user_tasks": entries},
                                complete=True)
    dup = cfg.user_tasks["dup"]
    assert (dup["positive"], dup["label_case"], dup["layout"]["multiline"]) == ("", "exact", False)
    assert dup["split_layouts"]["dev"]["multiline"] is False and cfg.user_tasks["dup2"]["positive"] == "different"
    assert [cfg.entries[n].positive_class for n in ("dup", "dup2", "dup3")] == [1, 0, 1]


@pytest.mark.usefixtures("one_thread")
def test_a_version_3_run_whose_positive_was_a_word_re_predicts_as_it_did(tiny_env, tmp_path):
    """A run of version 3 of a two-class pair task of words whose task file said "positive": "paraphrase" (a word
    for class 1, then): --eval-only re-predicts its files byte for byte and scores the F1 of class 1, as it did."""
    from tests.helpers import CLASS_WORDS, tiny_flags, user_task

    rows = {s: [[f"the film was {CLASS_WORDS[i % 3]}", f"the film was {CLASS_WORDS[(i // 2) % 3]}",
                 ["different", "same"][i % 3 == (i // 2) % 3]] for i in range(n)] for s, n in (("train", 32),
                                                                                             ("dev", 16))}
    task_file = user_task(tmp_path / "t", {"name": "dup", "text": ["a", "b"], "label": "y"}, rows, ["a", "b", "y"])
    run = tmp_path / "run"
    trained = cli.main([*tiny_flags(tiny_env, run), "--task-file", str(task_file), "--tasks", "dup"])
    spec = {**json.loads(task_file.read_text()), "positive": "paraphrase"}
    task_file.write_text(json.dumps(spec))  # the task file as version 3 took it
    for where in (run, run / "checkpoints" / "best", run / "checkpoints" / "last"):
        d = json.loads((where / "config.json").read_text())
        entry = d["user_tasks"]["dup"]
        del entry["label_case"]
        for layout in (entry["layout"], *entry["split_layouts"].values()):
            del layout["multiline"]
        entry.update(positive="paraphrase", origin={**entry["origin"], "declaration": spec})
        d["priors"] = {f"{t}_{k}": d[f"prior_{k}s"].get(t) for t in ("sst", "sts") for k in ("weight", "model")}
        d["sst_phrases"] = {k: d[path].get("phrases", PHRASES_6[k]) for k, path in PER_STREAM_PHRASES.items()}
        fields = {f.split(".")[0] for f in MIGRATIONS[2].fields} | {"model_type", "objective_versions"}
        _write(where / "config.json", {**{k: v for k, v in d.items() if k in fields or k.endswith("_version")},
                                       "config_version": 3})  # version 3's fields
    again = cli.main(["--eval-only", "--out-dir", str(tmp_path / "eval"), "--checkpoint", str(run / "checkpoints" /
                                                                                           "best")])
    for name in ("dup-dev-output.csv", "dup-dev-logits.csv"):
        assert (tmp_path / "eval" / "predictions" / name).read_bytes() == (run / "predictions" / name).read_bytes()
    assert again["dev"]["dup_f1"] == trained["dev"]["dup_f1"] and "dup_f1" in trained["dev"]


# ---- the task entry's own formats (tasks.task.ENTRY_KEYS: a run's config.json keeps its tasks' entries) ----------


def _entry_fixtures() -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in ENTRIES.glob("format-*.json")}


def test_there_is_an_entry_fixture_of_every_format_with_its_formats_keys():
    fixtures = _entry_fixtures()
    assert set(fixtures) == set(ENTRY_KEYS) and ENTRY_FORMAT == max(ENTRY_KEYS)
    for at, d in fixtures.items():
        assert set(d) == set(ENTRY_KEYS[at]), at
        assert d.get("format", 1) == at


def test_today_writes_the_last_entry_formats_fixture():
    """Today's ``Task.to_dict`` of the last format's entry is that fixture: a change of what an entry holds needs a
    new format and its migration."""
    d = _entry_fixtures()[ENTRY_FORMAT]
    assert Task.from_dict(d).to_dict() == d


@pytest.mark.parametrize("at", sorted(ENTRY_KEYS))
def test_an_entry_saved_at_each_format_reads_as_the_same_task(at):
    """The same user task (a word-label sentence task with a phrase stream, a prior, a positive class and labels
    folded in case), saved at each format (format 1 by the package before format 2), reads back as one task:
    every field, its files and origin too."""
    fixtures = _entry_fixtures()
    task, today = Task.from_dict(fixtures[at]), Task.from_dict(fixtures[ENTRY_FORMAT])
    assert task == today and task.files == today.files and task.origin == today.origin
    assert task.to_dict() == fixtures[ENTRY_FORMAT]


def test_an_entry_of_an_unknown_format_or_with_other_keys_is_refused_in_one_line():
    d = _entry_fixtures()[ENTRY_FORMAT]
    with pytest.raises(ValueError, match=f"task entry 'mood': format {ENTRY_FORMAT + 1} is not one this package "
                                         f"reads \\(1 to {ENTRY_FORMAT}\\)"):
        Task.from_dict({**d, "format": ENTRY_FORMAT + 1})
    with pytest.raises(ValueError, match=r"task entry 'mood': keys \['extra'\] are unknown or missing \(format 1\)"):
        Task.from_dict({**_entry_fixtures()[1], "extra": 1})
