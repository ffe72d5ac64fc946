"""Models a newcomer brings, trained on 2 ranks and compared with one process: a float64 ViT built
from a transformers config over the shared-memory transport (each tensor of a message aligned to
its element size in the slot), and a traced 2-layer LSTM language model (its trace holds symbolic
sizes, ``hidden = zeros(layers, batch, hidden)``, that must survive pickling to the ranks).

Oracle: gpipe gives the weights of microbatch SGD on the original nn.Module with the runtime's
data order (float64, tight tolerance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
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


class PerPixel(torch.nn.Module):
    """A segmentation-style head: an N x C x H x W output scored at every pixel (targets N x H x W)."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, classes, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


def per_pixel():
    torch.manual_seed(0)
    return PerPixel()


def pixel_labels(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n, 8, 8), generator=g))


def test_a_per_pixel_model_trains_and_scores_every_pixel(tmp_path):
    ds = pixel_labels()
    g = split(per_pixel(), ds.tensors[0][:2])
    _, plan = plan_for(g, ds)
    job = prepare(per_pixel(), "gpipe", out=tmp_path / "pix", plan=plan, dataset=ds, **COMMON)
    (summary,) = run_jobs([job])
    want = microbatch_sgd(per_pixel(), lambda m, x: m(x), pixel_labels(), F.cross_entropy)  # class axis 1
    got = runtime_weights(summary)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-9, atol=1e-11, msg=n)
    assert 0 <= summary["final_accuracy"] <= 1  # hits over pixels, not over samples


def hand_built():
    torch.manual_seed(0)
    return [torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10)]  # float32, as built


def test_a_hand_built_layer_model_is_converted_to_the_asked_dtype(tmp_path):
    from workbench.profiling.layering import from_modules

    ds = TensorDataset(patches().tensors[0].reshape(32, 64), patches().tensors[1])
    model = from_modules(hand_built(), ds.tensors[0][:2], name="hand-built")
    job = prepare(model, "gpipe", out=tmp_path / "hand", dataset=ds, **COMMON)  # COMMON: dtype="float64"
    assert next(model.parameters()).dtype == torch.float32  # the user's object is left as it was
    (summary,) = run_jobs([job])
    want = microbatch_sgd(torch.nn.Sequential(*hand_built()), lambda m, x: m(x), ds, ce)
    got = [t for s in sorted(summary["weights"]) for t in summary["weights"][s].values()]  # stage by stage
    assert all(t.dtype == torch.float64 for t in got)
    for (n, w), t in zip(want.items(), got, strict=True):
        torch.testing.assert_close(t, w, rtol=1e-9, atol=1e-11, msg=n)
