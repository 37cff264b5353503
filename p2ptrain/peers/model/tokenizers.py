"""Tokenizers: the offline byte tokenizer of the tiny preset and a wrapper around
Hugging Face tokenizers, both behind one small `Tokenizer` protocol.

The data pipeline only needs three things from a tokenizer: its vocabulary size
(to pick the dtype of the token file), `encode(text)`, and a stable `name` that
goes into the cache key of the token file, so that changing the tokenizer never
reuses tokens made by another one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

TINY_PRESET = "tiny"
# Written beside a saved byte tokenizer: a model directory holding it is read
# with ByteTokenizer itself (byte-exact, and the tiny preset's token cache).
BYTE_TOKENIZER_FILE = "p2ptrain-byte-tokenizer.json"


class ModelUnavailable(RuntimeError):
    """A model (or its tokenizer) could not be loaded: not on disk, and the hub is unreachable."""


class TokenizerUnavailable(ModelUnavailable):
    """The tokenizer of a model could not be loaded."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer.

    `vocab_size`: number of token ids; every id is in `range(vocab_size)`.
    `name`: a stable identifier, part of the token cache key.
    `eos_token_id`: appended after every document, or None if the tokenizer has none.
    """

    vocab_size: int
    name: str
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes are the tokens: ids 0..255 are bytes, then bos, eos and pad.

    Needs no download and no training, and tokenizing is a copy of the bytes, so
    the whole standard library is tokenized in seconds.
    """

    name = "bytes-v1"
    vocab_size = 259
    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """Token ids of raw bytes as a uint16 array, without decoding them first.

        Source files with another encoding declaration stay byte-exact this way.
        """
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids; special tokens are dropped, invalid UTF-8 is replaced."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save_pretrained(self, directory: Path) -> None:
        """Write this tokenizer into a model directory as a Hugging Face fast tokenizer
        (``AutoTokenizer.from_pretrained(directory)`` gives the same ids: a byte-level
        BPE without merges) plus :data:`BYTE_TOKENIZER_FILE`, so that a model saved
        from the tiny preset can be fine-tuned with ``--model DIR``."""
        import json

        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        characters = bytes_to_unicode()
        vocabulary = {characters[byte]: byte for byte in range(256)}
        vocabulary.update({"<bos>": self.bos_token_id, "<eos>": self.eos_token_id, "<pad>": self.pad_token_id})
        backend = HFTokenizer(models.BPE(vocab=vocabulary, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                pad_token="<pad>").save_pretrained(directory)
        (Path(directory) / BYTE_TOKENIZER_FILE).write_text(json.dumps({"name": self.name, "vocab_size": self.vocab_size}) + "\n")


class PretrainedTokenizer:
    """A Hugging Face tokenizer (`AutoTokenizer`) seen through the `Tokenizer` protocol."""

    def __init__(self, model: str):
        """Load the tokenizer of `model`, a hub id or a local directory.

        Raises `TokenizerUnavailable` with a one-line fix when it cannot be loaded.
        """
        from transformers import AutoTokenizer

        try:
            self.hf_tokenizer = AutoTokenizer.from_pretrained(model)
        except (OSError, ValueError) as error:
            raise TokenizerUnavailable(
                f"cannot load the tokenizer of {model!r} ({first_line(error)}); "
                f"use the {TINY_PRESET!r} preset or a local model directory that contains its tokenizer files"
            ) from error
        self.vocab_size = len(self.hf_tokenizer)
        self.eos_token_id = self.hf_tokenizer.eos_token_id
        self.name = f"hf:{self.hf_tokenizer.name_or_path}:{self.vocab_size}"

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens (documents are separated by eos)."""
        return self.hf_tokenizer.encode(text, add_special_tokens=False)


def build_tokenizer(model: str) -> Tokenizer:
    """The tokenizer of `model`: the byte tokenizer for the tiny preset (offline) and
    for model directories saved from it, otherwise `AutoTokenizer.from_pretrained(model)`."""
    if model == TINY_PRESET or (Path(model) / BYTE_TOKENIZER_FILE).is_file():
        return ByteTokenizer()
    return PretrainedTokenizer(model)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, for one-line user errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
