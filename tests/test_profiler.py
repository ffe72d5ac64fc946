from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.profiling.measure import GPUS, Profile, analyze, profile, project

SHARED = Path(__file__).resolve().parents[2] / "shared" / "pipedream-profiles"


def frame(n=4):
    return pd.DataFrame(
        dict(
            name=[f"l{i}" for i in range(n)],
            fwd_ms=np.arange(1, n + 1.0),
            bwd_ms=2 * np.arange(1, n + 1.0),
            act_bytes=[100.0] * n,
            param_bytes=[10.0] * n,
        )
    )


@pytest.mark.parametrize("col,value", [("fwd_ms", -1.0), ("bwd_ms", float("nan")), ("act_bytes", float("inf"))])
def test_bad_values_rejected(col, value):
    df = frame()
    df.loc[2, col] = value
    with pytest.raises(ValueError, match=col):
        Profile.from_frame(df)


def test_missing_column_and_empty_rejected():
    with pytest.raises(ValueError, match="missing column"):
        Profile.from_frame(frame().drop(columns="act_bytes"))
    with pytest.raises(ValueError, match="no layers"):
        Profile.from_frame(frame().iloc[:0])


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_save_load_roundtrip(tmp_path, suffix):
    p = Profile.from_frame(frame(), kind="measured", device="test")
    q = Profile.load(p.save(tmp_path / f"p{suffix}"))
    pd.testing.assert_frame_equal(p.layers, q.layers, check_dtype=False)
    assert q.meta["kind"] == "measured"
    assert q.compute_ms.tolist() == [3.0, 6.0, 9.0, 12.0]


def test_load_garbage_is_clear(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a profile"):
        Profile.load(bad)
    with pytest.raises(ValueError, match="does not exist"):
        Profile.load(tmp_path / "missing.csv")


def test_pipedream_branching_cut_bytes(tmp_path):
    """a -> b -> d and a -> c -> d: cuts inside the diamond carry two tensors."""
    g = tmp_path / "graph.txt"
    line = "{n} -- {d} -- forward_compute_time={f}, backward_compute_time={b}, activation_size={a}, parameter_size={p}"
    nodes = [
        ("node1", "Input", 5, 0, 1000, 0),
        ("node2", "Conv2d(a)", 1, 2, 10, 4),
        ("node3", "ReLU()", 1, 1, 20, 0),
        ("node4", "Conv2d(c)", 3, 4, 30, 8),
        ("node5", "Add(inplace)", 0, 0, 40, 0),
    ]
    text = [line.format(n=n, d=d, f=f, b=b, a=a, p=p) for n, d, f, b, a, p in reversed(nodes)]
    text += ["\tnode1 -- node2", "\tnode2 -- node3", "\tnode2 -- node4", "\tnode3 -- node5", "\tnode4 -- node5"]
    g.write_text("\n".join(text) + "\n")
    p = Profile.from_pipedream(g)
    df = p.layers
    assert df["node"].tolist() == ["node2", "node3", "node4", "node5"]  # Input dropped, topological order
    # after node2: only node2's output (10); after node3: node3 (20) and node2 (still needed by node4)
    assert df["act_bytes"].tolist() == [10, 20 + 10, 20 + 30, 40]
    assert df["fwd_ms"].tolist() == [1, 1, 3, 0]
    assert p.meta["input_bytes"] == 1000 and p.meta["kind"] == "measured"


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/pipedream-profiles not present")
@pytest.mark.parametrize(
    "model,layers,params_m", [("alexnet", 22, 61.1), ("vgg16", 40, 138.36), ("resnet50", 176, 25.56)]
)
def test_pipedream_real_profiles(model, layers, params_m):
    p = Profile.from_pipedream(SHARED / model / "graph.txt")
    assert len(p) == layers
    assert p.total_param_bytes / 4 / 1e6 == pytest.approx(params_m, rel=2e-3)  # fp32 parameters
    assert (p.layers["act_bytes"] > 0).all()
    if model == "resnet50":  # the skip connection crosses cuts inside every bottleneck block
        assert (p.layers["crossing"] == 2).sum() > 30


@pytest.mark.slow
def test_profile_measures_a_sequential_exactly_where_it_can():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    p = profile(net, torch.randn(32, 64), iterations=3, warmup=1, progress=False)
    df = p.layers
    assert list(df["act_bytes"]) == [32 * 128 * 4, 32 * 128 * 4, 32 * 10 * 4]
    assert list(df["param_bytes"]) == [(64 * 128 + 128) * 4, 0, (128 * 10 + 10) * 4]
    assert df.loc[0, "flops_fwd"] == 2 * 32 * 64 * 128  # matmul FLOPs from torch.utils.flop_counter
    assert df.loc[0, "flops_bwd"] == df.loc[0, "flops_fwd"]  # first layer: weight grad only, no grad for data
    assert df.loc[2, "flops_fwd"] == 2 * 32 * 128 * 10
    assert df.loc[2, "flops_bwd"] == 2 * df.loc[2, "flops_fwd"]  # grad wrt input and weight
    assert (df["fwd_ms"] > 0).all() and (df["bwd_ms"] >= 0).all()
    assert p.meta["kind"] == "measured" and p.meta["peak_memory_bytes"] > 0


class Skip(torch.nn.Module):
    """Passes (h, x) on: the skip tensor crosses the next cut."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x), x


class Join(torch.nn.Module):
    def forward(self, hx):
        h, x = hx
        return h + x


def test_profile_tuple_outputs_count_every_crossing_tensor():
    p = profile([Skip(), Join()], torch.randn(4, 8), iterations=2, warmup=0, progress=False)
    assert p.layers["act_bytes"].tolist() == [2 * 4 * 8 * 4, 4 * 8 * 4]


def test_projection_is_modeled_and_ordered_by_gpu_speed():
    net = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
    with torch.device("meta"):
        x = torch.randn(512, 1024)
    stats = analyze(net.to("meta"), x)
    v100, h100 = project(stats, "V100"), project(stats, "H100")
    assert v100.meta["kind"] == "modeled"
    # a 512x1024x1024 matmul is compute bound: 2*512*1024*1024 FLOPs at 50% of 15.7 TFLOP/s
    assert v100.layers.loc[0, "fwd_ms"] == pytest.approx(2 * 512 * 1024**2 / (0.5 * 15.7e12) * 1e3 + 0.01)
    assert (h100.layers["fwd_ms"] <= v100.layers["fwd_ms"]).all()
    assert h100.layers.loc[0, "fwd_ms"] < v100.layers.loc[0, "fwd_ms"] / 3  # 67 vs 15.7 TFLOP/s, compute bound
    with pytest.raises(ValueError, match="unknown GPU"):
        project(stats, "TPU")
    assert set(GPUS) >= {"V100", "1080Ti", "A100", "H100"}


def test_winograd_discount_applies_to_3x3_stride1_convs_only():
    net = torch.nn.Sequential(
        torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1),
    ).to("meta")
    with torch.device("meta"):
        x = torch.randn(64, 64, 56, 56)
    stats = analyze(net, x)
    direct = 2 * 64 * 64 * 56 * 56 * 64 * 9
    assert stats["flops_conv3x3"].tolist() == [direct, direct, 0]
    assert stats["flops_fwd"].iloc[1] == pytest.approx(direct, rel=1e-3)  # flop_counter agrees (bias aside)
    plain, wino = project(stats, "V100", winograd=False).layers, project(stats, "V100", winograd=True).layers
    # layer 1 is compute bound: its modeled compute time shrinks by exactly 36/16 (forward and backward)
    assert (plain.fwd_ms[1] - 0.01) / (wino.fwd_ms[1] - 0.01) == pytest.approx(36 / 16, rel=1e-3)
    assert (plain.bwd_ms[1] - 0.01) / (wino.bwd_ms[1] - 0.01) == pytest.approx(36 / 16, rel=1e-3)
    assert wino.fwd_ms[2] == plain.fwd_ms[2]  # stride-2 conv: no Winograd


# ---- a profile records what it measured, counts a tied weight once, and displays in one line ----
def test_profile_records_the_real_batch_and_counts_tied_weights_once():
    import torch
    from torch import nn

    from workbench.profiling.measure import profile

    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied input/output embedding
    prof = profile(
        nn.Sequential(emb, head), torch.randint(0, 10, (6, 3)), batch_size=128, iterations=1, warmup=0, progress=False
    )
    assert prof.meta["batch_size"] == 6  # the example input's batch, not the batch_size argument
    assert prof.layers["param_bytes"].tolist() == [10 * 4 * 4, 0.0]
    assert prof.total_param_bytes == sum(p.numel() * 4 for p in nn.Sequential(emb, head).parameters())


def test_profile_repr_is_one_line_and_html_has_units():
    from workbench.profiling.pipedream import shipped

    prof = shipped("vgg16")
    text = repr(prof)
    assert "\n" not in text and text.startswith("Profile(") and "ms per minibatch" in text and "MiB" in text
    page = prof._repr_html_()
    assert "workbench-card" in page and "fwd+bwd" in page and f"{prof.total_ms:.4g} ms" in page


@pytest.mark.slow
def test_cli_profiles_a_user_model_measured_and_modeled(tmp_path, capsys):
    from workbench.cli.commands import main
    from workbench.profiling.measure import Profile

    base = [
        "profile",
        "--model",
        "workbench.models.examples:resnet18_digits",
        "--dataset",
        "digits",
        "--batch-size",
        "16",
        "--iterations",
        "1",
        "--warmup",
        "0",
    ]
    assert main(base + ["--out", str(tmp_path / "p.json")]) == 0
    assert main(base + ["--gpu", "V100", "--out", str(tmp_path / "p.json")]) == 0  # never overwrites: p-2.json
    measured, modeled = Profile.load(tmp_path / "p.json"), Profile.load(tmp_path / "p-2.json")
    assert len(measured) == len(modeled) == 12 and measured.meta["batch_size"] == modeled.meta["batch_size"] == 16
    assert measured.meta["kind"] == "measured" and modeled.meta["kind"] == "modeled"
    assert measured.layers["param_bytes"].tolist() == modeled.layers["param_bytes"].tolist()
    assert "wrote" in capsys.readouterr().out


# ---- honest profiles: threads, repeated timing, load, warning --------------------------------------
def test_profile_records_threads_spread_and_load_and_restores_threads():
    from workbench.profiling.measure import threads_per_rank

    before = torch.get_num_threads()
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    p = profile(net, torch.randn(8, 16), iterations=5, warmup=1, progress=False, threads=1, flops=False)
    assert torch.get_num_threads() == before
    m = p.meta
    assert m["threads"] == 1 and m["cores"] >= 1 and m["device"] == "CPU (1 threads)"
    assert m["load_before"] is None or m["load_before"] >= 0
    assert m["spread"] >= 0 and (p.layers[["fwd_spread", "bwd_spread"]] >= 0).all().all()
    default = profile(net, torch.randn(8, 16), iterations=1, warmup=0, progress=False, flops=False)
    assert default.meta["threads"] == threads_per_rank(1) == m["cores"]
    assert threads_per_rank(10**6) == 1


def test_spread_is_p90_minus_p10_over_the_median():
    from workbench.profiling.measure import relative_spread

    times = [1.0] * 8 + [11.0, 21.0]  # p10 = 1, p90 = 12, median = 1
    assert relative_spread(times) == pytest.approx((np.percentile(times, 90) - np.percentile(times, 10)) / 1.0)
    assert relative_spread([2.0]) == 0.0


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_bad_threads(threads):
    with pytest.raises(ValueError, match="threads must be a positive int"):
        profile(torch.nn.Linear(2, 2), torch.randn(1, 2), progress=False, threads=threads)


def _measured(**meta):
    base = dict(kind="measured", threads=2, cores=2, load_before=0.2, spread=0.05)
    return Profile.from_frame(frame(), **(base | meta))


@pytest.mark.parametrize(
    "meta, words",
    [
        (dict(load_before=4.0), "load average 4.0 on 2 cores while profiling with 2 thread(s)"),
        (dict(load_before=2.5, threads=1), "load average 2.5 on 2 cores while profiling with 1 thread(s)"),
        (dict(spread=1.35), "repeated runs spread by 135% of the median"),
    ],
)
def test_trust_note_flags_load_and_spread(meta, words):
    note = _measured(**meta).trust_note()
    assert words in note and "\n" not in note and note.startswith("warning:")
    assert note in _measured(**meta).summary() and "warning:" in _measured(**meta)._repr_html_()


def test_trust_note_quiet_modeled_and_old_profiles_say_nothing():
    assert _measured().trust_note() == ""
    assert _measured(load_before=1.9, threads=1).trust_note() == ""  # one core left idle, under one process more
    assert Profile.from_frame(frame(), kind="modeled", load_before=9.0).trust_note() == ""
    assert Profile.from_frame(frame(), kind="measured").trust_note() == ""  # written before threads were recorded


def test_cli_profile_threads_and_workers(tmp_path, capsys):
    from workbench.cli.commands import main
    from workbench.profiling.measure import threads_per_rank

    out = tmp_path / "p.json"
    assert (
        main(["profile", "--model", "mlp", "--threads", "1", "--iterations", "2", "--warmup", "0", "--out", str(out)])
        == 0
    )
    assert Profile.load(out).meta["threads"] == 1
    out2 = tmp_path / "p2.json"
    assert (
        main(["profile", "--model", "mlp", "--workers", "2", "--iterations", "1", "--warmup", "0", "--out", str(out2)])
        == 0
    )
    assert Profile.load(out2).meta["threads"] == threads_per_rank(2)
    capsys.readouterr()
    assert main(["profile", "--model", "mlp", "--threads", "1", "--workers", "2", "--out", str(tmp_path / "x")]) == 2
    assert "give --threads or --workers" in capsys.readouterr().err
    assert main(["profile", "--gpu", "V100", "--threads", "1", "--out", str(tmp_path / "y.csv")]) == 2


def test_modeled_profile_records_the_gpu_memory():
    assert GPUS["V100"]["memory"] == 16 * 2**30 and GPUS["V100-32GB"]["memory"] == 32 * 2**30
    assert GPUS["1080Ti"]["memory"] == 11 * 2**30
    p = project(frame().assign(flops_fwd=1e9, flops_bwd=2e9, input_bytes=100.0), "1080Ti")
    assert p.meta["device_memory_bytes"] == 11 * 2**30
