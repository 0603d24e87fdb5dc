"""The integration tests' data comes from inside the repository's reach: the Python standard library's
own sources (the CLI's default corpus), written once to a file, so that they run in a user's clone with
nothing beside it."""

from __future__ import annotations

import pytest

from ddiloco.train.text import read_corpus


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("corpus") / "stdlib.txt"
    path.write_text(read_corpus(None))
    return str(path)
