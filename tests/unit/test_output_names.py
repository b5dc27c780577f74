"""Outputs are named by position, so a model that names its own outputs - a dict, a mapping such as
HF's ModelOutput (an OrderedDict subclass), a namedtuple - must be listed in the model's order, or
each spec name would label another field's tensor (published config with swapped dims)."""

from __future__ import annotations

import collections
from collections.abc import Mapping

import pytest
import torch

from builder.core.errors import UserInputError
from builder.pipeline import build
from builder.model.runtime import name_outputs
from tests.unit.test_build_errors import assert_nothing_written
from tests.unit.test_spec_binding import vector, write_spec

NAMEDTUPLE_OUT = '''
import collections
import torch
NT = collections.namedtuple("NT", ["score", "feat"])
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(6, 4)
    def forward(self, x):
        h = self.fc(x)
        return NT(h.sum(-1, keepdim=True), h)
'''

NT = collections.namedtuple("NT", ["score", "feat"])


class ModelOutputLike(collections.OrderedDict):
    """What transformers' ModelOutput is to isinstance: an OrderedDict subclass."""


class ReadOnlyMapping(Mapping):
    def __init__(self, **items):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def test_a_namedtuple_named_in_another_order_is_refused_with_its_field_order(tmp_path, quiet):
    spec = write_spec(tmp_path, NAMEDTUPLE_OUT, [vector("x", 6)], [{"name": "feat"}, {"name": "score"}])
    with pytest.raises(UserInputError, match=r"field 'outputs': the model returns a namedtuple NT with fields score, "
                                             r"feat \(in this order\), the spec lists feat, score.*"
                                             r"outputs: \[\{name: score\}, \{name: feat\}\]"):
        build(spec, tmp_path / "repo", progress=quiet)
    assert_nothing_written(tmp_path, tmp_path / "repo")


def test_a_namedtuple_in_field_order_names_each_field():
    score, feat = torch.ones(2, 1), torch.zeros(2, 4)
    named = name_outputs(NT(score, feat), ["score", "feat"])
    assert {k: v.shape for k, v in named.items()} == {"score": (2, 1), "feat": (2, 4)}


@pytest.mark.parametrize("kind", [ModelOutputLike, ReadOnlyMapping])
def test_mapping_outputs_named_in_another_order_are_refused(kind):
    result = kind(logits=torch.zeros(2, 5), pooled=torch.zeros(2, 3))
    with pytest.raises(UserInputError, match=rf"the model returns a {kind.__name__} with keys logits, pooled \(in "
                                             r"this order\), the spec lists pooled, logits"):
        name_outputs(result, ["pooled", "logits"])
    named = name_outputs(result, ["logits", "pooled"])
    assert named["pooled"].shape == (2, 3)


def test_names_the_model_does_not_use_are_taken_by_position():
    """Only names the model itself uses can be in the wrong order; other names label by position."""
    named = name_outputs(NT(torch.ones(1, 1), torch.zeros(1, 4)), ["a", "b"])
    assert named["b"].shape == (1, 4)
