"""Training data: where the text comes from, its cached token file, and batches.

A dataset is a small dict from the run manifest:

- `{"kind": "stdlib"}` (the default): the `.py` files of the running interpreter's
  standard library, present on every machine with Python. A file belongs to the
  validation split iff `sha256(relative path) mod 100 < 2` (about 2%), so every
  peer with the same Python holds out the same files. `test/` directories are
  kept: they are half of the corpus and ordinary Python code.
- `{"kind": "files", "paths": [...], "text_field": "text"}`: local `.txt` files
  (one document each) and `.jsonl` files (one document per line, taken from
  `text_field`). The last 2% of the tokens are the validation split.
- `{"kind": "hub", "name": "wikitext", "config": "wikitext-2-raw-v1",
  "split": "train", "validation_split": "validation", "text_field": "text",
  "revision": null}`: a Hugging Face dataset read with `datasets.load_dataset`
  (a hub id when the hub is reachable, or a local dataset directory), downloaded
  into `cache_dir/hf-datasets`.

Documents are tokenized once into a flat file of token ids (each document
followed by the tokenizer's eos token), cached under `cache_dir/tokens/`, and
read back as a memory map, so peers share the page cache and start instantly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from p2ptrain.peers.model.tokenizers import ByteTokenizer, Tokenizer, build_tokenizer, first_line

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_DATASET",
    "DatasetUnavailable",
    "Tokenizer",
    "build_tokenizer",
    "check_dataset",
    "stdlib_files",
    "token_file",
    "train_batches",
    "validation_batches",
]

DEFAULT_DATASET = {"kind": "stdlib"}
SPLITS = ("train", "validation")
VALIDATION_PERCENT = 2
# Bump when the layout of token files changes, so old caches are not reused.
TOKEN_FORMAT = 1
# Train windows are drawn in blocks of this many samples, each block from its own
# seeded generator, so a stream can resume at any position without replaying it.
SAMPLES_PER_BLOCK = 4096
OFFLINE_ALTERNATIVES = '{"kind": "stdlib"} or {"kind": "files", "paths": [...]}'


class DatasetUnavailable(RuntimeError):
    """A dataset cannot be read here (library missing, hub offline)."""


def check_dataset(dataset: dict) -> None:
    """Raise ValueError, with a fix, if `dataset` is not a valid dataset spec.

    Does not read any data: the daemon can call it before starting a worker.
    """
    if not isinstance(dataset, dict):
        raise ValueError(f"dataset must be a JSON object such as {DEFAULT_DATASET}, not {dataset!r}")
    kind = dataset.get("kind", "stdlib")
    if kind == "stdlib":
        return
    if kind == "files":
        paths = dataset.get("paths")
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise ValueError('dataset of kind "files" needs "paths": a non-empty list of .txt or .jsonl file paths')
        for path in paths:
            if Path(path).suffix not in (".txt", ".jsonl"):
                raise ValueError(f"dataset file {path!r} is neither .txt nor .jsonl; convert it to one of them")
        return
    if kind == "hub":
        if not isinstance(dataset.get("name"), str):
            raise ValueError('dataset of kind "hub" needs "name", e.g. {"kind": "hub", "name": "wikitext", '
                             '"config": "wikitext-2-raw-v1"}')
        return
    raise ValueError(f'unknown dataset kind {kind!r}; use "stdlib", "files" or "hub", e.g. {DEFAULT_DATASET}')


def stdlib_files(split: str) -> list[Path]:
    """The standard library's `.py` files of one split, sorted by relative path.

    `site-packages` is skipped: it differs between machines.
    """
    check_split(split)
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if "site-packages" in relative.parts:
            continue
        if is_validation_file(relative.as_posix()) == (split == "validation"):
            chosen.append((relative.as_posix(), path))
    return [path for _, path in sorted(chosen)]


def is_validation_file(relative_path: str) -> bool:
    """Whether a stdlib file is held out for validation: a hash of its relative path decides."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest, "big") % 100 < VALIDATION_PERCENT


def token_file(dataset: dict, tokenizer: Tokenizer, cache_dir: Path, split: str) -> np.ndarray:
    """All token ids of one split of `dataset`, as a read-only memory map.

    Built once and cached at `cache_dir/tokens/<key>.bin`, where the key hashes the
    dataset spec, what its source looks like here (Python version; file sizes and
    modification times), the tokenizer's name and the split. The file is written
    to a temporary name and renamed, so a crash never leaves a half-written cache.
    A rich progress bar shows while tokenizing when stderr is a terminal.

    `split` is "train" or "validation". Raises ValueError for a bad spec or an
    empty split, DatasetUnavailable when the data cannot be read here.
    """
    check_dataset(dataset)
    check_split(split)
    kind = dataset.get("kind", "stdlib")
    if kind == "files":
        # Files are split by position in the token stream: one cached file for both.
        tokens = cached_tokens(dataset, tokenizer, Path(cache_dir), "all")
        boundary = len(tokens) - len(tokens) * VALIDATION_PERCENT // 100
        tokens = tokens[:boundary] if split == "train" else tokens[boundary:]
    else:
        tokens = cached_tokens(dataset, tokenizer, Path(cache_dir), split)
    if len(tokens) == 0:
        raise ValueError(f"the {split} split of dataset {dataset} has no tokens; add more text to it")
    return tokens


def cached_tokens(dataset: dict, tokenizer: Tokenizer, cache_dir: Path, part: str) -> np.ndarray:
    """The memory-mapped token file of one part of a dataset, tokenizing it first if needed."""
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    key = json.dumps(
        {"dataset": dataset, "source": source_fingerprint(dataset), "tokenizer": tokenizer.name,
         "part": part, "format": TOKEN_FORMAT},
        sort_keys=True,
    )
    path = cache_dir / "tokens" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.bin"
    if not path.exists():
        description = f"tokenizing {dataset.get('kind', 'stdlib')} {part} data for {tokenizer.name}"
        write_token_file(path, documents(dataset, part, cache_dir), tokenizer, dtype, description)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def source_fingerprint(dataset: dict) -> object:
    """What the dataset's source looks like on this machine, so a changed source gets a new cache."""
    kind = dataset.get("kind", "stdlib")
    if kind == "stdlib":
        return [sys.version, sysconfig.get_paths()["stdlib"]]
    if kind == "files":
        fingerprint = []
        for name in dataset["paths"]:
            path = Path(name)
            if not path.is_file():
                raise ValueError(f"dataset file {name!r} does not exist; fix dataset.paths in the run manifest")
            stat = path.stat()
            fingerprint.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
        return fingerprint
    if kind == "hub" and Path(dataset["name"]).is_dir():  # a local dataset directory, as `datasets` reads it
        files = sorted(path for path in Path(dataset["name"]).rglob("*") if path.is_file())
        return [[str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns] for path in files]
    return None  # a hub id: its name, config and revision in the spec identify it


def write_token_file(path: Path, docs: tuple[int, Iterable[bytes | str]], tokenizer: Tokenizer,
                     dtype: type, description: str) -> None:
    """Tokenize documents into `path` atomically: a temporary file, then a rename.

    `docs` is (number of documents or 0 if unknown, documents). Bytes are decoded
    as UTF-8 (invalid bytes replaced) unless the tokenizer takes bytes directly.
    `description` labels the progress bar.
    """
    total, items = docs
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    takes_bytes = isinstance(tokenizer, ByteTokenizer)
    try:
        with open(temporary, "wb") as out, progress_bar(total, description) as advance:
            for document in items:
                if takes_bytes:
                    data = document if isinstance(document, bytes) else document.encode("utf-8")
                    ids = tokenizer.encode_bytes(data)
                else:
                    text = document.decode("utf-8", errors="replace") if isinstance(document, bytes) else document
                    ids = np.asarray(tokenizer.encode(text), dtype=dtype)
                out.write(ids.astype(dtype, copy=False).tobytes())
                out.write(np.asarray(eos, dtype=dtype).tobytes())
                advance(1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def progress_bar(total: int, description: str) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(n)` function; draws a rich progress bar only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=total or None)
        yield lambda n: progress.advance(task, n)


def documents(dataset: dict, part: str, cache_dir: Path) -> tuple[int, Iterable[bytes | str]]:
    """(count or 0 if unknown, iterable of documents) of one part ("train", "validation", "all");
    `cache_dir` holds what a hub dataset downloads."""
    kind = dataset.get("kind", "stdlib")
    if kind == "stdlib":
        files = stdlib_files(part)
        return len(files), (path.read_bytes() for path in files)
    if kind == "files":
        return len(dataset["paths"]), file_documents(dataset["paths"], dataset.get("text_field", "text"))
    return 0, hub_documents(dataset, part, cache_dir / "hf-datasets")


def file_documents(paths: list[str], text_field: str) -> Iterator[bytes | str]:
    """Documents of local files: a .txt file is one document, a .jsonl line is one."""
    for name in paths:
        path = Path(name)
        if path.suffix == ".txt":
            yield path.read_bytes()
            continue
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    text = record[text_field]
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    raise ValueError(
                        f"{path}:{number} is not a JSON object with a string field {text_field!r} ({error}); "
                        f"fix the line or set dataset.text_field"
                    ) from error
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{number}: field {text_field!r} is not a string; set dataset.text_field")
                yield text


def hub_documents(dataset: dict, part: str, download_dir: Path) -> Iterator[str]:
    """Documents of a Hugging Face dataset (a hub id, or a local dataset directory),
    downloaded into `download_dir`; DatasetUnavailable when it cannot be loaded here."""
    name = dataset["name"]
    try:
        import datasets
    except ImportError:
        raise DatasetUnavailable(
            f"hub dataset {name!r} needs the 'datasets' library, which is not installed; "
            f"pip install datasets, or use {OFFLINE_ALTERNATIVES}"
        ) from None
    split = dataset.get("split", "train") if part == "train" else dataset.get("validation_split", "validation")
    try:
        rows = datasets.load_dataset(name, dataset.get("config"), split=split, revision=dataset.get("revision"),
                                     cache_dir=str(download_dir))
    except Exception as error:  # the library raises many types for "offline" and "not found"
        raise DatasetUnavailable(
            f"cannot load hub dataset {name!r} split {split!r} ({first_line(error)}); "
            f"use {OFFLINE_ALTERNATIVES} offline"
        ) from error
    text_field = dataset.get("text_field", "text")
    if text_field not in rows.column_names:
        raise ValueError(f"dataset {name!r} has no field {text_field!r} (its fields: {', '.join(rows.column_names)}); "
                         "set dataset.text_field")
    for row in rows:
        yield row[text_field]


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'validation'")


class TrainBatches:
    """An endless stream of random training windows, `[micro_batch, seq_len]` token ids.

    Window start offsets are drawn uniformly from the token file by a generator
    seeded with (`seed`, block number), so the stream depends only on the data,
    `seq_len` and `seed`: peers pass different seeds (derived from their peer id)
    to read different samples. `position` counts samples handed out so far; a
    stream created with `start_position=position` continues exactly where this
    one stopped, which is how a checkpoint resumes its data.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch: int, seed: int, start_position: int = 0):
        if seq_len < 1 or micro_batch < 1:
            raise ValueError(f"seq_len ({seq_len}) and micro_batch ({micro_batch}) must be at least 1")
        if len(tokens) < seq_len:
            raise ValueError(f"the training data has {len(tokens)} tokens, fewer than seq_len={seq_len}; "
                             f"use a smaller seq_len or more data")
        if start_position < 0:
            raise ValueError(f"start_position must be >= 0, not {start_position}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.seed = int(seed) % (1 << 64)
        self.position = start_position
        self._block_number = -1
        self._block_offsets = np.zeros(0, dtype=np.int64)

    def __iter__(self) -> TrainBatches:
        return self

    def __next__(self) -> torch.LongTensor:
        import torch

        offsets = [self._offset(self.position + i) for i in range(self.micro_batch)]
        self.position += self.micro_batch
        windows = np.stack([self.tokens[offset:offset + self.seq_len] for offset in offsets])
        return torch.from_numpy(windows.astype(np.int64))

    def _offset(self, sample: int) -> int:
        block_number, index = divmod(sample, SAMPLES_PER_BLOCK)
        if block_number != self._block_number:
            generator = np.random.default_rng([self.seed, block_number])
            highest = len(self.tokens) - self.seq_len
            self._block_offsets = generator.integers(0, highest + 1, size=SAMPLES_PER_BLOCK)
            self._block_number = block_number
        return int(self._block_offsets[index])


def train_batches(dataset: dict, tokenizer: Tokenizer, seq_len: int, micro_batch: int, seed: int,
                  cache_dir: Path, start_position: int = 0) -> TrainBatches:
    """An endless iterator of `[micro_batch, seq_len]` LongTensors from the train split.

    `seed` chooses the stream (see `TrainBatches`); `start_position` is the
    `.position` of an earlier stream to resume from.
    """
    tokens = token_file(dataset, tokenizer, cache_dir, "train")
    return TrainBatches(tokens, seq_len, micro_batch, seed, start_position)


def validation_batches(dataset: dict, tokenizer: Tokenizer, seq_len: int, batch_size: int, cache_dir: Path,
                       max_batches: int = 8) -> list[torch.LongTensor]:
    """Fixed validation batches, the same on every peer: up to `max_batches` batches
    of `batch_size` windows spread evenly over the validation split.

    When the split is short, windows overlap rather than there being fewer of them.
    """
    import torch

    if seq_len < 1 or batch_size < 1 or max_batches < 1:
        raise ValueError(f"seq_len ({seq_len}), batch_size ({batch_size}) and max_batches ({max_batches}) "
                         f"must be at least 1")
    tokens = token_file(dataset, tokenizer, cache_dir, "validation")
    if len(tokens) < seq_len:
        raise ValueError(f"the validation split has {len(tokens)} tokens, fewer than seq_len={seq_len}; "
                         f"use a smaller seq_len or more data")
    count = batch_size * max_batches
    offsets = np.linspace(0, len(tokens) - seq_len, num=count).astype(np.int64)
    windows = np.stack([tokens[offset:offset + seq_len] for offset in offsets]).astype(np.int64)
    return [torch.from_numpy(windows[start:start + batch_size]) for start in range(0, count, batch_size)]
