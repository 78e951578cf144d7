"""Tests of tasks/objectives/__init__.py, the registry and the interface every objective implements: each
registered objective runs its forward, backward and a fused AdamW step on the meta device.

The meta device holds shapes and no values: any read of a tensor's value (``.item()``, ``int(t)``, ``bool(t)``,
a boolean-mask index whose size depends on the data) raises, and so does mixing a CPU tensor with a device one.
Running forward, backward and a fused AdamW step there exercises the non-CPU branches of the code without a GPU.
The source scan for host reads in the hot path is in tests/test_layout.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
import torch

from minbert.bert import BertModel
from minbert.optimizer import AdamW
from tasks.model import ModelConfig, MultitaskBert
import tasks.objectives as objectives
from tasks.objectives import REGISTRY, Objective, ObjectiveConfig, build_objectives, registered_objectives
from tasks.objectives.distill import Distill, TaskTargets
from tasks.task import Layout, Scores, Task, Tasks
from tasks.training.run import run, trainer_for
from tests.helpers import tiny_config, tiny_train_config

META = torch.device("meta")

N, T = 8, 7

pytestmark = pytest.mark.usefixtures("one_thread")


def _side(suffix: str, g: torch.Generator, width: int = T) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 99, (N, width), generator=g)
    mask = torch.ones(N, width, dtype=torch.long)
    mask[1, width - 2:] = 0
    return {"input_ids" + suffix: ids * mask, "attention_mask" + suffix: mask,
            "token_type_ids" + suffix: torch.zeros_like(ids)}


def meta_batch(task: str, pair_encoding: str, seed: int = 0, device: torch.device = META) -> dict:
    """A collated-looking batch (ids, masks, labels) on the meta device (or ``device``), plus its example ids."""
    g = torch.Generator().manual_seed(seed)
    if task == "nli":
        batch = {**_side("_1", g), **_side("_2", g, T - 1), **_side("_3", g)}
    elif task == "sst" or pair_encoding == "cross":
        batch = _side("", g)
    else:
        batch = {**_side("_1", g), **_side("_2", g, T - 2)}
    if task != "nli":
        batch["labels"] = {"sst": torch.arange(N) % 5, "para": (torch.arange(N) % 2).float(),
                           "sts": torch.linspace(0, 5, N)}[task]
    batch = {k: v.to(device) for k, v in batch.items()}
    batch["ids"] = [f"{task}-{i}" for i in range(N)]
    return batch


def meta_settings(pair_encoding: str) -> dict[str, dict]:
    """Options that let each registered objective apply to every task it can take with this pair encoding; an
    objective not named here (a new one) runs with its defaults."""
    pair_vector = {} if pair_encoding == "cross" else {"representation": "head_input"}
    special = {
        "distill": {"teachers": ["unused: targets are set by hand"]},
        "knn_bert": {"m_most": 2, "m_least": 2, "queue_size": 12, **pair_vector},
        "mnr": {"para_positives": True},
        "rift": {"steps": 1},
        "scl": {} if pair_encoding == "cross" else {"embedding": "head_input"},
        "simcse": {"tasks": ("sst", "para", "sts", "nli")},
    }
    return {name: special.get(name, {}) for name in sorted(registered_objectives())}


META_CASES = [(name, enc) for name in sorted(meta_settings("cross")) for enc in ("siamese", "cross")
              if not (enc == "cross" and REGISTRY[name].needs_siamese)]


@pytest.fixture
def meta_autocast(monkeypatch):
    """torch.autocast("meta", ...) raises "unsupported scalarType" (the meta device has no autocast, torch 2.13):
    inside the objectives' float32 regions (``torch.autocast(x.device.type, enabled=False)``) it becomes a no-op
    for meta tensors. Autocast only chooses precisions, which the meta device does not compute; any other
    device type gets the real torch.autocast."""
    real = torch.autocast

    class Autocast(real):
        def __init__(self, device_type, *args, **kwargs):
            self.meta = device_type == "meta"
            if not self.meta:
                super().__init__(device_type, *args, **kwargs)

        def __enter__(self):
            return None if self.meta else super().__enter__()

        def __exit__(self, *exc):
            return None if self.meta else super().__exit__(*exc)

    monkeypatch.setattr(torch, "autocast", Autocast)


@pytest.mark.usefixtures("meta_autocast")
@pytest.mark.parametrize("name,pair_encoding", META_CASES)
def test_objective_runs_on_the_meta_device(name, pair_encoding):
    """Forward (head loss + the objective's terms), backward, a fused AdamW step over model and objective parameters,
    and on_step_end, for every task stream the objective applies to, with every tensor on the meta device."""
    torch.manual_seed(0)
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="b1", pair_encoding=pair_encoding, fcn_size=16))
    model.to(META).train()
    (obj,) = build_objectives({name: meta_settings(pair_encoding)[name]}, model)
    obj.to(META)
    if isinstance(obj, Distill):  # teacher targets as read from files: on the CPU
        _distill_targets(obj, torch.device("cpu"))
    opt = AdamW([*model.parameters(), *obj.parameters()], lr=1e-3, weight_decay=0.01, decay="before", fused=True)
    streams = [s for s in ("sst", "para", "sts", "nli") if obj.applies_to(s)]
    if pair_encoding == "cross":
        streams = [s for s in streams if s != "nli"]  # the NLI stream feeds Siamese triplets only
    assert streams
    for step, stream in enumerate(streams):
        batch = meta_batch(stream, pair_encoding, seed=step)
        out, total = None, None
        if stream != "nli":
            out = model(stream, batch)
            total = obj.task_loss_scale * model.task_loss(stream, out, batch)
        terms = obj(model, stream, batch, out)
        for name, term in terms.items():
            assert term.device == META and term.dim() == 0, (stream, term)
            total = obj.term_weight(name) * term if total is None else total + obj.term_weight(name) * term
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        obj.on_step_end(model)
    assert all(int(s["step"]) >= 1 for s in opt.state.values())
    if isinstance(obj, Distill):  # moved to the device once, then indexed there: no per-step blocking copy
        assert {t.targets.device for t in obj.targets.values()} == {META}


def _distill_targets(obj: Distill, device: torch.device) -> None:
    g = torch.Generator().manual_seed(1)
    obj.targets = {t: TaskTargets({f"{t}-{i}": i for i in range(N)}, x.to(device), [])
                   for t, x in (("sst", torch.rand(N, 5, generator=g).softmax(-1)),
                                ("para", torch.rand(N, generator=g)), ("sts", torch.rand(N, generator=g) * 5))}


@pytest.mark.parametrize("name,pair_encoding", META_CASES)
def test_every_objective_stays_finite_in_fp16(name, pair_encoding):
    """Under fp16 autocast with dynamic loss scaling (the path of a GPU without native bf16, here on the CPU: torch's
    CPU autocast in float16, GradScaler("cpu")), every objective's terms are finite, and on every stream it applies
    to the scaler finds within a few halvings of its first scale (2**16) a scale of at least 2**8 at which the
    gradients are finite and the optimizer steps: the adversarial ones (SMART, RIFT), the KNN queue, MNR's and
    SimCSE's scaled similarities, distillation's temperatures. (At 2**16 a first step may overflow, the plain STS
    head's too: that is what the scaler is for.)"""
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model = MultitaskBert(BertModel(tiny_config()), ModelConfig(arch="b1", pair_encoding=pair_encoding, fcn_size=16))
    model.train()
    (obj,) = build_objectives({name: meta_settings(pair_encoding)[name]}, model)
    if isinstance(obj, Distill):
        _distill_targets(obj, cpu)
    opt = AdamW([*model.parameters(), *obj.parameters()], lr=1e-3, weight_decay=0.01, decay="before")
    streams = [s for s in ("sst", "para", "sts", "nli") if obj.applies_to(s)
               and not (s == "nli" and pair_encoding == "cross")]
    for step, stream in enumerate(streams):
        scaler = torch.amp.GradScaler("cpu")
        batch = meta_batch(stream, pair_encoding, seed=step, device=cpu)
        for _ in range(8):  # halvings: 2**16 down to 2**8
            with torch.autocast("cpu", dtype=torch.float16):
                out, total = None, None
                if stream != "nli":
                    out = model(stream, batch)
                    total = obj.task_loss_scale * model.task_loss(stream, out, batch)
                terms = obj(model, stream, batch, out)
            for term_name, term in terms.items():
                assert torch.isfinite(term), (stream, term_name, term)
                weighted = obj.term_weight(term_name) * term
                total = weighted if total is None else total + weighted
            scale = scaler.get_scale()
            scaler.scale(total).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if scaler.get_scale() >= scale:
                break
        assert scaler.get_scale() >= scale >= 2**8, (stream, "no scale gave finite gradients", scale)
        obj.on_step_end(model)


@dataclass
class ProbeConfig(ObjectiveConfig):
    weight: float = 0.5


def test_a_config_that_is_not_an_objective_config_is_refused_at_registration():
    """Every Config has weight and tasks because it subclasses ObjectiveConfig: a plain dataclass is refused by
    name when its objective class is defined, not found missing mid-run."""

    @dataclass
    class Plain:
        weight: float = 1.0

    with pytest.raises(TypeError, match="'probe_plain': its Config must subclass"):
        class PlainProbe(Objective):
            name = "probe_plain"
            Config = Plain

            def forward(self, model, task, batch, out):
                return {}
    assert "probe_plain" not in REGISTRY


@pytest.fixture
def probe():
    """A minimal objective, registered for this test only (the registry is global)."""

    class Probe(Objective):
        name = "probe_minimal"
        Config = ProbeConfig
        tasks = ("sst",)

        def forward(self, model, task, batch, out):
            return {"logit_norm": out.logits.float().pow(2).mean()}

    yield Probe
    del REGISTRY["probe_minimal"]


def test_a_minimal_objective_runs_through_a_whole_run(probe, tiny_env, tmp_path):
    """name + Config + tasks + forward suffice: the run trains, checkpoints and predicts, and logs the term."""
    summary = run(tiny_train_config(tiny_env, tmp_path / "run", epochs=1, objectives={"probe_minimal": {}}))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["train"]["sst/probe_minimal.logit_norm"] > 0
    assert "para/probe_minimal.logit_norm" not in records[0]["train"]  # tasks = ("sst",)
    assert summary["final"] and (tmp_path / "run" / "predictions" / "sst-dev-output.csv").is_file()


def test_the_probe_term_enters_the_loss_with_its_weight(probe, tiny_env, tmp_path):
    """The trainer adds weight x term to the step's loss (checked against the head loss alone)."""

    cfg = tiny_train_config(tiny_env, tmp_path / "run", epochs=1, objectives={"probe_minimal": {"weight": 0.5}})
    trainer = trainer_for(cfg)
    trainer.model.eval()  # no dropout: the two losses see the same forward
    batch = trainer.train_sets["sst"].collate(list(range(8)))
    loss, terms = trainer.step_loss("sst", batch)
    torch.testing.assert_close(loss, terms["sst/loss"] + 0.5 * terms["sst/probe_minimal.logit_norm"])


class Ranking(Scores):
    """A kind the package does not have, so no objective names it: scores (as a regression's) that a ranking loss
    would compare within a query."""

    about = "scores ranked within a query"


@pytest.fixture
def ranked():
    """A sentence task of the kind ``Ranking`` ("sentence-ranking")."""
    return Task("ranked", Ranking("sentence-ranking", pair=False), {}, Layout(("t",), "y"), score_range=(0.0, 1.0))


def test_an_objective_refuses_a_kind_it_has_no_rule_for_in_one_line_never_as_another_kind(ranked):
    """What an objective computes from a head's outputs is a rule per kind it names: a task of a kind it does not
    name (here a subclass of the regressions' kind) is refused in one line naming the objective, the task, its
    kind and the kinds it takes, never trained by a regression's rule (SMART's MSE, distillation's mean score) or
    a classification's; a stream without a head is refused alike. The config's check refuses the kind's name
    before any data."""
    from tasks.objectives.distill import distill_loss, teacher_targets
    from tasks.objectives.knn_bert import class_probabilities
    from tasks.objectives.mnr import PAIRS
    from tasks.objectives.rdrop import rdrop_divergence
    from tasks.objectives.rift import class_log_probs
    from tasks.objectives.scl import CLASSES
    from tasks.objectives.smart import DIVERGENCES, smart_divergence

    z = torch.linspace(0.1, 0.9, 6)
    refusals = {
        "smart": lambda: smart_divergence(ranked, z, z.flip(0)),
        "distill": lambda: teacher_targets(ranked, [z]),
        "rift": lambda: class_log_probs(ranked, z),
        "knn_bert": lambda: class_probabilities(ranked, z),
        "rdrop": lambda: rdrop_divergence(ranked, z, z),
        "mnr": lambda: objectives.kind_rule("mnr", PAIRS, "ranked", ranked.kind),
        "scl": lambda: objectives.kind_rule("scl", CLASSES, "ranked", ranked.kind),
    }
    for name, call in refusals.items():
        with pytest.raises(ValueError) as refused:
            call()
        message = str(refused.value)
        assert message.startswith(f"objective {name!r} does not take 'ranked', which is a sentence-ranking (scores "
                                  "ranked within a query): it takes tasks of ") and "\n" not in message, message
    with pytest.raises(ValueError, match="objective 'distill' does not take 'ranked'"):
        distill_loss(ranked, z, z)
    with pytest.raises(ValueError, match="^objective 'smart' does not take 'nli', which has no head: it takes tasks of "
                                         "classes scored by C logits or two classes scored by one logit or a score "
                                         "on a scale$"):
        objectives.kind_rule("smart", DIVERGENCES, "nli", None)
    for name in ("smart", "distill", "simcse", "match_tuning"):  # the ones that took every kind, now by name
        with pytest.raises(ValueError, match=f"objective {name!r} supports .* tasks, and task 'ranked' is a "
                                             "sentence-ranking$"):
            objectives.objective_config(name, {"tasks": ["ranked"], **({"teachers": ["t"]} if name == "distill"
                                                                         else {})}, Tasks([ranked]))


def test_an_unknown_option_is_refused_naming_it_and_the_options_by_the_config_check_and_the_builder():
    """objective_config is the one check: TrainConfig.validate and build_objectives give the same message."""
    from tasks.train_config import TrainConfig

    with pytest.raises(ValueError, match=r"objective 'mnr' has no option\(s\) \['nope'\]; options: \[.*'scale'"):
        build_objectives({"mnr": {"nope": 1}}, None)
    with pytest.raises(ValueError, match=r"objective 'mnr' has no option\(s\) \['nope'\]"):
        TrainConfig(objectives={"mnr": {"nope": 1}}, model=ModelConfig(pair_encoding="siamese")).validate()
    with pytest.raises(ValueError, match=r"objective 'mnr': .*scale"):
        build_objectives({"mnr": {"scale": -1.0}}, None)


def test_the_readmes_objective_loads_from_a_file_outside_the_package_with_no_version_change(tmp_path, tiny_env):
    """README's example objective, as a file of one's own (--objective-module), trains (its term logged), and the
    run's config.json keeps today's config version, records the objective's own version and file, and loads in a
    new process (--eval-only) through that record when the user trusts it (--trust-objective-modules: a saved run
    imports no file unasked, tests/test_train.py); nothing under tasks/objectives/ changed. In subprocesses: the
    registry of this one stays the package's."""
    import json
    import re
    import subprocess
    import sys

    from tasks.config_versions import CONFIG_VERSION
    from tests.helpers import ROOT, tiny_flags

    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Adding an objective.*?```python\n(.*?)```", readme, re.S).group(1)
    plugin = tmp_path / "elsewhere" / "my_loss.py"
    plugin.parent.mkdir()
    plugin.write_text(code)
    run = tmp_path / "run"
    train = [sys.executable, str(ROOT / "train_multitask.py"), *tiny_flags(tiny_env, run), "--tasks", "sst",
             "--objective-module", str(plugin), "--objective", "my_loss", "--my-loss-temperature", "0.5"]
    done = subprocess.run(train, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "sst/my_loss.neg_entropy" in records[0]["train"]
    saved = json.loads((run / "config.json").read_text())
    assert saved["config_version"] == CONFIG_VERSION and saved["objective_versions"] == {"my_loss": 1}
    assert saved["objective_modules"] == [str(plugin)] and saved["objectives"] == {"my_loss": {"temperature": 0.5}}
    again = subprocess.run([sys.executable, str(ROOT / "train_multitask.py"), "--eval-only", "--out-dir", str(run),
                            "--trust-objective-modules"], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0, again.stderr[-2000:]
    assert not list((ROOT / "tasks" / "objectives").glob("my_loss*"))


# ---- objective files of one's own (load_plugin, MINBERT_PLUGINS, a saved run's recorded files) -------------------


def _readme_objective(path, name: str = "my_loss", marker=None):
    """README's example objective written to ``path`` under objective name ``name``; with ``marker``, importing the
    file appends a line to that file (what a test counts imports by)."""
    import re

    from tests.helpers import ROOT

    code = re.search(r"## Adding an objective.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    code = code.replace('name = "my_loss"', f'name = "{name}"')
    if marker is not None:
        code = f"with open({str(marker)!r}, 'a') as _f:\n    _f.write('imported\\n')\n" + code
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    return path


def test_a_file_that_takes_a_builtin_name_is_refused_naming_the_file_and_the_builtin(tmp_path):
    """A file of one's own defining an objective named "mnr" is refused when it is loaded, first thing in a fresh
    process as the train command does: one ValueError naming the file, the name and the built-in that has it; the
    built-in keeps it. In a subprocess: only a fresh process has not imported the package's objectives yet."""
    import subprocess
    import sys

    dup = _readme_objective(tmp_path / "dup.py", name="mnr")
    script = ("import sys\nfrom tasks.objectives import REGISTRY, load_plugin, registered_objectives\n"
              "try:\n    load_plugin(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n"
              "print(registered_objectives()['mnr'].__module__)\n")
    done = subprocess.run([sys.executable, "-c", script, str(dup)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    message, owner = done.stdout.splitlines()
    assert message == (f"--objective-module {dup} defines objective 'mnr', a name the built-in objective of "
                       "tasks/objectives/mnr.py has: give the objective in dup.py another name")
    assert owner == "tasks.objectives.mnr"


def test_a_bad_minbert_plugins_entry_is_named_as_minbert_plugins(plugin_registry, tmp_path, monkeypatch):
    """A MINBERT_PLUGINS file that is not there, or fails to import, is reported as MINBERT_PLUGINS's, with what
    to do; whatever a failed file registered is unregistered."""
    monkeypatch.setenv(objectives.PLUGINS_ENV, str(tmp_path / "nope.py"))
    with pytest.raises(ValueError) as error:
        registered_objectives()
    assert str(error.value) == (f"MINBERT_PLUGINS names {tmp_path / 'nope.py'}: no such Python file: correct "
                                "MINBERT_PLUGINS or unset it")
    broken = _readme_objective(tmp_path / "broken.py", name="half_loaded")
    broken.write_text(broken.read_text() + "\nraise RuntimeError('boom')\n")
    monkeypatch.setenv(objectives.PLUGINS_ENV, str(broken))
    with pytest.raises(ValueError, match=rf"^MINBERT_PLUGINS names {broken} failed to import: RuntimeError: boom$"):
        registered_objectives()
    assert "half_loaded" not in objectives.REGISTRY


def test_a_runs_recorded_file_is_imported_only_when_trusted_or_named_again(plugin_registry, tmp_path):
    """Reading a saved run (its objectives and objective_modules) imports its recorded file only with trust
    (--trust-objective-modules); without, one ValueError names the file and the three ways to load it, and the
    file is not imported; an objective registered already (the file named again, from where it now is) needs no
    file of the run's, and a recorded file that is gone is said to be gone."""
    from tasks.objectives import recorded_modules

    marker = tmp_path / "imports.txt"
    recorded = _readme_objective(tmp_path / "run" / "my_loss.py", marker=marker)
    with pytest.raises(ValueError) as error:
        recorded_modules({"my_loss": {}}, [str(recorded)], trust=False)
    assert str(error.value) == (f"objective 'my_loss' comes from the run's own file {recorded}, and reading a saved "
                                f"run imports no file unless you name it: pass --objective-module {recorded} (or "
                                f"MINBERT_PLUGINS={recorded}), or --trust-objective-modules to import the file(s) "
                                "the run recorded")
    assert not marker.exists() and "my_loss" not in objectives.REGISTRY
    recorded_modules({"mnr": {}}, [str(recorded)], trust=False)  # built-ins only: nothing to import
    recorded_modules({"my_loss": {}}, [str(recorded)], trust=True)
    assert marker.read_text() == "imported\n" and "my_loss" in objectives.REGISTRY

    plugin_registry()
    moved = tmp_path / "elsewhere" / "my_loss.py"
    moved.parent.mkdir()
    recorded.rename(moved)
    with pytest.raises(ValueError, match=r"comes from the run's own file .*/run/my_loss\.py, which is no longer "
                                         r"there: name where it is now with --objective-module FILE"):
        recorded_modules({"my_loss": {}}, [str(recorded)], trust=False)
    with pytest.raises(ValueError, match=r"^the run's objective module .*/run/my_loss\.py: no such Python file: the "
                                         r"run recorded it there; name where it is now with --objective-module FILE"):
        recorded_modules({"my_loss": {}}, [str(recorded)], trust=True)
    objectives.load_plugin(moved)  # named again, where it is now
    recorded_modules({"my_loss": {}}, [str(recorded)], trust=False)
    assert marker.read_text() == "imported\n" * 2


def test_the_readmes_objective_added_under_tasks_objectives_needs_no_edit_elsewhere(tmp_path):
    """README's example objective written as tasks/objectives/my_loss.py of a copy of the checkout, nothing else
    edited: there the version test passes and the objective tables take it (the meta device, LP-FT), as README's
    'Adding an objective' says. In a subprocess whose imports are the copy's (a test the copy does not see would
    select nothing: pytest's exit status 5)."""
    import re
    import shutil
    import subprocess
    import sys

    from tests.helpers import ROOT

    copy = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("tasks", "minbert", "tests", "experiments", "benchmarks"):
        shutil.copytree(ROOT / part, copy / part, ignore=skip)
    for part in ("train_multitask.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, copy / part)
    code = re.search(r"## Adding an objective.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    (copy / "tasks" / "objectives" / "my_loss.py").write_text(code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "my_loss or own_version",
         "tests/test_config_versions.py", "tests/objectives/test_init.py::test_objective_runs_on_the_meta_device",
         "tests/training/test_stages.py"],
        cwd=copy, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\b[4-9] passed", summary), summary  # the version test, 2 meta cases and LP-FT at least


def test_every_kind_an_objective_names_has_its_rule():
    """Each objective that computes from a head's outputs has a rule for every kind its ``kinds`` names (a pair
    classification: of C classes and of one logit), so that none is refused at a batch after its config accepted
    the task; the one exception is refused before any data (MNR ranks a pair classification's positive pairs,
    which needs two classes: its check_run)."""
    from tasks.objectives.distill import TARGETS, TERMS
    from tasks.objectives.knn_bert import PROBABILITIES
    from tasks.objectives.mnr import PAIRS
    from tasks.objectives.rdrop import CATEGORICAL
    from tasks.objectives.rift import LOG_PROBS
    from tasks.objectives.scl import CLASSES
    from tasks.objectives.smart import DIVERGENCES
    from tasks.task import KINDS, PAIR_BINARY, Classes

    tables = {"distill": [TARGETS, TERMS], "knn_bert": [PROBABILITIES], "mnr": [PAIRS], "rdrop": [CATEGORICAL],
              "rift": [LOG_PROBS], "scl": [CLASSES], "smart": [DIVERGENCES]}
    refused_first = {("mnr", Classes)}
    for name, rules in tables.items():
        kinds = {type(KINDS[k]) for k in REGISTRY[name].kinds} | (
            {type(PAIR_BINARY)} if "pair-classification" in REGISTRY[name].kinds else set())
        for table in rules:
            assert kinds - {k for n, k in refused_first if n == name} <= set(table), name
            assert set(table) <= kinds, name  # no rule for a kind it does not name
