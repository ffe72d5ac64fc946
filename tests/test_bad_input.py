"""Bad input gets one clear line (and exit status 2 from the CLI), never a traceback: one test each.
All of them fail before any process is spawned, so the file runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from workbench.cli.commands import main
from workbench.profiling.measure import Profile
from workbench.runtime import prepare


def one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


@pytest.fixture
def zero_profile(tmp_path):
    layers = dict(name=["a", "b"], fwd_ms=[0.0, 0.0], bwd_ms=[0.0, 0.0], act_bytes=[4.0, 4.0], param_bytes=[0.0, 0.0])
    path = tmp_path / "zero.json"
    path.write_text(json.dumps({"meta": {}, "layers": layers}))
    return path


def test_all_zero_profile(capsys, zero_profile):
    with pytest.raises(ValueError, match="zero compute time"):
        Profile.load(zero_profile)
    assert "has zero compute time (fwd_ms + bwd_ms) in all 2 layers" in one_line_error(
        capsys, ["partition", "--profile", str(zero_profile), "--workers", "2"]
    )


def test_profile_json_that_is_a_list(capsys, tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    assert "holds a JSON list, not a profile" in one_line_error(capsys, ["partition", "--profile", str(path)])


def test_unknown_shipped_pipedream_profile(capsys, tmp_path):
    line = one_line_error(capsys, ["profile", "--pipedream", "vgg19", "--out", str(tmp_path / "p.csv")])
    assert "neither a shipped profile (alexnet, resnet50, vgg16, " in line and "graph.txt" in line


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--batch-size", "0"], "batch_size must be an integer >= 1, got 0"),
        (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
        (["--lr", "-1"], "lr must be a finite number > 0"),
        (["--microbatches", "0"], "microbatches must be an integer >= 1"),
        (["--momentum", "1.5"], "momentum must be in [0, 1)"),
        (["--model", "nosuch"], "unknown model 'nosuch'; choose one of"),
        (["--model", "workbench.models.examples:nosuch", "--dataset", "digits"], "has no 'nosuch'"),
        (["--model", "nosuch_pkg.mod:fn", "--dataset", "digits"], "cannot import 'nosuch_pkg.mod'"),
        (["--model", "workbench.models.examples:resnet18_digits"], "needs a data set (dataset= / --dataset)"),
    ],
)
def test_train_bad_numbers_and_models(capsys, tmp_path, argv, words):
    line = one_line_error(capsys, ["train", *argv, "--steps", "1", "--no-progress", "--out", str(tmp_path / "o")])
    assert words in line


def test_train_unknown_stage_lr_rule(capsys, tmp_path):
    """argparse refuses it (its usage line, then the error; status 2); the API gives one ValueError line."""
    with pytest.raises(SystemExit) as e:
        main(["train", "--stage-lr", "linear", "--steps", "1", "--no-progress", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'linear' (choose from 'same', 'replicas')" in err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match=r"^stage_lr must be one of 'same', 'replicas', got 'linear'$"):
        prepare("toy-mlp", "pipedream", workers=2, microbatches=4, stage_lr="linear", out=tmp_path / "p")


@pytest.mark.slow
def test_unknown_model_object_gets_a_short_message(tmp_path):
    """An object that is not a model: its type, not its whole repr."""
    with pytest.raises(ValueError) as e:
        prepare(object(), "gpipe", steps=1, out=tmp_path / "o", dataset="digits")
    assert "got object" in str(e.value) and len(str(e.value)) < 200


@pytest.mark.slow
def test_nn_sequential_is_traced_not_refused(tmp_path):
    """`unknown model Sequential(...)` is gone: an nn.Module is a model (traced by workbench.profiling.layering.split)."""
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(inplace=True), nn.Linear(32, 10))
    job = prepare(
        seq,
        "gpipe",
        workers=2,
        microbatches=2,
        batch_size=8,
        steps=1,
        out=tmp_path / "o",
        dataset="digits",
        allow_oversubscribe=True,
    )
    assert len(job.model_fn().layers) == 3 and job.options["model"] == "Sequential"


def test_user_model_options_are_refused(tmp_path):
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    with pytest.raises(ValueError, match=r"model options \['depth'\] apply to zoo models only"):
        prepare(seq, "gpipe", workers=1, steps=1, out=tmp_path / "o", dataset="digits", model_options={"depth": 3})


def test_dataset_that_is_not_a_tensor_dataset(tmp_path):
    with pytest.raises(ValueError, match="must be a torch.utils.data.TensorDataset"):
        prepare(nn.Linear(4, 2), "gpipe", workers=1, steps=1, out=tmp_path / "o", dataset=[torch.zeros(3, 4)])


def test_profile_from_frame_keeps_real_rows():
    df = pd.DataFrame(dict(name=["a"], fwd_ms=[1.0], bwd_ms=[2.0], act_bytes=[4.0], param_bytes=[8.0]))
    assert Profile(df).total_ms == 3.0  # the zero check does not reject a real profile


# ---- the inputs of issue 27's sweep: one line each ----------------------------------------------
class TwoArguments(nn.Module):
    def forward(self, x, y):
        return x + y


def test_two_argument_layer_in_a_sequential_is_named():
    seq = nn.Sequential(nn.Linear(4, 4), TwoArguments(), nn.Linear(4, 2))
    from workbench.profiling.measure import profile

    with pytest.raises(
        ValueError,
        match=r"layer 1 \(1:TwoArguments: TwoArguments\) cannot take the previous "
        r"layer's output \(tensor \(8, 4\)\)",
    ):
        profile(seq, torch.randn(8, 4), iterations=1, warmup=0, progress=False)


@pytest.fixture(scope="module")
def vgg16_csv(tmp_path_factory):
    from workbench.profiling.pipedream import shipped

    return shipped("vgg16").save(tmp_path_factory.mktemp("pd") / "vgg16_pd.csv")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--topology", "4xinf"], "bandwidth must be > 0 bytes/s and finite (got inf)"),
        (["--bandwidth", "inf"], "bandwidth must be > 0 bytes/s and finite (got inf)"),
        (["--topology", "4xnan"], "bandwidth must be > 0 bytes/s and finite (got nan)"),
        (["--topology", "4xV100-pcie-10g:two"], "write PRESET:SERVERS with a whole number of servers"),
    ],
)
def test_infinite_or_unparsable_bandwidth(capsys, vgg16_csv, argv, words):
    assert words in one_line_error(capsys, ["partition", "--profile", str(vgg16_csv), *argv])


def test_infinite_bandwidth_api():
    from workbench.cost.topology import Topology

    with pytest.raises(ValueError, match="bandwidth must be > 0 bytes/s and finite"):
        Topology.flat(4, float("inf"))


@pytest.mark.slow
def test_reproduce_out_inside_a_file(capsys, tmp_path):
    f = tmp_path / "a-file.txt"
    f.write_text("x")
    assert f"{f} is a file, not a folder" in one_line_error(capsys, ["reproduce", "--out", str(f), "--quick"])
    assert f.read_text() == "x"


def test_output_path_inside_a_file_profile(capsys, tmp_path):
    f = tmp_path / "a-file.txt"
    f.write_text("x")
    line = one_line_error(capsys, ["profile", "--pipedream", "vgg16", "--out", str(f / "p.csv")])
    assert "File exists" in line and str(f) in line


def test_model_option_of_the_wrong_type(capsys):
    from workbench import models

    with pytest.raises(ValueError, match=r"mlp option depth must be an int \(default 8\), got 'abc'"):
        models.build("mlp", depth="abc")
    line = one_line_error(capsys, ["train", "--model", "mlp", "--model-option", "depth=abc", "--steps", "1"])
    assert "mlp option depth must be an int (default 8), got 'abc'" in line


def test_negative_chunks_named_as_chunks(capsys):
    line = one_line_error(
        capsys, ["train", "--schedule", "interleaved-1f1b", "--schedule-option", "chunks=-1", "--steps", "1"]
    )
    assert "chunks must be a positive int" in line and "-2" not in line


def test_cnn_given_vectors_names_the_shape_mismatch():
    from workbench.profiling.layering import split

    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    with pytest.raises(ValueError, match=r"fails on the example input \(\(8, 512\)\) before any tracing") as e:
        split(cnn, torch.randn(8, 512))
    assert "by hand" not in str(e.value)


def test_cnn_given_the_synthetic_data_set_cli(capsys, tmp_path):
    line = one_line_error(
        capsys,
        [
            "profile",
            "--model",
            "workbench.models.examples:resnet18_digits",
            "--dataset",
            "synthetic",
            "--out",
            str(tmp_path / "p.csv"),
        ],
    )
    assert "fails on the example input" in line and "by hand" not in line


@pytest.mark.slow
def test_cache_building_model_gets_the_use_cache_hint():
    """A model whose output carries a transformers-style cache object: the hint names use_cache=False."""
    from workbench.profiling.layering import split

    class DynamicCache:  # what transformers' decoder returns with use_cache=True (not a tensor)
        pass

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x), DynamicCache()

    with pytest.raises(ValueError, match="use_cache=False"):
        split(Decoder(), torch.randn(2, 4))


@pytest.mark.slow
def test_a_model_that_cannot_take_the_data_set_is_refused_before_the_ranks_start(tmp_path):
    """The zoo mlp (512 inputs) given digits (8x8 = 64 features): one ValueError from prepare, with the
    layer's own error and the inputs' shape, instead of every rank failing on its first microbatch; the
    same model sized to the data set passes."""
    with pytest.raises(ValueError, match=r"cannot take the data set's samples \(inputs of shape \[\(2, 1, 8, 8\)\]\)"):
        prepare("mlp", "gpipe", workers=2, microbatches=2, steps=1, dataset="digits", out=tmp_path / "r")
    job = prepare(
        "mlp",
        "gpipe",
        workers=2,
        microbatches=2,
        steps=1,
        dataset="digits",
        out=tmp_path / "ok",
        model_options={"in_features": 64},
    )
    assert job.schedule.name == "gpipe"


# ---- sizes beyond what the tools take, silent coercions, divergence --------------------------------
@pytest.mark.parametrize(
    "argv, words",
    [
        (["partition", "--workers", "100000"], "the topology has 100000 workers; the partitioner takes at most 1024"),
        (
            ["simulate", "--schedule", "gpipe", "--stages", "100000", "--microbatches", "4"],
            "the stage count must be a positive whole number (at most 1024), got 100000",
        ),
        (["simulate", "--stages", "0"], "the stage count must be a positive whole number (at most 1024), got 0"),
    ],
)
def test_sizes_out_of_range_are_refused_at_once(capsys, vgg16_csv, tmp_path, argv, words):
    import time

    extra = ["--profile", str(vgg16_csv)] if argv[0] == "partition" else ["--out", str(tmp_path / "sim")]
    t = time.monotonic()
    assert words in one_line_error(capsys, [*argv, *extra])
    assert time.monotonic() - t < 5 and not (tmp_path / "sim").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["--dtype", "float17"],
            "dtype must name a torch floating-point dtype (float32, float64, bfloat16, ...), got 'float17'",
        ),
        (["--resume"], "holds no complete checkpoint to continue from; drop --resume to start afresh"),
    ],
)
def test_train_dtype_and_resume_without_checkpoint(capsys, tmp_path, argv, words):
    import time

    t = time.monotonic()
    assert words in one_line_error(
        capsys, ["train", *argv, "--steps", "1", "--no-progress", "--out", str(tmp_path / "o")]
    )
    assert time.monotonic() - t < 5


def test_partition_flags_must_be_booleans(vgg16_csv):
    from workbench import Topology, partition

    prof = Profile.load(vgg16_csv)
    with pytest.raises(ValueError, match="^straight must be True or False, got 'no'$"):
        partition(prof, Topology.flat(4, 1e9), straight="no")
    with pytest.raises(ValueError, match="^refine must be True or False, got 1$"):
        partition(prof, Topology.flat(4, 1e9), refine=1)


def test_a_diverged_run_warns_with_the_step(tmp_path):
    from workbench.runtime.launch.driver import DivergedWarning, warn_if_diverged

    (tmp_path / "metrics.csv").write_text("step,loss\n0,2.3\n1,inf\n2,nan\n")
    with pytest.warns(DivergedWarning, match=r"^the training loss became inf at step 1 \(lr 1e\+06\)"):
        warn_if_diverged(tmp_path, 1e6)
    (tmp_path / "metrics.csv").write_text("step,loss\n0,2.3\n1,2.1\n")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_diverged(tmp_path, 0.05)


def test_the_cli_prints_a_warning_on_one_line():
    from workbench.cli.commands import one_line_warning

    assert (
        one_line_warning("the loss became nan", RuntimeWarning, "x.py", 3)
        == "workbench: warning: the loss became nan\n"
    )


def test_a_long_refinement_is_announced_and_no_refine_skips_it(capsys, monkeypatch, vgg16_csv, tmp_path):
    """Above ``REFINE_NOTE_WORKERS`` workers refinement takes minutes (measured,
    results/bench/partition_workers.csv): the CLI says so on one line before it starts and names
    --no-refine; with --no-refine (or few workers) nothing is said."""
    from workbench.cli import actions

    seen = []

    def stop_here(*_, refine, **__):  # the plan itself is not needed: the note comes before it
        seen.append(refine)
        raise SystemExit(0)

    monkeypatch.setattr(actions, "partition", stop_here)
    for workers, extra, noted in ((512, [], True), (512, ["--no-refine"], False), (8, [], False)):
        with pytest.raises(SystemExit):
            main(
                [
                    "partition",
                    "--profile",
                    str(vgg16_csv),
                    "--workers",
                    str(workers),
                    "--out",
                    str(tmp_path / "p"),
                    *extra,
                ]
            )
        err = capsys.readouterr().err
        assert ("note: refining a plan on 512 workers" in err and "--no-refine" in err) == noted, err
    assert seen == [True, False, True]


# ---- outputs the default metric scores, or refuses in one line -------------------------------------


def test_the_accuracy_metric_scores_per_position_outputs_on_the_class_axis():
    from workbench.profiling.layering import from_modules

    x = torch.randn(2, 1, 4, 4)
    model = from_modules([nn.Conv2d(1, 3, 1)], x)  # N x C x H x W: class axis 1, as cross_entropy reads it
    out = torch.zeros(2, 3, 4, 4)
    out[:, 2] = 1.0  # class 2 everywhere
    target = torch.full((2, 4, 4), 2)
    target[0, 0, 0] = 0
    assert model.correct(out, target) == 2 * 4 * 4 - 1
    soft = torch.nn.functional.one_hot(target, 3).permute(0, 3, 1, 2).float()  # class probabilities
    assert model.correct(out, soft) == 2 * 4 * 4 - 1
    with pytest.raises(ValueError, match=r"output has shape \(2, 3, 4, 4\) \(class axis 1\) and the targets \(2, 5\)"):
        model.correct(out, torch.zeros(2, 5, dtype=torch.int64))


def test_an_output_the_targets_do_not_fit_is_refused_before_the_ranks_start(tmp_path):
    """A per-pixel model given one label per sample: one line naming both shapes, before any rank."""
    ds = torch.utils.data.TensorDataset(torch.randn(8, 1, 4, 4), torch.randint(0, 3, (8,)))
    model = nn.Sequential(nn.Conv2d(1, 3, 1))
    with pytest.raises(ValueError) as e:
        prepare(model, "gpipe", workers=1, steps=1, out=tmp_path / "o", dataset=ds, allow_oversubscribe=True)
    msg = str(e.value)
    assert "\n" not in msg and "output (shape (2, 3, 4, 4)) does not fit its targets (shape (2,))" in msg


# ---- rough edges a newcomer hit: each one line, exit 2 -------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--threads", "0"], "threads must be an integer >= 1 (torch threads per worker"),
        (["--model-option", "in_features=-5"], "mlp option in_features must be >= 1 (default 512), got -5"),
        (
            ["--model", "gpt", "--model-option", "dropout=-0.1"],
            "gpt option dropout must be >= 0 (default 0.0), got -0.1",
        ),
        (["--model", "mpl"], "unknown model 'mpl' (did you mean 'mlp'?); choose one of"),
        (["--schedule", "pipedram"], "unknown schedule 'pipedram' (did you mean 'pipedream'?); expected one of"),
    ],
)
def test_train_rough_edges(capsys, tmp_path, argv, words):
    line = one_line_error(capsys, ["train", "--steps", "1", "--out", str(tmp_path / "r"), *argv])
    assert words in line, line


def test_a_very_long_model_name_is_not_echoed_whole(capsys, tmp_path):
    name = "x" * 5000
    line = one_line_error(capsys, ["train", "--model", name, "--steps", "1", "--out", str(tmp_path / "r")])
    assert "unknown model 'xxx" in line and "(5000 characters)" in line and len(line) < 400, len(line)


def test_a_model_option_its_builder_refuses_is_named():
    from workbench.models import build

    with pytest.raises(ValueError, match=r"^gpt cannot be built with dim=16, heads=3: "):
        build("gpt", dim=16, heads=3)


def test_a_nan_in_a_profile_reads_plainly(capsys, tmp_path):
    path = tmp_path / "nan.csv"
    path.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\na,nan,1,1,1\n")
    line = one_line_error(capsys, ["partition", "--profile", str(path), "--workers", "2"])
    assert line.endswith("layer 0 ('a') has nan") and "np." not in line, line


def test_an_empty_profile_csv_names_the_file(capsys, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("")
    line = one_line_error(capsys, ["partition", "--profile", str(path), "--workers", "2"])
    assert f"{path} is not a profile" in line, line


def test_simulate_into_a_read_only_folder_fails_before_printing(capsys, tmp_path, monkeypatch):
    """Root may write anywhere, so the folder's mode alone cannot show it here: os.access is told it is read-only."""
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and Path(p) != ro)
    rc = main(["simulate", "--schedule", "gpipe", "--out", str(ro / "sim")])
    out, err = capsys.readouterr()
    assert (
        rc == 2
        and out == ""
        and err.strip().splitlines()
        == [
            f"workbench simulate: error: cannot write {ro / 'sim'}: the folder {ro} is read-only; give --out a folder "
            "you can write"
        ]
    )


def test_profile_of_a_wrong_input_shape_names_the_layer():
    from workbench import profile

    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.ReLU())
    with pytest.raises(ValueError, match=r"^layer 1 \(1:Linear\) cannot take its input of shape \(2, 32\): mat1"):
        profile(model, torch.randn(2, 32), progress=False, iterations=1, warmup=0)
