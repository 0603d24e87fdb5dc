"""What the synchronizer learns of a user's model: parameters with tied weights once, embeddings found,
plain names checked, a fragment count that fits, a warning for lopsided fragments."""

from __future__ import annotations

import logging

import pytest
import torch

from ddiloco.api.model import (
    balance_note,
    check_plain_names,
    embedding_names,
    fit_fragments,
    load_initial,
    parameters,
    save_initial,
)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(10, 4)
        self.pos = torch.nn.Embedding(8, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        self.out.weight = self.tok.weight


def test_tied_weights_once_and_every_embedding_found():
    model = Tied()
    assert list(parameters(model)) == ["tok.weight", "pos.weight", "mid.weight", "mid.bias"]
    assert embedding_names(model) == {"tok.weight", "pos.weight"}


def test_plain_names_must_be_parameters_and_a_typo_gets_a_suggestion():
    params = parameters(Tied())
    assert check_plain_names(["tok.weight", ""], params) == {"tok.weight"}
    with pytest.raises(ValueError, match="'tok.weigth' is not a parameter.*did you mean tok.weight"):
        check_plain_names(["tok.weigth"], params)


def test_fragments_default_fits_the_model_and_the_period(caplog):
    with caplog.at_level(logging.WARNING):
        assert fit_fragments(100, None, 24) == 24 and not caplog.records
        assert fit_fragments(5, None, 24) == 5
        assert fit_fragments(100, None, 8) == 8
    assert "5 parameter tensors" in caplog.text and "H = 8" in caplog.text
    assert fit_fragments(5, 3, 24) == 3
    with pytest.raises(ValueError, match="cannot split 5 tensors into 6"):
        fit_fragments(5, 6, 24)


def test_lopsided_fragments_are_named_with_a_better_count():
    params = {"big": torch.zeros(1000), "a": torch.zeros(10), "b": torch.zeros(10), "c": torch.zeros(990)}
    note = balance_note(params, 4)
    assert note is not None and "4 fragments range from 10 to 1,000" in note and "2 fragments would" in note
    assert balance_note(params, 2) is None


def test_initial_file_records_the_embeddings(tmp_path):
    model = Tied()
    path = save_initial(model, tmp_path / "init.safetensors")
    params, plain = load_initial(path)
    assert set(params) == set(parameters(model)) and plain == {"tok.weight", "pos.weight"}
    assert torch.equal(params["tok.weight"], model.tok.weight.detach())
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "plain.safetensors"))
    assert load_initial(tmp_path / "plain.safetensors")[1] is None  # nothing recorded: the caller says so
    with pytest.raises(ValueError, match="not a Hugging Face model folder"):
        load_initial(tmp_path)
