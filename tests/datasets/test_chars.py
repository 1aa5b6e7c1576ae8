"""The character corpus: the stdlib's own sources, split by file, built locally and cached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper_core.datasets.chars import (
    TEST_FILES,
    TRAIN_FILES,
    VAL_FILES,
    VOCAB_SIZE,
    CharCorpusConfig,
    encode,
    load_chars,
    read_corpus,
    stdlib_dir,
)

SMALL = CharCorpusConfig(context=16, train_windows=64, val_windows=8, test_windows=8)


def test_the_splits_are_whole_files_and_the_corpus_is_megabytes() -> None:
    assert not set(TRAIN_FILES) & set(VAL_FILES) and not set(TRAIN_FILES) & set(TEST_FILES)
    assert not set(VAL_FILES) & set(TEST_FILES)
    assert len(read_corpus(TRAIN_FILES)) > 2_000_000


def test_windows_are_next_character_pairs_of_ascii_ids(tmp_path: Path) -> None:
    data = load_chars(SMALL, home=tmp_path)
    for x, y in (data.train, data.val, data.test):
        assert x.dtype == torch.int64 and x.shape[1] == 16 and x.shape == y.shape
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one character
        assert int(x.min()) >= 0 and int(x.max()) < VOCAB_SIZE
    assert len(data.train[0]) == 64 and len(data.val[0]) == 8
    # Validation starts at the first character of its first file.
    assert bytes(data.val[0][0].tolist()) == (stdlib_dir() / VAL_FILES[0]).read_bytes()[:16]


def test_the_corpus_is_cached_and_identical_when_read_back(tmp_path: Path) -> None:
    built = load_chars(SMALL, home=tmp_path)
    read = load_chars(SMALL, home=tmp_path)
    assert not built.from_cache and read.from_cache and read.cache_path == built.cache_path
    assert all(torch.equal(a, b) for a, b in zip(built.train + built.test, read.train + read.test, strict=True))
    other = load_chars(
        CharCorpusConfig(context=16, train_windows=64, val_windows=8, test_windows=8, seed=1), home=tmp_path
    )
    assert not torch.equal(other.train[0], built.train[0])


def test_non_ascii_bytes_become_nul_and_bad_configs_and_missing_files_are_refused(tmp_path: Path) -> None:
    assert encode("é a".encode()).tolist() == [0, 0, 32, 97]
    with pytest.raises(ValueError, match="context must be >= 2"):
        CharCorpusConfig(context=1)
    with pytest.raises(ValueError, match=r"lacks \['os.py', 'nope.py'\]"):
        read_corpus(("os.py", "nope.py"), root=tmp_path)


def test_a_module_that_became_a_package_is_read_from_its_init(tmp_path: Path) -> None:
    # zipfile.py is zipfile/__init__.py from CPython 3.12 on (the 2026-11-28 GPU image's Python).
    (tmp_path / "zipfile").mkdir()
    (tmp_path / "zipfile" / "__init__.py").write_bytes(b"package")
    (tmp_path / "os.py").write_bytes(b"module ")
    assert read_corpus(("os.py", "zipfile.py"), root=tmp_path) == b"module package"
