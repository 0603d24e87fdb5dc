"""Text corpora for the language-model tasks.

A corpus comes from a file, from a folder of text files, or -- with no path at all --
from the Python standard library's own source code, which every machine that runs
this package already has, so nothing is ever downloaded.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

#: Cap on the default (standard-library) corpus, in characters. The stdlib sources are
#: almost pure ASCII, so this is about 2 MB: enough text for ~1M-parameter models, and
#: small enough to read and tokenize in well under a second.
STDLIB_CORPUS_MAX_CHARS = 2_000_000

#: Joins the files of a folder corpus, so that one file's last line never runs into
#: the next file's first line.
FILE_SEPARATOR = "\n"

_SNIFF_BYTES = 8192

# Resolved-path key -> corpus text. Files are assumed not to change during a run.
_CACHE: dict[str, str] = {}


def read_text_file(path: Path) -> str | None:
    """The file's UTF-8 text, or None when it looks binary (NUL bytes) or is not UTF-8."""
    data = path.read_bytes()
    if b"\x00" in data[:_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _is_hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def read_folder(folder: Path) -> str:
    """All text files under `folder`, recursively, in sorted relative-path order.

    Hidden files and folders (names starting with '.', e.g. `.git`) and binary or
    non-UTF-8 files are skipped, so pointing at a checkout of some repository works.
    """
    files = sorted(
        (p for p in folder.rglob("*") if p.is_file() and not _is_hidden(p.relative_to(folder))),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    texts = [t for t in (read_text_file(p) for p in files) if t]
    return FILE_SEPARATOR.join(texts)


def stdlib_corpus(max_chars: int = STDLIB_CORPUS_MAX_CHARS) -> str:
    """The top-level `*.py` files of the standard library, sorted by name, capped at `max_chars`.

    Only the top level is read (not `site-packages` or `test/`), so the text depends on
    the Python version alone and not on what happens to be installed.
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py"), key=lambda p: p.name):
        text = read_text_file(path)
        if not text:
            continue
        parts.append(text)
        total += len(text) + len(FILE_SEPARATOR)
        if total >= max_chars:
            break
    corpus = FILE_SEPARATOR.join(parts)[:max_chars]
    if not corpus:
        raise ValueError(f"no Python source files found in the standard library at {stdlib}")
    return corpus


def read_corpus(path: str | Path | None) -> str:
    """The whole corpus at `path` (file or folder); `None` means the stdlib corpus.

    Cached per resolved path for the life of the process, because several tasks and
    learners in one process usually read the same corpus.

    Raises FileNotFoundError when `path` does not exist and ValueError when it holds no text.
    """
    if path is None:
        key = "<stdlib>"
        if key not in _CACHE:
            _CACHE[key] = stdlib_corpus()
        return _CACHE[key]
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"text corpus not found: {str(path)!r}")
    key = str(p.resolve())
    if key not in _CACHE:
        text = read_folder(p) if p.is_dir() else read_text_file(p)
        if not text:
            raise ValueError(f"no UTF-8 text found at {str(path)!r} (empty, binary or undecodable)")
        _CACHE[key] = text
    return _CACHE[key]


def split_text(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """(train, validation): the last `val_fraction` of the characters are held out.

    A contiguous tail rather than random lines, so that validation text is never seen
    in any training window.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    cut = int(round(len(text) * (1.0 - val_fraction)))
    cut = min(max(cut, 1), len(text) - 1) if len(text) > 1 else cut
    return text[:cut], text[cut:]


def load_text(path: str | Path | None = None, val_fraction: float = 0.1) -> tuple[str, str]:
    """(train_text, val_text) of the corpus at `path` (file, folder, or None for the stdlib)."""
    return split_text(read_corpus(path), val_fraction)


def clear_cache() -> None:
    """Forget every cached corpus (for tests, or if files changed on disk)."""
    _CACHE.clear()
