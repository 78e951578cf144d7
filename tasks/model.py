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

A task's kind (tasks/task.py) builds its head for the arch and pair encoding (``Kind.head``: which modules,
and how they score the pooled embeddings) and owns its loss (cross-entropy, BCE with logits, MSE) and
prediction rule: a sentence classification is built as SST's head, a pair classification as the paraphrase
head (of C classes: Sentence-BERT's classifier in the Siamese baseline), a regression as the STS head, with the
task's own number of classes or scale; the model embeds the sides its head reads and never asks what kind a
task is. Objectives that need more get it through explicit arguments: ``inputs_embeds`` to start from
(perturbed) word embeddings and ``embed`` for extra passes; a model option that changes the pooled
embedding between encoder and head (Match-Tuning) installs it with ``set_pooled_transform``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from minbert.bert import BertModel
from tasks.options import AnyKey, option, spelled_flag
from tasks.task import MULTITASK, PACKAGE, Head, Kind, Task, Tasks, mlp, model_tasks

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
    spans: dict[str, float] = option(
        help="per-task span S of a regression head: its prediction = the range's low + S x the cosine of a "
             "Siamese pair's embeddings, or x a sigmoid (a cross-encoded pair, one sentence); TASK=S; a task left out "
             "takes its range's width",
        factory=lambda: {t.name: t.score_range[1] - t.score_range[0] for t in PACKAGE.values()
                         if t.score_range is not None},
        keys=AnyKey(), metavar="TASK=S", group="model",
        spelled={"--sts-scale": ("sts", "STS prediction = this x cosine (Siamese) or x sigmoid (cross) (paper: 5.0, "
                                        "§4.1)")})

    def __post_init__(self) -> None:
        for name, value, allowed in (("arch", self.arch, ARCHS), ("pair_encoding", self.pair_encoding, PAIR_ENCODINGS),
                                     ("pooling", self.pooling, POOLINGS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not 0.0 <= self.head_dropout < 1.0:
            raise ValueError(f"head_dropout must be in [0, 1), got {self.head_dropout}")
        if self.fcn_size < 1 or self.baseline_proj_size < 1:
            raise ValueError("fcn_size and baseline_proj_size must be positive")
        for task, span in self.spans.items():
            if not span > 0:
                raise ValueError(f"{spelled_flag(ModelConfig, 'spans', task)} (spans of {task}): a regression's "
                                 f"span is positive, got {span}")


@dataclass
class TaskOutput:
    """What a head computed: ``logits`` and the intermediate features objectives use.

    logits: SST (B, 5); paraphrase (B,) logit; STS (B,) predicted score: in [0, 5]
    for b1 and cross, in [-5, 5] for the baseline's Siamese 5 × cosine (§4.1).
    features: "pooled" (B, H) for one-sequence inputs, "pooled_1"/"pooled_2" for
    Siamese pairs; "head_input" (B, D), the vector the head's last layers read, wherever the head builds one
    (one sequence; b1's Siamese pair classification; the baseline's Siamese pair of C classes): what SCL/KNN
    use; "cos_1"/"cos_2" (B, D) a Siamese regression's embeddings whose cosine is the score (MNR uses them).
    The head's ``features`` (tasks/task.py: ``Head``) names the ones beyond "pooled".
    """

    logits: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)


def _float32(x: torch.Tensor) -> torch.autocast:
    """Autocast off on ``x``'s device: the heads compute in float32 whatever the encoder's precision, so
    scores and logits keep float32 precision (bf16's 8-bit significand would round STS scores into ties)."""
    return torch.autocast(x.device.type, enabled=False)


class MultitaskBert(nn.Module):
    """The encoder and a head per task (``model_tasks(tasks)``: the project's three and the run's others), each
    built by its kind (tasks/task.py: ``heads[task]``), its parts named ``<task>_<part>``: ``<task>_head``, and
    in the Siamese baseline a one-logit pair's ``<task>_bias`` or a pair of C classes' ``<task>_classifier``;
    b1 adds ``shared`` and each task's ``<task>_own``: HF-style names the checkpoints keep."""

    def __init__(self, encoder: BertModel, config: ModelConfig, tasks: Sequence[str] = MULTITASK,
                 entries: Tasks | None = None):
        super().__init__()
        self.encoder = encoder
        self.config = config
        self.tasks = model_tasks(tasks)
        H, Fs, p = encoder.config.hidden_size, config.fcn_size, config.head_dropout
        if config.pooling == "pooler" and encoder.pooler is None:
            raise ValueError("pooling='pooler' needs an encoder with a pooler")
        # Its tasks' entries (``entries``: the run's, TrainConfig.entries; default: the package's), by task.
        entries = entries if entries is not None else PACKAGE
        self.entries: dict[str, Task] = {t: entries[t] for t in self.tasks}
        entries = list(self.entries.values())
        # What each task's kind builds for this arch and pair encoding: sizes and rules, no module (its parts are
        # registered below, on the model, so that they move, copy and load with it).
        self.heads: dict[str, Head] = {t.name: t.kind.head(t, config, H) for t in entries}
        # The extra streams its tasks declare (SST's phrases), by the task whose head they train: ``head_task``.
        self.stream_heads = {t.stream.name: t.name for t in entries if t.stream is not None}
        # Registered in one order per arch (b1: the shared layers, every task's own layer, every head's parts;
        # the baseline: every head's parts), which is the order _init_heads draws their initial weights in.
        if config.arch == "b1":
            self.shared = nn.Sequential(mlp([H, Fs, Fs], p), nn.ReLU())
            for t in entries:
                setattr(self, f"{t.name}_own", nn.Sequential(mlp([H, Fs], p), nn.ReLU()))
        for t in entries:
            for part, module in self.heads[t.name].parts().items():
                setattr(self, f"{t.name}_{part}", module)
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

    def head_task(self, stream: str) -> str:
        """The task whose head ``stream`` goes through: a task of the model, or the task of it that declares the
        extra stream (SST's phrases, a task file's ``<name>_phrases``); every method that takes a task takes a
        stream so, so that an objective calls the model with the stream it trains on. A ValueError naming the
        model's tasks for any other name (NLI's triplets go through no head)."""
        task = self.stream_heads.get(stream, stream)
        if task not in self.tasks:
            raise ValueError(f"unknown task {stream!r}; this model's tasks are {list(self.tasks)}")
        return task

    def head_of(self, stream: str) -> str | None:
        """The task whose head trains on ``stream`` (``head_task``), None for NLI's triplets (no head)."""
        return None if stream == NLI else self.head_task(stream)

    def entry(self, task: str) -> Task:
        """The entry of the task whose head ``task`` (a task or a declared stream: ``head_task``) goes through."""
        return self.entries[self.head_task(task)]

    def kind_of(self, stream: str) -> Kind | None:
        """The kind of the task whose head ``stream`` goes through (``head_of``), None for NLI's (no head)."""
        task = self.head_of(stream)
        return None if task is None else self.entries[task].kind

    def part(self, task: str, name: str) -> nn.Module | nn.Parameter:
        """Part ``name`` of ``task``'s head (``<task>_<name>``: "head", "bias", "classifier")."""
        return getattr(self, f"{task}_{name}")

    def sides(self, task: str) -> tuple[str, ...]:
        """The batch-key suffixes ``task``'s head reads: ("",) for one sequence, ("_1", "_2") for a Siamese pair."""
        return self.heads[self.head_task(task)].sides

    def feature_names(self, task: str) -> tuple[str, ...]:
        """The features of ``task``'s TaskOutput: the pooled embedding of each side its head reads ("pooled", or
        "pooled_1" and "pooled_2"), then its head's ("head_input", "cos_1" and "cos_2", or none)."""
        return tuple("pooled" + s for s in self.sides(task)) + self.heads[self.head_task(task)].features

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

    def sentence_features(self, task: str, e: torch.Tensor) -> torch.Tensor:
        """What the arch makes of pooled embeddings ``e`` (B, H) for ``task``'s head: b1's [shared, own] (B, 2F), the
        baseline's ``e`` itself."""
        return e if self.config.arch == "baseline" else self._features(task, e)

    # ---- heads ------------------------------------------------------------------

    def set_pooled_transform(self, task: str, transform: nn.Module) -> None:
        """Apply ``transform`` to ``task``'s pooled embeddings (B, H) -> (B, H) before its head, in every forward
        (Match-Tuning's batch matching). It holds no parameters of its own and reads ``self.training`` to act
        differently in evaluation; a declared stream's task's, as for every method here)."""
        task = self.head_task(task)
        if any(True for _ in transform.parameters()):
            raise ValueError("a pooled transform may not hold parameters: the checkpoint format has no place for them")
        self.pooled_transforms[task] = transform

    def forward(self, task: str, batch: dict, inputs_embeds: dict[str, torch.Tensor] | None = None) -> TaskOutput:
        """Run ``task``'s head on a collated batch.

        inputs_embeds: word embeddings to start from, keyed by the batch's key
        suffix ("" for one sequence, "_1"/"_2" for Siamese sides).
        """
        entry = self.entry(task)
        task = entry.name  # a declared stream's: its task's head, transform and parts
        head = self.heads[task]
        if any("input_ids" + s not in batch for s in head.sides):
            # A head reads the sides it was built for (a cross model's pair heads one joint sequence); fed
            # others it would silently compute something else.
            raise ValueError(f"{task}: its head reads {', '.join('input_ids' + s for s in head.sides)} "
                             f"(pair_encoding={self.config.pair_encoding!r}), the batch has keys {sorted(batch)}")
        t = self.pooled_transforms[task] if task in self.pooled_transforms else (lambda e: e)
        pooled = [self._embed_side(batch, s, inputs_embeds) for s in head.sides]  # (B, H) each, in the autocast dtype
        with _float32(pooled[0]):
            pooled = [t(e.float()) for e in pooled]
            logits, features = head.score(self, entry, pooled)
        return TaskOutput(logits, {**{"pooled" + s: e for s, e in zip(head.sides, pooled)}, **features})

    def pair_embeddings(self, task: str, e: torch.Tensor) -> torch.Tensor:
        """A Siamese regression task's embedding of pooled sentences (B, D), in float32: what its cosine (and
        MNR) compare."""
        if self.config.pair_encoding == "cross":
            raise ValueError("pair_embeddings needs pair_encoding='siamese'")
        entry = self.entry(task)
        with _float32(e):
            return self.heads[entry.name].embeddings(self, entry, e.float())

    # ---- losses and predictions ---------------------------------------------------

    def task_loss(self, task: str, out: TaskOutput, batch: dict, reduction: str = "mean") -> torch.Tensor:
        """The head's loss: its kind's (cross-entropy, BCE with logits, MSE)."""
        return self.entry(task).kind.loss(out.logits, batch["labels"], reduction)

    def predict(self, task: str, out: TaskOutput) -> torch.Tensor:
        """Class ids or scores: its kind's rule."""
        return self.entry(task).kind.predict(out.logits)
