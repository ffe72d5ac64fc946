"""Bad input gets one clear line (and exit status 2 from the CLI), never a traceback: one test each.
All of them fail before any process is spawned, so the file runs in seconds."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch import nn

from workbench.cli import main
from workbench.profiler import Profile
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
        capsys, ["partition", "--profile", str(zero_profile), "--workers", "2"])


def test_profile_json_that_is_a_list(capsys, tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    assert "holds a JSON list, not a profile" in one_line_error(capsys, ["partition", "--profile", str(path)])


def test_unknown_shipped_pipedream_profile(capsys, tmp_path):
    line = one_line_error(capsys, ["profile", "--pipedream", "vgg19", "--out", str(tmp_path / "p.csv")])
    assert "neither a shipped profile (alexnet, resnet50, vgg16)" in line


@pytest.mark.parametrize("argv, words", [
    (["--batch-size", "0"], "batch_size must be an integer >= 1, got 0"),
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--lr", "-1"], "lr must be a finite number > 0"),
    (["--microbatches", "0"], "microbatches must be an integer >= 1"),
    (["--momentum", "1.5"], "momentum must be in [0, 1)"),
    (["--model", "nosuch"], "unknown model 'nosuch'; choose one of"),
    (["--model", "workbench.models.examples:nosuch", "--dataset", "digits"], "has no 'nosuch'"),
    (["--model", "nosuch_pkg.mod:fn", "--dataset", "digits"], "cannot import 'nosuch_pkg.mod'"),
    (["--model", "workbench.models.examples:resnet18_digits"], "needs a data set (dataset= / --dataset)"),
])
def test_train_bad_numbers_and_models(capsys, tmp_path, argv, words):
    line = one_line_error(capsys, ["train", *argv, "--steps", "1", "--no-progress", "--out", str(tmp_path / "o")])
    assert words in line


def test_unknown_model_object_gets_a_short_message(tmp_path):
    """An object that is not a model: its type, not its whole repr."""
    with pytest.raises(ValueError) as e:
        prepare(object(), "gpipe", steps=1, out=tmp_path / "o", dataset="digits")
    assert "got object" in str(e.value) and len(str(e.value)) < 200


def test_nn_sequential_is_traced_not_refused(tmp_path):
    """`unknown model Sequential(...)` is gone: an nn.Module is a model (traced by workbench.graph.split)."""
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(inplace=True), nn.Linear(32, 10))
    job = prepare(seq, "gpipe", workers=2, microbatches=2, batch_size=8, steps=1, out=tmp_path / "o", dataset="digits",
                  allow_oversubscribe=True)
    assert len(job.model_fn().layers) == 3 and job.options["model"] == "Sequential"


def test_user_model_options_are_refused(tmp_path):
    seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    with pytest.raises(ValueError, match=r"model options \['depth'\] apply to zoo models only"):
        prepare(seq, "gpipe", workers=1, steps=1, out=tmp_path / "o", dataset="digits", depth=3)


def test_dataset_that_is_not_a_tensor_dataset(tmp_path):
    with pytest.raises(ValueError, match="must be a torch.utils.data.TensorDataset"):
        prepare(nn.Linear(4, 2), "gpipe", workers=1, steps=1, out=tmp_path / "o", dataset=[torch.zeros(3, 4)])


def test_profile_from_frame_keeps_real_rows():
    df = pd.DataFrame(dict(name=["a"], fwd_ms=[1.0], bwd_ms=[2.0], act_bytes=[4.0], param_bytes=[8.0]))
    assert Profile(df).total_ms == 3.0  # the zero check does not reject a real profile
