"""The data pipeline: tokenizers, the stdlib corpus and its split, the token cache, batches."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from p2ptrain.peers.model import data
from p2ptrain.peers.model.data import (
    DEFAULT_DATASET,
    DatasetUnavailable,
    build_tokenizer,
    stdlib_files,
    token_file,
    train_batches,
    validation_batches,
)
from p2ptrain.peers.model.tokenizers import ByteTokenizer

BYTES = ByteTokenizer()


@pytest.fixture(scope="session")
def stdlib_cache(tmp_path_factory):
    """One token cache of the stdlib corpus for the whole session (shared with test_models)."""
    return tmp_path_factory.getbasetemp() / "stdlib-token-cache"


@pytest.fixture
def files_dataset(tmp_path):
    """A small files dataset: one .txt document and a .jsonl with two documents."""
    (tmp_path / "notes.txt").write_text("plain text, café\n" * 200)
    with open(tmp_path / "rows.jsonl", "w") as rows:
        rows.write(json.dumps({"body": "first row"}) + "\n\n")
        rows.write(json.dumps({"body": "second row"}) + "\n")
    return {"kind": "files", "paths": [str(tmp_path / "notes.txt"), str(tmp_path / "rows.jsonl")],
            "text_field": "body"}


def test_byte_tokenizer_encodes_utf8_bytes_below_its_special_tokens():
    tokenizer = build_tokenizer("tiny")
    assert isinstance(tokenizer, ByteTokenizer)
    assert tokenizer.encode("aé") == [97, 195, 169]
    assert tokenizer.vocab_size == 259
    assert {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id} == {256, 257, 258}
    assert tokenizer.decode(tokenizer.encode("naïve") + [257]) == "naïve"


def test_stdlib_validation_split_is_deterministic_small_and_disjoint_from_train():
    validation = stdlib_files("validation")
    train = stdlib_files("train")
    assert validation == stdlib_files("validation")
    assert not set(validation) & set(train)
    assert 0.01 < len(validation) / (len(validation) + len(train)) < 0.04
    assert all("site-packages" not in path.parts for path in train + validation)
    assert train == sorted(train, key=lambda path: path.as_posix())


def test_stdlib_token_file_is_every_file_byte_followed_by_eos(stdlib_cache):
    tokens = token_file(DEFAULT_DATASET, BYTES, stdlib_cache, "validation")
    files = stdlib_files("validation")
    expected = np.concatenate([np.append(np.frombuffer(path.read_bytes(), np.uint8).astype(np.uint16), 257)
                               for path in files])
    assert np.array_equal(tokens, expected)
    train = token_file(DEFAULT_DATASET, BYTES, stdlib_cache, "train")
    assert len(train) == sum(path.stat().st_size + 1 for path in stdlib_files("train"))


def test_token_cache_is_built_once_and_reused(files_dataset, tmp_path):
    cache = tmp_path / "cache"
    first = token_file(files_dataset, BYTES, cache, "train")
    cached = list((cache / "tokens").iterdir())
    assert len(cached) == 1
    written = cached[0].stat().st_mtime_ns
    second = token_file(files_dataset, BYTES, cache, "train")
    token_file(files_dataset, BYTES, cache, "validation")
    assert cached[0].stat().st_mtime_ns == written
    assert list((cache / "tokens").iterdir()) == cached
    assert np.array_equal(first, second)


def test_an_edited_source_file_gets_a_new_token_file(files_dataset, tmp_path):
    cache = tmp_path / "cache"
    before = np.array(token_file(files_dataset, BYTES, cache, "train"))
    with open(files_dataset["paths"][0], "a") as notes:
        notes.write("one more line\n" * 50)
    after = token_file(files_dataset, BYTES, cache, "train")
    assert len(after) > len(before)
    assert len(list((cache / "tokens").iterdir())) == 2


def test_files_dataset_reads_txt_whole_and_jsonl_by_line(files_dataset, tmp_path):
    train = token_file(files_dataset, BYTES, tmp_path, "train")
    validation = token_file(files_dataset, BYTES, tmp_path, "validation")
    everything = np.concatenate([train, validation])
    assert BYTES.decode(list(everything)) == "plain text, café\n" * 200 + "first row" + "second row"
    assert list(everything).count(BYTES.eos_token_id) == 3
    assert len(validation) == len(everything) * 2 // 100


def test_a_bad_jsonl_line_names_the_file_and_line(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"text": "fine"}\n{"other": 1}\n')
    dataset = {"kind": "files", "paths": [str(tmp_path / "rows.jsonl")]}
    with pytest.raises(ValueError, match=r"rows.jsonl:2 .*text_field"):
        token_file(dataset, BYTES, tmp_path, "train")


def test_unknown_dataset_kinds_and_bad_files_raise_value_errors_with_a_fix(tmp_path):
    with pytest.raises(ValueError, match='unknown dataset kind .*use "stdlib", "files" or "hub"'):
        token_file({"kind": "s3"}, BYTES, tmp_path, "train")
    with pytest.raises(ValueError, match="does not exist; fix dataset.paths"):
        token_file({"kind": "files", "paths": [str(tmp_path / "gone.txt")]}, BYTES, tmp_path, "train")
    with pytest.raises(ValueError, match="neither .txt nor .jsonl"):
        token_file({"kind": "files", "paths": [str(tmp_path / "book.pdf")]}, BYTES, tmp_path, "train")
    with pytest.raises(ValueError, match="unknown split"):
        token_file(DEFAULT_DATASET, BYTES, tmp_path, "test")


def test_hub_dataset_without_the_datasets_library_names_the_offline_alternatives(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # a broken install: `import datasets` fails
    dataset = {"kind": "hub", "name": "wikitext", "config": "wikitext-2-raw-v1", "text_field": "text"}
    with pytest.raises(DatasetUnavailable, match='pip install datasets, or use {"kind": "stdlib"}') as error:
        token_file(dataset, BYTES, tmp_path, "train")
    assert "\n" not in str(error.value)


@pytest.fixture
def local_hub_dataset(tmp_path):
    """A dataset directory as `datasets.load_dataset` reads one (split files named train/validation)."""
    directory = tmp_path / "my-dataset"
    directory.mkdir()
    (directory / "train.txt").write_text("".join(f"training line {n} about pythons\n" for n in range(300)))
    (directory / "validation.txt").write_text("".join(f"held-out line {n}\n" for n in range(50)))
    return {"kind": "hub", "name": str(directory), "split": "train", "validation_split": "validation", "text_field": "text"}


def test_a_local_hub_dataset_is_loaded_by_the_datasets_library_and_cached(local_hub_dataset, tmp_path):
    cache = tmp_path / "cache"
    train = bytes(token_file(local_hub_dataset, BYTES, cache, "train").astype(np.uint8))
    validation = bytes(token_file(local_hub_dataset, BYTES, cache, "validation").astype(np.uint8))
    assert b"training line 299 about pythons" in train and b"held-out" not in train
    assert b"held-out line 49" in validation and b"training" not in validation
    assert any((cache / "hf-datasets").iterdir()), "the datasets library downloads into the cache directory"
    batches = train_batches(local_hub_dataset, BYTES, seq_len=16, micro_batch=2, seed=0, cache_dir=cache)
    assert next(batches).shape == (2, 16)
    # a changed source is tokenized again
    (Path(local_hub_dataset["name"]) / "train.txt").write_text("replaced text\n" * 100)
    assert b"replaced text" in bytes(token_file(local_hub_dataset, BYTES, cache, "train").astype(np.uint8))


def test_a_hub_dataset_field_that_does_not_exist_names_the_fields_it_has(local_hub_dataset, tmp_path):
    with pytest.raises(ValueError, match=r"has no field 'body' \(its fields: text\); set dataset.text_field"):
        token_file({**local_hub_dataset, "text_field": "body"}, BYTES, tmp_path, "train")


def test_an_unreachable_hub_says_so_and_names_the_offline_alternatives(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is unreachable here either way; never try the network
    dataset = {"kind": "hub", "name": "wikitext", "config": "wikitext-2-raw-v1", "text_field": "text"}
    with pytest.raises(DatasetUnavailable, match=r"cannot load hub dataset 'wikitext' split 'train' \(.*\); use .*stdlib") as error:
        token_file(dataset, BYTES, tmp_path, "train")
    assert "\n" not in str(error.value)


def test_train_batches_are_windows_of_the_token_file(files_dataset, tmp_path):
    batches = train_batches(files_dataset, BYTES, seq_len=32, micro_batch=4, seed=0, cache_dir=tmp_path)
    batch = next(batches)
    assert batch.shape == (4, 32) and batch.dtype == torch.int64
    assert batches.position == 4
    text = bytes(token_file(files_dataset, BYTES, tmp_path, "train").astype(np.uint8))
    assert all(bytes(row.to(torch.uint8).tolist()) in text for row in batch)


def test_the_seed_chooses_the_batch_stream(stdlib_cache):
    def stream(seed):
        batches = train_batches(DEFAULT_DATASET, BYTES, 64, 4, seed=seed, cache_dir=stdlib_cache)
        return [next(batches) for _ in range(3)]

    same, again, other = stream(11), stream(11), stream(12)
    assert all(torch.equal(a, b) for a, b in zip(same, again))
    assert not any(torch.equal(a, b) for a, b in zip(same, other))


def test_start_position_resumes_the_stream_across_blocks(files_dataset, tmp_path):
    # 1000 samples a batch crosses a block of SAMPLES_PER_BLOCK after a few batches.
    assert data.SAMPLES_PER_BLOCK < 5 * 1000
    original = train_batches(files_dataset, BYTES, 16, 1000, seed=5, cache_dir=tmp_path)
    expected = [next(original) for _ in range(6)]
    interrupted = train_batches(files_dataset, BYTES, 16, 1000, seed=5, cache_dir=tmp_path)
    next(interrupted), next(interrupted)
    resumed = train_batches(files_dataset, BYTES, 16, 1000, seed=5, cache_dir=tmp_path,
                            start_position=interrupted.position)
    assert all(torch.equal(next(resumed), batch) for batch in expected[2:])
    assert resumed.position == original.position == 6000


def test_validation_batches_are_fixed_and_shaped(stdlib_cache):
    first = validation_batches(DEFAULT_DATASET, BYTES, seq_len=64, batch_size=4, cache_dir=stdlib_cache,
                               max_batches=3)
    second = validation_batches(DEFAULT_DATASET, BYTES, seq_len=64, batch_size=4, cache_dir=stdlib_cache,
                                max_batches=3)
    assert len(first) == 3 and all(batch.shape == (4, 64) for batch in first)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert len({tuple(row.tolist()) for batch in first for row in batch}) == 12


def test_data_shorter_than_a_window_is_a_clear_error(tmp_path):
    (tmp_path / "short.txt").write_text("tiny")
    dataset = {"kind": "files", "paths": [str(tmp_path / "short.txt")]}
    with pytest.raises(ValueError, match="fewer than seq_len=64; use a smaller seq_len"):
        train_batches(dataset, BYTES, 64, 2, seed=0, cache_dir=tmp_path)
