"""WordPiece tokenization for BERT, built from a checkpoint's vocab.txt.

Turns sentences (or sentence pairs) into the ``input_ids`` / ``token_type_ids`` /
``attention_mask`` tensors the encoder takes, with the same ids as HuggingFace's
``BertTokenizerFast``. The heavy lifting (normalization, WordPiece, batching on
all cores) is done by the Rust ``tokenizers`` package; this module only wires
the BERT pipeline together and pads batches with torch.

The pipeline is built from ``vocab.txt`` (never from ``tokenizer.json``) so any
HF BERT directory works, including old ones that ship only a vocabulary.

Usage:
    tok = BertTokenizer.from_pretrained(model_dir)
    batch = tok(["a sentence", "another"], ["its pair", "and its pair"], max_length=128)
    # batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]: (B, T) long
"""

from __future__ import annotations

import json
import threading
import warnings
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)

# The position-embedding table of every released BERT has 512 rows; a config
# that claims more (some tokenizer_config.json files say 1e30) cannot be used.
MAX_POSITIONS = 512


def _read_vocab(vocab_file: Path) -> dict[str, int]:
    """One token per line; the line number is the id (as in HF's load_vocab)."""
    with open(vocab_file, encoding="utf-8") as f:
        # Only the newline is stripped: some vocabularies contain tokens that
        # are, or end in, other whitespace characters.
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class BertTokenizer:
    """BERT WordPiece tokenizer: lowercasing/accents, [CLS]/[SEP] templates, dynamic padding.

    ``strip_accents`` and ``tokenize_chinese_chars`` (keyword-only) follow HF's
    meaning: ``strip_accents=None`` strips accents exactly when lowercasing.
    """

    def __init__(
        self,
        vocab_file: str | Path,
        do_lower_case: bool = True,
        model_max_length: int = 512,
        *,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
    ) -> None:
        vocab_file = Path(vocab_file)
        if not vocab_file.is_file():
            raise FileNotFoundError(f"BERT vocabulary file not found: {vocab_file}")
        if model_max_length < 3:
            raise ValueError(f"model_max_length must be at least 3 ([CLS] x [SEP] y [SEP]), got {model_max_length}")
        vocab = _read_vocab(vocab_file)
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"{vocab_file} lacks the BERT special tokens {missing}; is it a BERT vocabulary?")

        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.model_max_length = model_max_length
        self.vocab_size = len(vocab)
        self.pad_token_id = vocab[PAD_TOKEN]
        self.unk_token_id = vocab[UNK_TOKEN]
        self.cls_token_id = vocab[CLS_TOKEN]
        self.sep_token_id = vocab[SEP_TOKEN]
        self.mask_token_id = vocab[MASK_TOKEN]

        tok = Tokenizer(models.WordPiece(vocab, unk_token=UNK_TOKEN, max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=tokenize_chinese_chars,
            strip_accents=strip_accents,
            lowercase=do_lower_case,
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS_TOKEN} $A {SEP_TOKEN}",
            pair=f"{CLS_TOKEN} $A {SEP_TOKEN} $B:1 {SEP_TOKEN}:1",
            special_tokens=[(CLS_TOKEN, self.cls_token_id), (SEP_TOKEN, self.sep_token_id)],
        )
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        # Registered as special (as HF does) so that decode(skip_special_tokens=True)
        # drops them and a literal "[MASK]" in raw text stays one token.
        # normalized=False: they match the raw text, before lowercasing.
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        # Padding is ours (pad()), so encode_ids returns true lengths.
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self._truncation_max: int | None = None
        # enable_truncation mutates the shared Rust tokenizer; the lock keeps two
        # threads with different max_length from encoding with each other's setting.
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, model_max_length: int | None = None) -> BertTokenizer:
        """Build from a HF BERT directory: vocab.txt, plus tokenizer_config.json / config.json if present.

        ``do_lower_case`` comes from tokenizer_config.json and defaults to True when
        that file is absent, as HF's BertTokenizer does, even for a directory named
        "...-cased" (a warning says so): pass a tokenizer_config.json with
        ``"do_lower_case": false`` for a cased model. ``model_max_length`` (when not
        given) is tokenizer_config's model_max_length, else config.json's
        max_position_embeddings, else 512, and never more than 512.
        """
        model_dir = Path(model_dir)
        vocab_file = model_dir / "vocab.txt"
        if not vocab_file.is_file():
            raise FileNotFoundError(f"no vocab.txt in {model_dir} (looked for {vocab_file})")
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        model_cfg = _read_json(model_dir / "config.json")

        if "do_lower_case" in tok_cfg:
            do_lower_case = bool(tok_cfg["do_lower_case"])
        else:
            do_lower_case = True
            name = model_dir.resolve().name.lower()
            if "cased" in name and "uncased" not in name:
                warnings.warn(
                    f"{model_dir} looks like a cased model but has no tokenizer_config.json "
                    "with do_lower_case; lowercasing anyway (the HF default). Add "
                    '{"do_lower_case": false} to tokenizer_config.json to keep case.',
                    stacklevel=2,
                )

        n_positions = int(model_cfg.get("max_position_embeddings", MAX_POSITIONS))
        if model_max_length is None:
            model_max_length = int(min(tok_cfg.get("model_max_length", n_positions), n_positions, MAX_POSITIONS))
        elif model_max_length > n_positions:
            raise ValueError(
                f"model_max_length={model_max_length} exceeds the model's "
                f"max_position_embeddings={n_positions} ({model_dir / 'config.json'})"
            )
        return cls(
            vocab_file,
            do_lower_case=do_lower_case,
            model_max_length=model_max_length,
            strip_accents=tok_cfg.get("strip_accents"),
            tokenize_chinese_chars=bool(tok_cfg.get("tokenize_chinese_chars", True)),
        )

    # ---- batch encoding ---------------------------------------------------------

    def encode_ids(
        self, texts: list[str], pairs: list[str] | None = None, max_length: int | None = None
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Token ids and token-type ids per example, with [CLS]/[SEP], unpadded.

        Sequences longer than ``max_length`` (default ``model_max_length``) are
        truncated; pairs with HF's 'longest_first' (trim the longer side one
        token at a time).
        """
        _check_texts(texts, "texts")
        if pairs is not None:
            _check_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"texts and pairs differ in length: {len(texts)} texts, {len(pairs)} pairs")
        max_length = self.model_max_length if max_length is None else max_length
        n_special = 3 if pairs is not None else 2
        if max_length < n_special:
            raise ValueError(f"max_length={max_length} leaves no room for text after {n_special} special tokens")
        if max_length > self.model_max_length:
            raise ValueError(
                f"max_length={max_length} exceeds model_max_length={self.model_max_length} (position embeddings)"
            )
        inputs = texts if pairs is None else list(zip(texts, pairs))
        with self._lock:
            if self._truncation_max != max_length:
                self._tok.enable_truncation(max_length, stride=0, strategy="longest_first", direction="right")
                self._truncation_max = max_length
            # encode_batch_fast skips character offsets, which we never use.
            encodings = self._tok.encode_batch_fast(inputs, add_special_tokens=True)
        return [e.ids for e in encodings], [e.type_ids for e in encodings]

    def pad(
        self, ids: list[list[int]], type_ids: list[list[int]] | None = None, pad_to: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Right-pad to the longest sequence in the batch (or to ``pad_to``).

        Returns ``input_ids``, ``token_type_ids`` and ``attention_mask`` (1 = real
        token), all long tensors of shape (B, T).
        """
        if type_ids is not None and len(type_ids) != len(ids):
            raise ValueError(f"ids and type_ids differ in length: {len(ids)} vs {len(type_ids)}")
        lengths = torch.tensor([len(x) for x in ids], dtype=torch.long)  # (B,)
        longest = int(lengths.max()) if len(ids) else 0
        if pad_to is None:
            pad_to = longest
        elif pad_to < longest:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest sequence ({longest}); truncate first")
        attention_mask = (torch.arange(pad_to) < lengths[:, None]).long()  # (B, T)
        # One scatter of the flattened batch instead of a Python loop per row;
        # row-major boolean indexing fills exactly the real positions in order.
        real = attention_mask.bool()
        input_ids = torch.full((len(ids), pad_to), self.pad_token_id, dtype=torch.long)  # (B, T)
        input_ids[real] = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.long)
        token_type_ids = torch.zeros((len(ids), pad_to), dtype=torch.long)  # (B, T)
        if type_ids is not None:
            for row, (a, b) in enumerate(zip(ids, type_ids)):
                if len(a) != len(b):
                    raise ValueError(f"example {row}: {len(a)} ids but {len(b)} type ids")
            token_type_ids[real] = torch.tensor(list(chain.from_iterable(type_ids)), dtype=torch.long)
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}

    def __call__(
        self, text: str | list[str], text_pair: str | list[str] | None = None, max_length: int | None = None
    ) -> dict[str, torch.Tensor]:
        """encode_ids + pad; a single string (and its pair) becomes a batch of one."""
        if isinstance(text, str):
            text = [text]
            if isinstance(text_pair, list):
                raise ValueError(f"text is one string but text_pair is a list of {len(text_pair)}")
        if isinstance(text_pair, str):
            if len(text) != 1:
                raise ValueError(f"text is a list of {len(text)} but text_pair is one string")
            text_pair = [text_pair]
        ids, type_ids = self.encode_ids(text, text_pair, max_length)
        return self.pad(ids, type_ids)

    # ---- single-sequence helpers -------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of ``text``, without [CLS]/[SEP] and untruncated."""
        if not isinstance(text, str):
            raise TypeError(f"tokenize expects a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).tokens if text else []

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        """Vocabulary ids; tokens not in the vocabulary map to [UNK] (as HF)."""
        ids = [self._tok.token_to_id(t) for t in tokens]
        return [self.unk_token_id if i is None else i for i in ids]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        """Vocabulary tokens; an id outside the vocabulary is an error."""
        tokens = [self._tok.id_to_token(int(i)) for i in ids]
        bad = [int(i) for i, t in zip(ids, tokens) if t is None]
        if bad:
            raise ValueError(f"ids {bad[:10]} are outside the vocabulary (size {self.vocab_size})")
        return tokens

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text from ids: joins '##' pieces and tidies spaces before punctuation.

        Lowercasing and accent stripping are not undone.
        """
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"BertTokenizer(vocab_file={str(self.vocab_file)!r}, vocab_size={self.vocab_size}, "
            f"do_lower_case={self.do_lower_case}, model_max_length={self.model_max_length})"
        )

    # DataLoader workers (spawn) pickle the tokenizer; a lock cannot be pickled.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _check_texts(texts: list[str], name: str) -> None:
    # A bare string would be tokenized character by character, and a None or
    # NaN from a CSV reader gives an opaque error deep inside the Rust code.
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a list of strings, got one str; wrap it in a list")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{i}] is {type(t).__name__} ({t!r}), expected str")
