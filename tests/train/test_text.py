from __future__ import annotations

from pathlib import Path

import pytest

from ddiloco.train import text as textmod
from ddiloco.train.text import (
    STDLIB_CORPUS_MAX_CHARS,
    load_text,
    read_corpus,
    split_text,
    stdlib_corpus,
)


def test_load_file_splits_train_and_val(tmp_path: Path) -> None:
    content = "".join(f"line {i}: héllo wörld\n" for i in range(500))
    f = tmp_path / "corpus.txt"
    f.write_text(content, encoding="utf-8")
    train, val = load_text(str(f), val_fraction=0.2)
    assert train + val == content
    assert abs(len(val) - 0.2 * len(content)) <= 1
    assert content.endswith(val)


def test_load_folder_recursive_sorted_text_only(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("second-b-z", encoding="utf-8")
    (tmp_path / "a.txt").write_text("first-a", encoding="utf-8")
    (tmp_path / "c.md").write_text("third-c", encoding="utf-8")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("hidden", encoding="utf-8")
    corpus = read_corpus(tmp_path)
    assert corpus == "first-a\nsecond-b-z\nthird-c"
    train, val = load_text(tmp_path, val_fraction=0.25)
    assert train + val == corpus


def test_missing_path_raises_with_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "corpus.txt"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_text(str(missing))


def test_no_text_raises_value_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty"):
        load_text(str(empty))
    binary = tmp_path / "only.bin"
    binary.write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="only.bin"):
        load_text(str(binary))


def test_stdlib_default_corpus_nonempty_and_deterministic() -> None:
    a = stdlib_corpus()
    b = stdlib_corpus()
    assert a == b
    assert 1_000_000 < len(a) <= STDLIB_CORPUS_MAX_CHARS
    assert "def " in a and "import " in a
    textmod.clear_cache()
    train, val = load_text(None)
    assert train + val == a
    assert abs(len(val) - 0.1 * len(a)) <= 1


def test_stdlib_cap_is_respected() -> None:
    small = stdlib_corpus(max_chars=10_000)
    assert len(small) == 10_000
    assert stdlib_corpus().startswith(small)


def test_split_rejects_bad_fraction() -> None:
    with pytest.raises(ValueError):
        split_text("abcdef", 0.0)
    with pytest.raises(ValueError):
        split_text("abcdef", 1.0)


def test_shakespeare_loads(shakespeare: str) -> None:
    train, val = load_text(shakespeare)
    assert len(train) + len(val) > 1_000_000
    assert train.startswith("First Citizen")
    assert 0.09 < len(val) / (len(train) + len(val)) < 0.11
