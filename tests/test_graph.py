"""workbench.profiling.layering.split: any nn.Module -> layers whose chain is the module (forward and gradients),
cuts that carry skip tensors, in-place operations kept with their producer, tied weights counted once,
and one-line refusals (untraceable code, unknown layer names, tied weights across stages)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench.models.resnet import resnet18
from workbench.profiling.layering import split
from workbench.profiling.measure import profile
from workbench.runtime.executors.tied import tied_weights


def chain(model, x):
    for layer in model.layers:
        x = layer(x)
    return x


def assert_same_function(module, gmodel, x, target_fn, call=None):
    """Output and parameter gradients of the layer chain equal the module's (train mode)."""
    call = call or module
    y_ref = call(*x) if isinstance(x, tuple) else call(x)
    y = chain(gmodel, x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    params = dict(module.named_parameters())
    g_ref = torch.autograd.grad(target_fn(y_ref), list(params.values()))
    by_id = {id(p): n for n, p in params.items()}
    mine = {by_id[id(p)]: p for p in nn.Sequential(*gmodel.layers).parameters()}
    assert set(mine) == set(params), "the layers hold exactly the module's parameters (shared, not copied)"
    g = torch.autograd.grad(target_fn(chain(gmodel, x)), [mine[n] for n in params])
    for n, a, b in zip(params, g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=n)


@pytest.mark.slow
def test_resnet18_splits_into_blocks_and_computes_the_same_function():
    torch.manual_seed(0)
    m = resnet18(num_classes=10, width=4, in_channels=1, small_input=True)
    g = split(m, torch.randn(2, 1, 8, 8))
    # conv1, bn1+relu (the in-place ReLU stays with the BN that produced its input), 8 blocks, pool, fc
    assert g.names == ["0:conv1", "1:bn1..relu"] + [
        f"{i + 2}:layer{k}.{j}" for i, (k, j) in enumerate((k, j) for k in range(1, 5) for j in range(2))
    ] + ["10:avgpool", "11:fc"]
    assert g.task == "classification" and g.target.high == 10 and g.tied == []
    x = torch.randn(5, 1, 8, 8)  # another batch size than traced: the batch dimension is dynamic
    assert_same_function(m, g, x, lambda y: (y**2).sum())


class Skip(nn.Module):
    """``out = l3(relu(l2(a))) + a`` with ``a = l1(x)``: ``a`` crosses the cuts inside the branch."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3, self.head = nn.Linear(6, 8), nn.Linear(8, 4), nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        a = self.l1(x)
        return self.head(self.l3(torch.relu(self.l2(a))) + a)


def test_skip_tensors_cross_the_cuts_and_count_in_act_bytes():
    torch.manual_seed(0)
    m = Skip()
    g = split(m, torch.randn(2, 6))
    assert [n.split(":")[1] for n in g.names] == ["l1", "l2", "l3", "head"]
    x = torch.randn(7, 6)
    assert_same_function(m, g, x, lambda y: y.sum())
    prof = profile(g, x, iterations=1, warmup=0, progress=False)
    f = 4  # float32 bytes
    # after l1: a; after l2: a and relu(l2(a)); after l3: l3(...) + a already summed; after head: the output
    assert prof.layers["act_bytes"].tolist() == [7 * 8 * f, 7 * (8 + 4) * f, 7 * 8 * f, 7 * 3 * f]
    assert prof.meta["batch_size"] == 7  # the batch it really measured


class TwoInTwoOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x, z):
        h = self.a(x) * self.b(z)
        return self.c(h), h.sum(-1)


def test_multiple_inputs_and_outputs():
    torch.manual_seed(0)
    m = TwoInTwoOut()
    g = split(m, (torch.randn(2, 4), torch.randn(2, 3)))
    assert len(g.layers) == 3 and len(g.inputs) == 2
    x = (torch.randn(5, 4), torch.randn(5, 3))
    y, y_ref = chain(g, x), m(*x)
    assert isinstance(y, tuple) and len(y) == 2
    for a, b in zip(y, y_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class InPlaceTopLevel(nn.Module):
    """In-place operations in the model's own code on tensors earlier modules produced."""

    def __init__(self):
        super().__init__()
        self.l1, self.act, self.l2, self.l3 = nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.act(self.l1(x))
        u = self.l2(h)
        u += h  # in-place add on l2's output
        return self.l3(u.relu_())


def test_in_place_operations_stay_with_their_producer_and_train():
    torch.manual_seed(0)
    m = InPlaceTopLevel()
    g = split(m, torch.randn(2, 4))
    assert [n.split(":")[1] for n in g.names] == ["l1..act", "l2", "l3"]
    x = torch.randn(3, 4)
    assert_same_function(m, g, x, lambda y: y.sum())
    profile(g, x, iterations=1, warmup=0, progress=False)  # layer inputs are autograd leaves: no in-place error


def test_profile_names_the_layer_of_an_in_place_input_instead_of_autograds_error():
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    with pytest.raises(
        ValueError, match=r"layer 1 \(1:ReLU: ReLU\) modifies its input in place.*workbench.profiling.layering.split"
    ):
        profile(seq, torch.randn(3, 4), iterations=1, warmup=0, progress=False)
    traced = profile(split(seq, torch.randn(2, 4)), torch.randn(3, 4), iterations=1, warmup=0, progress=False)
    assert len(traced) == 2  # Linear+ReLU(inplace) then Linear


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3)

    def forward(self, x):
        if x.sum() > 0:  # control flow on tensor values: not traceable
            return self.l(x)
        return -self.l(x)


def test_untraceable_model_gets_one_line_naming_it_and_layers_hint():
    with pytest.raises(ValueError, match=r"cannot trace DataDependent .*layers="):
        split(DataDependent(), torch.randn(2, 3))


def test_layers_override_and_unknown_names():
    torch.manual_seed(0)
    m = Skip()
    g = split(m, torch.randn(2, 6), layers=["l2", "head"])
    # a layer starts at each named module; code before the first joins it, code between stays behind
    assert g.names == ["0:l1..l3", "1:head"]
    x = torch.randn(3, 6)
    torch.testing.assert_close(chain(g, x), m(x), rtol=0, atol=0)
    with pytest.raises(
        ValueError,
        match=r"unknown module\(s\) \['l9'\] of Skip; its top-level modules are "
        r"\['l1', 'l2', 'l3', 'head'\]",
    ):
        split(m, torch.randn(2, 6), layers=["l9"])


def gpt2(tied: bool):
    pytest.importorskip("transformers")
    from workbench.models.examples import gpt2_tiny

    torch.manual_seed(0)
    return gpt2_tiny(vocab_size=64, n_layer=2, n_embd=16, n_head=2, context=16, tie_word_embeddings=tied)


@pytest.mark.slow
def test_gpt2_from_config_splits_into_tens_of_layers_and_matches():
    m = gpt2(tied=False)
    g = split(m, torch.randint(0, 64, (2, 16)))
    assert g.task == "lm" and g.target.shape == (16,) and g.target.high == 64
    assert 10 <= len(g.layers) <= 30 and g.names[-1].endswith("lm_head")
    x = torch.randint(0, 64, (3, 16))
    assert_same_function(m, g, x, lambda y: (y**2).mean(), call=lambda t: m(t).logits)


@pytest.mark.slow
def test_gpt2_tied_embedding_is_counted_once_and_found_across_stages():
    m = gpt2(tied=True)
    assert m.lm_head.weight is m.transformer.wte.weight
    g = split(m, torch.randint(0, 64, (2, 16)))
    ((names, idx),) = g.tied
    assert names == ["transformer.wte.weight", "lm_head.weight"] and idx == [0, len(g.layers) - 1]
    unique = sum(p.numel() * p.element_size() for p in m.parameters())  # nn.Module.parameters() dedups
    prof = profile(g, torch.randint(0, 64, (4, 16)), iterations=1, warmup=0, progress=False)
    assert prof.total_param_bytes == unique
    L = len(g.layers)
    assert tied_weights(g, [(0, L - 1)]) == ()  # one stage: its own business
    (tie,) = tied_weights(g, [(0, 5), (6, L - 1)])
    assert tie.stages == (0, 1) and tie.nbytes == m.lm_head.weight.numel() * m.lm_head.weight.element_size()
    assert tie.label() == "transformer.wte.weight and lm_head.weight are one tied weight used by stages [0, 1]"


@pytest.mark.slow
def test_to_device_rewrites_the_device_constants_of_the_trace():
    """GPT-2's trace creates position ids with arange(..., device=cpu); after .to("meta") the layers
    run on meta tensors end to end (the same rewrite serves cuda)."""
    g = split(gpt2(tied=False), torch.randint(0, 64, (2, 16)))
    assert any("device(type='cpu')" in layer.gm.code for layer in g.layers)
    g.to("meta")
    assert not any("device(type='cpu')" in layer.gm.code for layer in g.layers)
    y = chain(g, torch.randint(0, 64, (3, 16), device="meta"))
    assert y.device.type == "meta" and tuple(y.shape) == (3, 16, 64)


def test_from_modules_gives_layers_by_hand_for_untraceable_code():
    from workbench.profiling.layering import from_modules

    torch.manual_seed(0)
    blocks = [DataDependent(), nn.Linear(3, 5)]
    g = from_modules(blocks, torch.randn(2, 3))
    assert g.names == ["0:DataDependent", "1:Linear"] and g.task == "classification" and g.target.high == 5
    x = torch.randn(4, 3)
    torch.testing.assert_close(chain(g, x), blocks[1](blocks[0](x)), rtol=0, atol=0)
    prof = profile(g, x, iterations=1, warmup=0, progress=False)
    assert prof.total_param_bytes == sum(p.numel() * 4 for m in blocks for p in m.parameters())


def test_graph_model_repr_is_one_line_and_html_lists_layers():
    g = split(Skip(), torch.randn(2, 6))
    text = repr(g)
    assert text.startswith("GraphModel(name=Skip, layers=4") and "\n" not in text and "MiB" in text
    assert "3:head" in g._repr_html_() and "workbench-card" in g._repr_html_()
