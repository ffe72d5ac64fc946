"""Weights tied across stages (workbench.runtime.tied): which owning stages share a parameter, and
which schedules can combine their gradients before every update (the rest refused in one line).
The real runs (tied GPT-2 and Llama over two gloo ranks against the original module's gradient and
the semantic reference) are in tests/test_user_models.py."""
from __future__ import annotations

import pytest

from workbench.models import build as build_model
from workbench.runtime.stages import even_bounds
from workbench.runtime.tied import TiedWeight, check_tied, combine_ranks, tied_weights
from workbench.schedules import build


def test_the_zoo_gpts_tied_embedding_is_owned_by_the_first_and_the_last_stage():
    m = build_model("gpt", tie_weights=True, num_layers=2)
    (tie,) = tied_weights(m, even_bounds(len(m.layers), 2))
    assert tie.names == ((0, "0.tok.weight"), (1, "1.proj.weight"))
    assert tie.nbytes == m.layers[0].tok.weight.numel() * 4
    assert tied_weights(m, [(0, len(m.layers) - 1)]) == ()  # one stage: tied inside it
    assert tied_weights(build_model("gpt", num_layers=2), even_bounds(4, 2)) == ()


@pytest.mark.parametrize("name", ["gpipe", "pipedream", "pipedream-flush", "pipedream-2bw", "zb-h1", "pp"])
def test_schedules_whose_owners_updates_pair_up_are_accepted(name):
    sched = build(name, 3, 6, **({"workers": 3} if name == "pp" else {}))
    check_tied(sched, (TiedWeight(((0, "a"), (2, "b")), 4),))


def test_replicated_owners_combine_replica_by_replica():
    sched = build("dp-bsp", 2, 4, workers=2)  # both stages on both workers
    tie = TiedWeight(((0, "a"), (1, "b")), 4)
    check_tied(sched, (tie,))
    assert combine_ranks(sched, tie) == [(0,), (1,)]  # each rank sums its own two stages' buffers


@pytest.mark.parametrize("name, why", [
    ("dp-asp", "the 'async' rule"),
    ("fsdp", "fetches weights from other workers"),
])
def test_rules_without_a_common_update_are_refused_in_one_line(name, why):
    sched = build(name, 2, 4, workers=2)
    with pytest.raises(ValueError, match=r"^a and b are one tied weight used by stages \[0, 1\]; .*" + why) as e:
        check_tied(sched, (TiedWeight(((0, "a"), (1, "b")), 4),))
    assert "\n" not in str(e.value)
