"""No host reads in the hot path (issue 13): a meta-device smoke test of every objective, a source scan for host
reads, and the rewrites that removed them checked against the formulas they replaced.

The meta device holds shapes and no values: any read of a tensor's value (``.item()``, ``int(t)``, ``bool(t)``,
a boolean-mask index whose size depends on the data) raises, and so does mixing a CPU tensor with a device one.
Running forward, backward and a fused AdamW step there exercises the non-CPU branches of the code without a GPU.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from minbert.bert import BertModel
from minbert.optimizer import AdamW
from tasks.model import ModelConfig, MultitaskBert
from tasks.objectives import REGISTRY, build_objectives, import_all
from tasks.objectives.distill import Distill, TaskTargets
from tests.helpers import tiny_config

ROOT = Path(__file__).resolve().parents[1]
META = torch.device("meta")
N, T = 8, 7

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the meta-device smoke test ---------------------------------------------------------------------------------


def _side(suffix: str, g: torch.Generator, width: int = T) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 99, (N, width), generator=g)
    mask = torch.ones(N, width, dtype=torch.long)
    mask[1, width - 2:] = 0
    return {"input_ids" + suffix: ids * mask, "attention_mask" + suffix: mask,
            "token_type_ids" + suffix: torch.zeros_like(ids)}


def meta_batch(task: str, pair_encoding: str, seed: int = 0) -> dict:
    """A collated-looking batch (ids, masks, labels) on the meta device, plus its example ids (strings)."""
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
    batch = {k: v.to(META) for k, v in batch.items()}
    batch["ids"] = [f"{task}-{i}" for i in range(N)]
    return batch


def meta_settings(pair_encoding: str) -> dict[str, dict]:
    """Options that let every registered objective apply to every task it can take with this pair encoding."""
    pair_vector = {} if pair_encoding == "cross" else {"representation": "head_input"}
    return {
        "distill": {"teachers": ["unused: targets are set by hand"]},
        "knn_bert": {"m_most": 2, "m_least": 2, "queue_size": 12, **pair_vector},
        "match_tuning": {},
        "mnr": {"para_positives": True},
        "rift": {"steps": 1},
        "scl": {} if pair_encoding == "cross" else {"embedding": "head_input"},
        "simcse": {"tasks": ("sst", "para", "sts", "nli")},
        "smart": {},
    }


def test_every_registered_objective_has_meta_settings():
    """A newly registered objective must join the meta smoke test."""
    assert set(REGISTRY) == set(meta_settings("cross"))


import_all()
# Siamese-only objectives (MNR) are refused with cross-encoded pairs before training starts: no such case.
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
        g = torch.Generator().manual_seed(1)
        obj.targets = {t: TaskTargets({f"{t}-{i}": i for i in range(N)}, x, [])
                       for t, x in (("sst", torch.rand(N, 5, generator=g).softmax(-1)),
                                    ("para", torch.rand(N, generator=g)), ("sts", torch.rand(N, generator=g) * 5))}
    opt = AdamW([*model.parameters(), *obj.parameters()], lr=1e-3, weight_decay=0.01, fused=True)
    streams = [s for s in ("sst", "para", "sts", "nli") if obj.applies_to(s)]
    if pair_encoding == "cross":
        streams = [s for s in streams if s != "nli"]  # the NLI stream feeds Siamese triplets only
    assert streams
    for step, stream in enumerate(streams):
        batch = meta_batch(stream, pair_encoding, seed=step)
        out, total = None, None
        if stream != "nli":
            transform = obj.transform_for(stream, True) if hasattr(obj, "transform_for") else None
            out = model(stream, batch, transform=transform)
            total = obj.task_loss_scale * model.task_loss(stream, out, batch)
        terms = obj(model, stream, batch, out)
        for term in terms.values():
            assert term.device == META and term.dim() == 0, (stream, term)
            total = obj.weight * term if total is None else total + obj.weight * term
        total.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        obj.on_step_end(model)
    assert all(int(s["step"]) >= 1 for s in opt.state.values())
    if isinstance(obj, Distill):  # moved to the device once, then indexed there: no per-step blocking copy
        assert {t.targets.device for t in obj.targets.values()} == {META}


# ---- the rewrites compute what the host-reading formulas computed ---------------------------------------------------


def _scl_before(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """scl_loss as it was before issue 13: a host-read branch for "no positive anywhere", −inf self-mask."""
    import torch.nn.functional as F

    n = features.shape[0]
    phi = F.normalize(features.float(), dim=-1)
    self_mask = torch.eye(n, dtype=torch.bool)
    positives = (labels.view(-1, 1) == labels.view(1, -1)) & ~self_mask
    n_pos = positives.sum(1)
    if not bool((n_pos > 0).any()):
        return (phi * 0.0).sum()
    logits = ((phi @ phi.T) / temperature).masked_fill(self_mask, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(1)
    return (-pos_log_prob / n_pos.clamp_min(1)).sum()


@pytest.mark.parametrize("labels", [[0, 1, 0, 2, 1, 0, 3], [0, 1, 2, 3], [4], [1, 1]])
def test_scl_without_host_read_equals_the_old_formula(labels):
    """scl_loss (no branch on the host, most-negative-float self-mask) equals the old formula in value and gradient:
    with singleton classes, with no positive anywhere, for a batch of one and of one pair."""
    from tasks.objectives.scl import scl_loss

    g = torch.Generator().manual_seed(len(labels))
    x = torch.randn(len(labels), 6, generator=g)
    new, old = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = torch.tensor(labels)
    got, want = scl_loss(new, y, 0.3), _scl_before(old, y, 0.3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    got.backward()
    want.backward()
    assert torch.isfinite(new.grad).all()
    torch.testing.assert_close(new.grad, old.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("task", ["sst", "para", "sts"])
def test_distill_targets_on_device_equal_the_old_lookup(task):
    """Distill's term with the target table moved to the device once and indexed there equals the old per-step
    lookup (CPU rows copied to the student's device), over repeated batches in another order."""
    from tasks.model import TaskOutput
    from tasks.objectives.distill import DistillConfig, distill_loss

    g = torch.Generator().manual_seed(2)
    n = 12
    table = {"sst": torch.rand(n, 5, generator=g).softmax(-1), "para": torch.rand(n, generator=g),
             "sts": torch.rand(n, generator=g) * 5}[task]
    ids = [f"x{i}" for i in range(n)]
    obj = Distill(DistillConfig(teachers=("unused",), temperature=2.0))
    obj.targets = {task: TaskTargets({i: k for k, i in enumerate(ids)}, table.clone(), [])}
    for batch_ids in (ids[3:9], ids[::-2]):
        shape = (len(batch_ids), 5) if task == "sst" else (len(batch_ids),)
        logits = torch.randn(shape, generator=g)
        got = obj(None, task, {"ids": batch_ids}, TaskOutput(logits))["loss"]
        old_target = table[torch.tensor([ids.index(i) for i in batch_ids])].to(logits.device)
        assert torch.equal(got, distill_loss(task, logits, old_target, 2.0))


def test_masked_lm_loss_with_host_positions_equals_the_boolean_index_and_runs_on_meta():
    """masked_lm_loss with positions computed on the CPU (and without them) equals the old h[labels != -100] form
    exactly; on the meta device, with the positions given, it runs without reading a device value."""
    from minbert.bert import BertModel as Bert
    from tasks.training.mlm import IGNORE_INDEX, BertForMaskedLM, masked_positions, mlm_loss

    torch.manual_seed(0)
    mlm = BertForMaskedLM(Bert(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 99, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    labels = torch.where(torch.rand(4, 9, generator=g) < 0.3, ids, torch.full_like(ids, IGNORE_INDEX))
    labels[0, 1] = ids[0, 1]  # at least one masked position
    with torch.no_grad():
        h = mlm.bert(ids, mask)["last_hidden_state"]
        where = labels != IGNORE_INDEX
        old_logits = mlm.head(h[where])
        old = mlm_loss(old_logits, labels[where])
        for positions in (masked_positions(labels), None):
            loss, logits, targets = mlm.masked_lm_loss(ids, mask, labels, positions)
            assert torch.equal(loss, old) and torch.equal(logits, old_logits) and torch.equal(targets, labels[where])

    meta = copy.deepcopy(mlm).to(META)
    loss, logits, _ = meta.masked_lm_loss(ids.to(META), mask.to(META), labels.to(META),
                                          masked_positions(labels).to(META))
    loss.backward()
    assert loss.device == META and logits.shape == old_logits.shape


# ---- the source scan: no host reads where every training step passes ------------------------------------------------

ALLOW = "# host-read:"  # end-of-line marker of an allowed read, followed by its reason
HOST_METHODS = {"item", "tolist", "numpy", "cpu"}
HOST_CASTS = {"int", "float", "bool"}


def _literal(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return isinstance(node, ast.Constant)


def host_reads(fn: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each host read in a function: .item() / .tolist() / .numpy() / .cpu(), int( / float( /
    bool( of anything but a literal, and torch.tensor(..., device=...) (a host-to-device copy)."""
    found = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in HOST_METHODS:
            found.append((node.lineno, f".{f.attr}()"))
        elif isinstance(f, ast.Name) and f.id in HOST_CASTS and node.args and not all(map(_literal, node.args)):
            found.append((node.lineno, f"{f.id}(...)"))
        elif (isinstance(f, ast.Attribute) and f.attr == "tensor" and isinstance(f.value, ast.Name)
              and f.value.id == "torch" and any(k.arg == "device" for k in node.keywords)):
            found.append((node.lineno, "torch.tensor(..., device=...)"))
    return found


def hot_functions(root: Path = ROOT) -> list[tuple[Path, str, ast.AST]]:
    """(file, qualified name, node) of every function a training step runs: AdamW's ``step`` methods
    (minbert/optimizer.py), every ``forward`` of a class under tasks/objectives/, and every function named
    ``train_step`` or ``step_loss`` anywhere under tasks/ (found by name, wherever the training loop lives);
    with each, the module-level functions of the same file that it calls by name, transitively (the fused
    update, the loss functions), named ``caller -> helper``."""
    out = []
    for path in [root / "minbert" / "optimizer.py", *sorted((root / "tasks").rglob("*.py"))]:
        tree = ast.parse(path.read_text(), filename=str(path))
        objectives = "objectives" in path.relative_to(root).parts
        roots = []
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        (path.name == "optimizer.py" and fn.name == "step") or (objectives and fn.name == "forward")):
                    roots.append((f"{cls.name}.{fn.name}", fn))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in ("train_step", "step_loss"):
                roots.append((fn.name, fn))
        helpers = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for name, fn in roots:
            out.append((path, name, fn))
            todo, seen = [fn], set()
            while todo:
                for call in ast.walk(todo.pop()):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                            and call.func.id in helpers and call.func.id not in seen):
                        seen.add(call.func.id)
                        todo.append(helpers[call.func.id])
                        out.append((path, f"{name} -> {call.func.id}", helpers[call.func.id]))
    return out


def offending_lines(root: Path = ROOT) -> list[str]:
    """file:line (function: what) of every host read in the hot functions not marked ``# host-read: <reason>``."""
    bad = []
    for path, name, fn in hot_functions(root):
        lines = path.read_text().splitlines()
        for line, what in host_reads(fn):
            text = lines[line - 1]
            reason = text.split(ALLOW, 1)[1].strip() if ALLOW in text else ""
            if not reason:
                bad.append(f"{path.relative_to(root)}:{line} ({name}: {what})")
    return sorted(set(bad))


def test_hot_path_source_has_no_unmarked_host_reads():
    """No host read in the optimizer step, the objectives' forwards, train_step or step_loss, except lines marked
    ``# host-read: <reason>``. The scan finds what it must scan (not vacuous if files move)."""
    found = {(p.name, name) for p, name, _ in hot_functions()}
    assert ("optimizer.py", "AdamW.step") in found
    assert {"train_step", "step_loss"} <= {name for _, name, _ in hot_functions()}
    import_all()
    for cls in REGISTRY.values():
        module = Path(__import__(cls.__module__, fromlist=["_"]).__file__).name
        assert (module, f"{cls.__name__}.forward") in found, cls.__name__
    assert offending_lines() == []


def test_source_scan_catches_each_kind_of_host_read(tmp_path):
    """The scan flags .item(), .tolist(), int/float/bool of a non-literal, torch.tensor(..., device=...), lists them
    as file:line, accepts a line marked with a reason and refuses the marker without one."""
    tree = copy_tree(tmp_path)
    target = tree / "tasks" / "objectives" / "scl.py"
    source = target.read_text()
    anchor = '        labels = batch["labels"]\n'
    assert anchor in source
    injected = ("        a = out.features[key].sum().item()\n"
                "        b = labels.tolist()\n"
                "        c = int(labels.sum())\n"
                "        d = float(3) + bool(0) + int(-1)\n"
                "        e = torch.tensor(1.0, device=labels.device)\n"
                "        f = bool(labels.any())  # host-read: a test says why\n"
                "        g = float(labels.max())  # host-read:\n")
    target.write_text(source.replace(anchor, anchor + injected, 1))
    first = source[:source.index(anchor)].count("\n") + 2  # line of the first injected statement
    bad = offending_lines(tree)
    path = "tasks/objectives/scl.py"
    assert bad == sorted([f"{path}:{first} (SupervisedContrastive.forward: .item())",
                          f"{path}:{first + 1} (SupervisedContrastive.forward: .tolist())",
                          f"{path}:{first + 2} (SupervisedContrastive.forward: int(...))",
                          f"{path}:{first + 4} (SupervisedContrastive.forward: torch.tensor(..., device=...))",
                          f"{path}:{first + 6} (SupervisedContrastive.forward: float(...))"])


def copy_tree(tmp_path: Path) -> Path:
    """A copy of minbert/ and tasks/ (python sources only) under tmp_path, to scan edited versions of."""
    import shutil

    for package in ("minbert", "tasks"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path
