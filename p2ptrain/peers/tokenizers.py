"""Tokenizers: the offline byte tokenizer of the tiny preset and a wrapper around
Hugging Face tokenizers, both behind one small `Tokenizer` protocol.

The data pipeline only needs three things from a tokenizer: its vocabulary size
(to pick the dtype of the token file), `encode(text)`, and a stable `name` that
goes into the cache key of the token file, so that changing the tokenizer never
reuses tokens made by another one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

TINY_PRESET = "tiny"


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
    """The tokenizer of `model`: the byte tokenizer for the tiny preset (offline),
    otherwise `AutoTokenizer.from_pretrained(model)`."""
    if model == TINY_PRESET:
        return ByteTokenizer()
    return PretrainedTokenizer(model)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, for one-line user errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
