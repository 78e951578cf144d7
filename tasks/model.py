"""MultitaskBert: one BERT encoder and a head per task (SST, paraphrase, STS, and any other task of the run).

Usage:
    encoder, tok = load_pretrained()
    model = MultitaskBert(encoder, ModelConfig(arch="b1"))
    out = model("sst", batch)              # TaskOutput: logits (B, 5), features
    loss = model.task_loss("sst", out, batch)
    preds = model.predict("sst", out)      # class ids

Architectures (paper: ../shared/papers/minbert-downstream-generalization.txt):
- ``baseline`` (§4.1): SST = dropout + linear on the pooled [CLS]; paraphrase =
  Siamese, each sentence -> linear (32) -> dot product + a learned offset (ours:
  without it the threshold is fixed at 0; it starts from the training pairs'
  log-odds, ``init_offset``) -> sigmoid (BCE);
  STS = Siamese, linear (32) per sentence -> 5 × cosine (MSE).
- ``b1`` (§4.3, Figure 1): two shared FCN layers (H -> F -> F, ReLU) used by all
  tasks and concatenated with each task's own FCN layer (H -> F, ReLU);
  SST: [shared, own] -> ReLU MLP -> 5 logits; paraphrase (structural change):
  element-wise products of the two sentences' shared and own features,
  concatenated with the raw [CLS] embeddings, -> ReLU MLP -> logit;
  STS: Siamese on [shared, own], 5 × cosine. F = ``fcn_size`` (paper: 256).
  The paper's figure is not in our copy of the text; this follows its prose.
- ``pair_encoding="cross"``: paraphrase and STS read both sentences in one
  sequence ([CLS] a [SEP] b [SEP], token types 0/1) and score the pooled output
  (paraphrase: logit; STS: 5 × sigmoid). Not in the paper; public project repos
  report it as the largest single gain on STS.

The encoder may run under autocast (bf16); the heads always compute in float32
(autocast off), so logits, scores and head features are float32.

A task's kind (tasks/task.py) builds its head and owns its loss (cross-entropy, BCE with logits, MSE) and
prediction rule: a single-sentence classification is built as SST's head, a pair classification as the
paraphrase head, a pair regression as the STS head, with the task's own number of classes. Objectives that
need more get it through explicit arguments: ``inputs_embeds`` to start from
(perturbed) word embeddings and ``embed`` for extra passes; a model option that changes the pooled
embedding between encoder and head (Match-Tuning) installs it with ``set_pooled_transform``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from minbert.bert import BertModel
from tasks.options import option
from tasks.task import MULTITASK, Kind, Task, get_task, model_tasks, stream_task

# ---- wrappers and train/eval modes, for objectives that run the model or a copy of it ----

@contextmanager
def preserved_modes(model: nn.Module) -> Iterator[nn.Module]:
    """Restore the train/eval mode of every submodule of ``model`` on exit (also on an exception).

    ``model.train(was_training)`` would put *every* submodule in the top module's
    mode, turning dropout back on in an encoder that LP-FT keeps in eval mode
    under heads in train mode; this puts each one back as it was.
    """
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def follow_modes(copy_: nn.Module, original: nn.Module) -> None:
    """Give each submodule of ``copy_`` (a deep copy of ``original``) the train/eval mode of its original.

    Module by module, so a frozen encoder in eval mode under heads in train
    mode (LP-FT stage 1) is copied as such.
    """
    for m, o in zip(copy_.modules(), original.modules(), strict=True):
        m.training = o.training


# ---- the streams, the heads' config and the model ----
NLI = "nli"  # the AllNLI triplet stream: trained by objectives only (no head)
PHRASES = "phrases"  # the SST entry's extra stream (its treebank phrases, --sst-phrases), through the SST head


def head_of(stream: str) -> str | None:
    """The task whose head trains on ``stream``: the stream itself, the task that declares it for an extra
    stream (its entry's ``stream``: SST's phrases), None for NLI (no head)."""
    if stream == NLI:
        return None
    return stream_task(stream) or stream


def kind_of(stream: str) -> Kind | None:
    """The kind of the task whose head trains on ``stream`` (``head_of``), None for NLI."""
    task = head_of(stream)
    return None if task is None else get_task(task).kind


ARCHS = ("baseline", "b1")


PAIR_ENCODINGS = ("siamese", "cross")


POOLINGS = ("pooler", "cls", "mean")


@dataclass
class ModelConfig:
    """The heads and how sentences reach them; every field is a CLI flag (``--arch``, ``--pair-encoding``, ...)."""

    arch: str = option("baseline", "task heads: baseline (paper §4.1: linear heads, Siamese pairs) or b1 (§4.3: "
                       "shared FCN layers, non-linear heads, the paraphrase structural change)", choices=ARCHS, group="model")
    pair_encoding: str = option("siamese", "siamese: each sentence encoded alone (paper §4.1); cross: "
                                "'[CLS] a [SEP] b [SEP]' as one sequence (not in the paper; cheaper and stronger "
                                "on CPU)", choices=PAIR_ENCODINGS, group="model")
    pooling: str = option("pooler", "the sentence embedding the heads read: pooler = pooled [CLS] (paper §4.1), "
                          "cls = raw [CLS], mean = mean over tokens", choices=POOLINGS, group="model")
    fcn_size: int = option(256, "size of the b1 FCN layers (paper: 256, §4.3/§5.4)", metavar="SIZE", group="model")
    baseline_proj_size: int = option(32, "Siamese intermediate embedding of the baseline heads (paper: 32, §4.1)", metavar="SIZE", group="model")
    head_dropout: float = option(0.3, "dropout before every head linear layer (paper: 0.3 in the baseline §4.1 and "
                                 "B3, none in B1/B2 §5.4)", metavar="P", group="model")
    sts_scale: float = option(5.0, "STS prediction = this x cosine (Siamese) or x sigmoid (cross) (paper: 5.0, §4.1)", metavar="SCALE", group="model")

    def __post_init__(self) -> None:
        for name, value, allowed in (("arch", self.arch, ARCHS), ("pair_encoding", self.pair_encoding, PAIR_ENCODINGS),
                                     ("pooling", self.pooling, POOLINGS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(f"head_dropout must be in [0, 1), got {self.head_dropout}")
        if self.fcn_size < 1 or self.baseline_proj_size < 1:
            raise ValueError("fcn_size and baseline_proj_size must be positive")
        if not self.sts_scale > 0:
            raise ValueError(f"sts_scale must be positive (STS labels are 0-5), got {self.sts_scale}")


@dataclass
class TaskOutput:
    """What a head computed: ``logits`` and the intermediate features objectives use.

    logits: SST (B, 5); paraphrase (B,) logit; STS (B,) predicted score: in [0, 5]
    for b1 and cross, in [-5, 5] for the baseline's Siamese 5 × cosine (§4.1).
    features: "pooled" (B, H) for one-sequence inputs, "pooled_1"/"pooled_2" for
    Siamese pairs; "head_input" (B, D) for SST and cross pairs (what SCL/KNN use);
    "cos_1"/"cos_2" (B, D) a Siamese regression's embeddings whose cosine is the score (MNR uses them).
    """

    logits: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)


def _float32(x: torch.Tensor) -> torch.autocast:
    """Autocast off on ``x``'s device: the heads compute in float32 whatever the encoder's precision, so
    scores and logits keep float32 precision (bf16's 8-bit significand would round STS scores into ties)."""
    return torch.autocast(x.device.type, enabled=False)


def _mlp(sizes: list[int], dropout: float) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last), dropout before each linear."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class MultitaskBert(nn.Module):
    """The encoder and a head per task (``model_tasks(tasks)``: the project's three and the run's others), each
    built by its kind (tasks/task.py) and named ``<task>_head`` (b1: and ``<task>_own``; the baseline's Siamese
    pair classification: and ``<task>_bias``), HF-style names the checkpoints keep."""

    def __init__(self, encoder: BertModel, config: ModelConfig, tasks: Sequence[str] = MULTITASK):
        super().__init__()
        self.encoder = encoder
        self.config = config
        self.tasks = model_tasks(tasks)
        H, Fs, P, p = encoder.config.hidden_size, config.fcn_size, config.baseline_proj_size, config.head_dropout
        if config.pooling == "pooler" and encoder.pooler is None:
            raise ValueError("pooling='pooler' needs an encoder with a pooler")
        cross = config.pair_encoding == "cross"
        entries = [get_task(t) for t in self.tasks]
        # Registered in one order per arch (b1: the shared layers, every task's own layer, every head), which is
        # the order _init_heads draws their initial weights in.
        if config.arch == "baseline":
            for t in entries:
                n = t.kind.out_features(t)
                if t.kind.pair and not cross:  # Siamese: a projection per sentence, compared
                    setattr(self, f"{t.name}_head", _mlp([H, P], p))
                    if t.kind.siamese == "compare" and t.kind.binary:  # the dot product's threshold, learned
                        setattr(self, f"{t.name}_bias", nn.Parameter(torch.zeros(())))
                    elif t.kind.siamese == "compare":  # C classes: Sentence-BERT's classifier on (u, v, |u - v|)
                        setattr(self, f"{t.name}_classifier", _mlp([3 * P, n], p))
                else:
                    setattr(self, f"{t.name}_head", _mlp([H, n], p))
        else:
            self.shared = nn.Sequential(_mlp([H, Fs, Fs], p), nn.ReLU())
            for t in entries:
                setattr(self, f"{t.name}_own", nn.Sequential(_mlp([H, Fs], p), nn.ReLU()))
            for t in entries:
                n = t.kind.out_features(t)
                if not t.kind.pair or cross:
                    head = _mlp([2 * Fs, Fs, n], p)
                elif t.kind.siamese == "compare":  # the structural change: products of both + both raw embeddings
                    head = _mlp([2 * Fs + 2 * H, Fs, n], p)
                else:  # Siamese regression: the cosine of the [shared, own] features
                    head = nn.Identity()
                setattr(self, f"{t.name}_head", head)
        # Changes of a task's pooled embeddings between encoder and head, installed by a model option such as
        # Match-Tuning's batch matching (an nn.Module without parameters: it follows train()/eval()).
        self.pooled_transforms = nn.ModuleDict()
        self._init_heads()

    def _init_heads(self) -> None:
        """A head Linear that feeds a ReLU: He init, N(0, 2/fan_in) (He et al. 2015, §2.2); every other
        head Linear (to logits and scores, the baseline's Siamese projections): BERT's N(0, 0.02²); biases 0.

        BERT's 0.02 suits its own LayerNorm'd layers, not bare ReLU stacks: there each layer scales the
        signal by 0.02 · √(fan_in / 2) (≈ 0.23 for F = 256), so b1's logits start almost equal and a short
        run can stay at that start, a constant prediction (measured: experiments/RESULTS.md, the ablation
        ladder).
        """
        std = self.encoder.config.initializer_range
        leaves = [m for name, m in self.named_modules() if not name.startswith("encoder") and not list(m.children())]
        after = [m for m in leaves if not isinstance(m, nn.Dropout)] + [None]  # what each layer feeds
        for m, nxt in zip(after, after[1:]):
            if isinstance(m, nn.Linear):
                if isinstance(nxt, nn.ReLU):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                else:
                    nn.init.normal_(m.weight, std=std)
                nn.init.zeros_(m.bias)

    def _entry(self, task: str) -> Task:
        if task not in self.tasks:
            raise ValueError(f"unknown task {task!r}; this model's tasks are {list(self.tasks)}")
        return get_task(task)

    def span(self, task: Task) -> float:
        """A regression head's high - low: its range's, or the ModelConfig option its entry names (STS's
        ``sts_scale``, the paper's 5 x)."""
        if task.span_option:
            return getattr(self.config, task.span_option)
        low, high = task.score_range
        return high - low

    def offsets(self) -> tuple[str, ...]:
        """The tasks with a learned offset (the baseline's Siamese pair classification): ``init_offset`` starts it."""
        return tuple(t for t in self.tasks if hasattr(self, f"{t}_bias"))

    @torch.no_grad()
    def init_offset(self, task: str, batch: dict) -> None:
        """Start the baseline's Siamese paraphrase offset from data (as Salimans & Kingma 2016, §3, start
        weight-normalized layers): the logits of ``batch`` (eval mode) then average the log-odds of its
        paraphrase rate.

        At 0 the offset leaves the threshold where the dot products of any two questions' projections
        start (mean-pooled embeddings point alike: nearly every pair starts above 0), and Adam moves it by
        roughly lr a step, so a short run stays below the majority class (measured: experiments/RESULTS.md,
        the ablation ladder).
        """
        training = self.training
        self.eval()
        bias = getattr(self, f"{task}_bias")
        dots = self(task, batch).logits - bias
        p = batch["labels"].float().mean().clamp(0.01, 0.99)
        bias.copy_(torch.log(p / (1 - p)) - dots.mean())
        self.train(training)

    # ---- encoding ---------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              token_type_ids: torch.Tensor | None = None,
              inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The sentence embedding (B, H) the heads read, per ``config.pooling``."""
        out = self.encoder(input_ids=None if inputs_embeds is not None else input_ids,
                           attention_mask=attention_mask, token_type_ids=token_type_ids,
                           inputs_embeds=inputs_embeds)
        if self.config.pooling == "pooler":
            return out["pooler_output"]
        h = out["last_hidden_state"]  # (B, T, H)
        if self.config.pooling == "cls":
            return h[:, 0]
        m = attention_mask.unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)

    def _embed_side(self, batch: dict, suffix: str, inputs_embeds: dict | None) -> torch.Tensor:
        return self.embed(batch["input_ids" + suffix], batch["attention_mask" + suffix],
                          batch.get("token_type_ids" + suffix),
                          None if inputs_embeds is None else inputs_embeds.get(suffix))

    def _features(self, task: str, e: torch.Tensor) -> torch.Tensor:
        """B1's [shared, task-own] features (B, 2F); the baseline has none."""
        return torch.cat([self.shared(e), getattr(self, f"{task}_own")(e)], dim=-1)

    # ---- heads ------------------------------------------------------------------

    def set_pooled_transform(self, task: str, transform: nn.Module) -> None:
        """Apply ``transform`` to ``task``'s pooled embeddings (B, H) -> (B, H) before its head, in every forward
        (Match-Tuning's batch matching). It holds no parameters of its own and reads ``self.training`` to act
        differently in evaluation."""
        self._entry(task)
        if any(True for _ in transform.parameters()):
            raise ValueError("a pooled transform may not hold parameters: the checkpoint format has no place for them")
        self.pooled_transforms[task] = transform

    def forward(self, task: str, batch: dict, inputs_embeds: dict[str, torch.Tensor] | None = None) -> TaskOutput:
        """Run ``task``'s head on a collated batch.

        inputs_embeds: word embeddings to start from, keyed by the batch's key
        suffix ("" for one sequence, "_1"/"_2" for Siamese sides).
        """
        entry = self._entry(task)
        kind = entry.kind
        t = self.pooled_transforms[task] if task in self.pooled_transforms else (lambda e: e)
        cfg = self.config
        if not kind.pair or (cfg.pair_encoding == "cross" and "input_ids" in batch):
            e = self._embed_side(batch, "", inputs_embeds)  # (B, H), in the autocast dtype
            with _float32(e):
                e = t(e.float())
                x = e if cfg.arch == "baseline" else self._features(task, e)
                logits = kind.head_output(entry, getattr(self, f"{task}_head")(x),
                                          None if kind.classification else self.span(entry))
            return TaskOutput(logits, {"pooled": e, "head_input": x})
        if cfg.pair_encoding == "cross" or "input_ids_1" not in batch:
            # A cross model's pair heads score one joint sequence; fed two sides they would
            # silently compute something else (baseline para: product of two 1-d outputs).
            raise ValueError(f"{task}: pair_encoding={cfg.pair_encoding!r} but the batch has keys {sorted(batch)}")
        e1 = self._embed_side(batch, "_1", inputs_embeds)
        e2 = self._embed_side(batch, "_2", inputs_embeds)
        with _float32(e1):
            e1, e2 = t(e1.float()), t(e2.float())
            feats = {"pooled_1": e1, "pooled_2": e2}
            if kind.siamese == "compare":
                head = getattr(self, f"{task}_head")
                if cfg.arch == "baseline" and kind.binary:
                    u, v = head(e1), head(e2)  # (B, P)
                    # + a learned offset: at 0 the threshold is where any two similar sentences start out
                    # (init_offset says why it starts from data)
                    logits = (u * v).sum(-1) + getattr(self, f"{task}_bias")
                elif cfg.arch == "baseline":
                    u, v = head(e1), head(e2)  # (B, P)
                    x = torch.cat([u, v, (u - v).abs()], dim=-1)  # (B, 3P): Reimers & Gurevych 2019, §3
                    logits = getattr(self, f"{task}_classifier")(x)  # (B, C)
                    feats["head_input"] = x
                else:
                    f1, f2 = self._features(task, e1), self._features(task, e2)  # (B, 2F)
                    x = torch.cat([f1 * f2, e1, e2], dim=-1)  # (B, 2F + 2H)
                    logits = kind.head_output(entry, head(x), None)  # (B,) one logit, or (B, C)
                    feats["head_input"] = x
                return TaskOutput(logits, feats)
            u, v = self.pair_embeddings(task, e1), self.pair_embeddings(task, e2)
            feats.update(cos_1=u, cos_2=v)
            return TaskOutput(kind.scaled(entry, F.cosine_similarity(u, v, dim=-1), self.span(entry)), feats)

    def pair_embeddings(self, task: str, e: torch.Tensor) -> torch.Tensor:
        """A Siamese regression task's embedding of pooled sentences (B, D), in float32: what its cosine (and
        MNR) compare."""
        if self.config.pair_encoding == "cross":
            raise ValueError("pair_embeddings needs pair_encoding='siamese'")
        with _float32(e):
            e = e.float()
            return getattr(self, f"{task}_head")(e) if self.config.arch == "baseline" else self._features(task, e)

    # ---- losses and predictions ---------------------------------------------------

    def task_loss(self, task: str, out: TaskOutput, batch: dict, reduction: str = "mean") -> torch.Tensor:
        """The head's loss: its kind's (cross-entropy, BCE with logits, MSE)."""
        return get_task(task).kind.loss(out.logits, batch["labels"], reduction)

    @staticmethod
    def predict(task: str, out: TaskOutput) -> torch.Tensor:
        """Class ids or scores: its kind's rule."""
        return get_task(task).kind.predict(out.logits)
