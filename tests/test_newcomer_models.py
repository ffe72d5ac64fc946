"""Models a newcomer brings, trained on 2 ranks and compared with one process: a float64 ViT built
from a transformers config over the shared-memory transport (each tensor of a message aligned to
its element size in the slot), and a traced 2-layer LSTM language model (its trace holds symbolic
sizes, ``hidden = zeros(layers, batch, hidden)``, that must survive pickling to the ranks).

Oracle: gpipe gives the weights of microbatch SGD on the original nn.Module with the runtime's
data order (float64, tight tolerance)."""

from __future__ import annotations

import pytest
import torch
from test_user_models import BATCH, COMMON, ce, microbatch_sgd, plan_for, runtime_weights, tokens
from torch.utils.data import TensorDataset

from workbench.profiling.layering import split
from workbench.runtime import prepare, run_jobs
from workbench.runtime.transport.shm import available

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def patches(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def vit():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=12,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=20,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(cfg).double()


class LSTMLanguageModel(torch.nn.Module):
    """Embedding, two stacked LSTMs with an explicit zero initial state (its size read from the
    input: a symbolic size in the trace), a linear head."""

    def __init__(self, vocab=64, dim=16, hidden=12):
        super().__init__()
        self.hidden = hidden
        self.emb = torch.nn.Embedding(vocab, dim)
        self.lstm1 = torch.nn.LSTM(dim, hidden, batch_first=True)
        self.lstm2 = torch.nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, x):
        h = self.emb(x)
        zeros = torch.zeros(1, x.shape[0], self.hidden, dtype=h.dtype)
        h, _ = self.lstm1(h, (zeros, zeros))
        h, _ = self.lstm2(h)
        return self.head(h)


def lstm():
    torch.manual_seed(0)
    return LSTMLanguageModel().double()


CASES = {
    "vit-shm": (vit, patches, lambda m, x: m(x).logits, "shm"),
    "lstm": (lstm, tokens, lambda m, x: m(x), "gloo"),
}


@pytest.mark.parametrize("key", list(CASES))
def test_trains_on_two_ranks_equal_to_one_process(tmp_path, key):
    make, data, call, transport = CASES[key]
    if transport == "shm" and available():
        pytest.skip(available())
    ds = data()
    g = split(make(), ds.tensors[0][:2])
    _, plan = plan_for(g, ds)
    assert plan.num_stages == 2
    job = prepare(make(), "gpipe", out=tmp_path / key, plan=plan, dataset=ds, transport=transport, **COMMON)
    assert job.run.transport == transport
    (summary,) = run_jobs([job])
    want = microbatch_sgd(make(), call, data(), ce)
    got = runtime_weights(summary)
    assert set(got) == set(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-9, atol=1e-11, msg=n)
    assert BATCH % 2 == 0 and summary["steps"] == COMMON["steps"]
