import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli.commands import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "pipedream-profiles"


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli.commands", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needle",
    [
        (["profile", "--model", "no-such-model", "--out", "x.csv"], "no-such-model"),
        (["partition", "--profile", "missing.csv", "--workers", "2"], "does not exist"),
        (["partition", "--profile", "PROFILE", "--workers", "0"], "worker"),
        (["partition", "--profile", "PROFILE", "--topology", "4y1e9"], "COUNTxBANDWIDTH"),
        (["partition", "--profile", "PROFILE", "--workers", "2", "--bandwidth", "0"], "bandwidth"),
    ],
)
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\na,1,2,100,10\nb,1,2,100,10\n")
    args = [str(prof) if a == "PROFILE" else a for a in args]
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert needle.lower() in r.stderr.lower()


@pytest.mark.slow
def test_argparse_errors_are_status_2():
    r = run_cli("partition", "--workers", "notanumber")
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.slow
def test_partition_writes_plan(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    prof.write_text(
        "name,fwd_ms,bwd_ms,act_bytes,param_bytes\n" + "".join(f"l{i},{i + 1},{2 * i + 2},1000,100\n" for i in range(8))
    )
    out = tmp_path / "plan.json"
    assert main(["partition", "--profile", str(prof), "--workers", "4", "--out", str(out)]) == 0
    from workbench.cost.plan import Plan

    plan = Plan.load(out)
    assert plan.num_workers == 4
    text = capsys.readouterr().out
    assert "bottleneck" in text and "baseline" in text


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.exists(), reason="../shared not present")
def test_profile_import_pipedream(tmp_path, capsys):
    out = tmp_path / "vgg.csv"
    assert main(["profile", "--pipedream", str(SHARED / "vgg16" / "graph.txt"), "--out", str(out)]) == 0
    assert out.exists() and "40 layers" in capsys.readouterr().out


@pytest.mark.slow
def test_simulate_writes_timeline_metrics_html(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\n" + "".join(f"l{i},1,2,1e6,1e3\n" for i in range(8)))
    plan = tmp_path / "plan.json"
    assert main(["partition", "--profile", str(prof), "--workers", "4", "--straight", "--out", str(plan)]) == 0
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--profile",
                str(prof),
                "--plan",
                str(plan),
                "--workers",
                "4",
                "--schedule",
                "pipedream",
                "--microbatches",
                "16",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    import json

    import pandas as pd

    tl = pd.read_csv(out / "timeline.csv")
    assert {"worker", "stage", "microbatch", "kind", "start", "end"} <= set(tl.columns)
    assert (tl["kind"] == "F").sum() == 4 * 16
    assert json.loads((out / "metrics.json").read_text())
    assert (out / "timeline.html").stat().st_size > 10_000
    # a second run never overwrites the first
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--out", str(out)]) == 0
    assert (tmp_path / "sim-2" / "timeline.csv").exists()
    assert len(pd.read_csv(out / "timeline.csv")) == len(tl)


@pytest.mark.slow
def test_models_lists_zoo(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    for name in ("vgg16", "resnet50", "alexnet", "gnmt", "awd-lstm", "gpt", "digits"):
        assert name in text


def test_simulate_alltoall_overlap_of_dualpipev_pairs(tmp_path):
    """--alltoall charges every forward/backward an in-op all-to-all; DualPipeV's pairs hide it unless
    --no-overlap-pairs (metrics.json: the exposed all-to-all per worker; the back-to-back run is longer)."""
    import json

    spans = {}
    for flag in ([], ["--no-overlap-pairs"]):
        out = tmp_path / ("b2b" if flag else "paired")
        assert (
            main(
                [
                    "simulate",
                    "--schedule",
                    "dualpipev",
                    "--stages",
                    "8",
                    "--microbatches",
                    "16",
                    "--alltoall",
                    "1",
                    *flag,
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        m = json.loads((out / "metrics.json").read_text())
        spans[bool(flag)] = (m["makespan"], m["alltoall_exposed"])
    assert spans[True][1] == [64.0] * 4  # 2 stages x 16 microbatches x (F + B), each waits 1
    assert max(spans[False][1]) < 64.0 and spans[False][0] < spans[True][0]


# ---- every simulate / partition flag reaches its model or is refused ------------------------------
def _written(capsys, argv, out, read):
    """(exit status, ``read(out)`` or the error line) of `workbench argv --out out`."""
    rc = main([*argv, "--out", str(out)])
    cap = capsys.readouterr()
    return (rc, cap.err.strip()) if rc else (rc, read(out))


def _metrics(tmp_path, capsys, argv):
    """(exit status, metrics.json or the error line) of `workbench simulate argv`."""
    import json

    out = tmp_path / f"sim{len(list(tmp_path.iterdir()))}"
    return _written(capsys, ["simulate", *argv], out, lambda o: json.loads((o / "metrics.json").read_text()))


@pytest.fixture(scope="module")
def sim_inputs(tmp_path_factory):
    """A shipped PipeDream profile and a plan for 4 workers, as files."""
    from workbench import Topology, partition
    from workbench.profiling.pipedream import shipped

    d = tmp_path_factory.mktemp("siminputs")
    prof = shipped("vgg16")
    prof.save(d / "p.csv")
    partition(prof, Topology.flat(4, 10e9), straight=True, refine=False).save(d / "plan.json")
    return d / "p.csv", d / "plan.json"


UNIT = ["--microbatches", "12"]


@pytest.mark.parametrize(
    "flag",
    [
        ["--schedule", "gpipe"],
        ["--microbatches", "20"],
        ["--stages", "3"],
        ["--fwd", "2"],
        ["--bwd", "3"],
        ["--latency-ms", "0.5"],
        ["--op-overhead-ms", "5"],
        ["--schedule-option", "weights=vertical-sync"],
    ],
)
def test_simulate_unit_cost_flag_changes_the_result(tmp_path, capsys, flag):
    rc0, base = _metrics(tmp_path, capsys, UNIT)
    rc1, other = _metrics(tmp_path, capsys, [*UNIT, *flag])
    assert rc0 == rc1 == 0 and _figures(other) != _figures(base), flag


def _figures(m: dict) -> tuple:
    return m["makespan"], m["time_per_minibatch_ms"], m["peak_activations"], m["weight_versions"]


def test_simulate_unit_costs_op_overhead_matches_the_api(tmp_path, capsys):
    """The issue's case: `--op-overhead-ms 5` with unit costs gives what the Python API gives."""
    from workbench import schedules, simulate

    _, m = _metrics(tmp_path, capsys, ["--microbatches", "16", "--op-overhead-ms", "5"])
    assert m["makespan"] == simulate(schedules.build("pipedream", 4, 16), op_overhead_ms=5).makespan


@pytest.mark.parametrize("value", ["nan", "-5"])
@pytest.mark.parametrize("flag", ["--latency-ms", "--op-overhead-ms"])
def test_simulate_bad_fixed_cost_is_refused(tmp_path, capsys, flag, value):
    rc, err = _metrics(tmp_path, capsys, [*UNIT, flag, value])
    assert rc == 2 and "must be a finite number >= 0" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag", [["--workers", "4"], ["--bandwidth", "1e6"], ["--topology", "4x1e6"]])
def test_simulate_topology_flags_without_profile_are_refused(tmp_path, capsys, flag):
    rc, err = _metrics(tmp_path, capsys, [*UNIT, *flag])
    assert rc == 2 and "would be ignored: unit costs (no --profile) have no topology" in err


@pytest.mark.parametrize(
    "flag",
    [
        ["--bandwidth", "1e8"],
        ["--topology", "2x10e9,2x1e8"],
        ["--latency-ms", "1"],
        ["--op-overhead-ms", "1"],
        ["--workers", "4", "--bandwidth", "1e8"],
    ],
)
def test_simulate_profile_cost_flag_changes_the_result(tmp_path, capsys, sim_inputs, flag):
    prof, plan = sim_inputs
    base_argv = ["--profile", str(prof), "--plan", str(plan), "--microbatches", "24"]
    rc0, base = _metrics(tmp_path, capsys, base_argv)
    rc1, other = _metrics(tmp_path, capsys, [*base_argv, *flag])
    assert rc0 == rc1 == 0 and _figures(other) != _figures(base), flag


@pytest.mark.parametrize(
    "flag, words",
    [
        (["--fwd", "2"], "--fwd would be ignored"),
        (["--bwd", "2"], "--bwd would be ignored"),
        (["--stages", "2"], "--stages would be ignored: the plan gives the stages"),
        (["--topology", "4x1e9", "--workers", "4"], "--workers would be ignored"),
    ],
)
def test_simulate_profile_cost_ignored_flags_are_refused(tmp_path, capsys, sim_inputs, flag, words):
    prof, plan = sim_inputs
    rc, err = _metrics(tmp_path, capsys, ["--profile", str(prof), "--plan", str(plan), *flag])
    assert rc == 2 and words in err and len(err.splitlines()) == 1


def test_simulate_without_steady_state_says_so(tmp_path, capsys, sim_inputs):
    """4 microbatches of a 4-worker PipeDream plan are warm-up and drain only: no steady-state figure."""
    prof, plan = sim_inputs
    rc = main(
        ["simulate", "--profile", str(prof), "--plan", str(plan), "--microbatches", "4", "--out", str(tmp_path / "s")]
    )
    text = capsys.readouterr().out
    assert rc == 0 and "no steady state simulated (4 microbatches are all warm-up or drain" in text
    import json

    m = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert m["time_per_minibatch_ms"] is None and m["steady_state"] is False and m["no_steady_state_reason"]


def _plan_of(tmp_path, capsys, argv):
    """(exit status, plan dict or the error line) of `workbench partition argv`."""
    import json

    def read(out):
        d = json.loads(out.read_text())
        return {k: d[k] for k in ("stages", "predicted_ms", "simulated_ms", "bottleneck_ms")}

    return _written(capsys, ["partition", *argv], tmp_path / f"plan{len(list(tmp_path.iterdir()))}.json", read)


@pytest.fixture(scope="module")
def part_profile(tmp_path_factory):
    """12 layers; the last two pass 1 GB on (a cut there is costly) and the first has 1 GB of weights."""
    import pandas as pd

    from workbench.profiling.measure import Profile

    n = 12
    df = pd.DataFrame(
        dict(
            name=[f"l{i}" for i in range(n)],
            fwd_ms=[1.0 + (i % 3) for i in range(n)],
            bwd_ms=[2.0 + (i % 2) for i in range(n)],
            act_bytes=[1e6] * (n - 2) + [1e9, 1e9],
            param_bytes=[1e9] + [1e6] * (n - 1),
        )
    )
    return Profile(df, {"batch_size": 8}).save(tmp_path_factory.mktemp("part") / "p.json")


@pytest.mark.parametrize(
    "flag",
    [
        ["--workers", "2"],
        ["--bandwidth", "1e8"],
        ["--topology", "2x10e9,2x1e8"],
        ["--straight"],
        ["--memory-gb", "2"],
        ["--latency-ms", "1"],
        ["--op-overhead-ms", "1"],
        ["--no-refine"],
    ],
)
def test_partition_flag_changes_the_plan(tmp_path, capsys, part_profile, flag):
    rc0, base = _plan_of(tmp_path, capsys, ["--profile", str(part_profile)])
    rc1, other = _plan_of(tmp_path, capsys, ["--profile", str(part_profile), *flag])
    assert rc0 == rc1 == 0 and other != base, flag


def test_partition_fewer_workers_changes_the_plan(tmp_path, capsys):
    """Two layers with a 10 GB activation between them on 1 MB/s links: one worker is best."""
    import pandas as pd

    from workbench.profiling.measure import Profile

    df = pd.DataFrame(
        dict(name=["a", "b"], fwd_ms=[1.0, 1.0], bwd_ms=[1.0, 1.0], act_bytes=[1e10, 1.0], param_bytes=[1.0, 1.0])
    )
    prof = Profile(df).save(tmp_path / "two.json")
    argv = ["--profile", str(prof), "--workers", "2", "--bandwidth", "1e6", "--straight"]
    rc0, base = _plan_of(tmp_path, capsys, argv)
    rc1, other = _plan_of(tmp_path, capsys, [*argv, "--fewer-workers"])
    assert rc0 == rc1 == 0 and len(other["stages"]) == 1 and other != base


@pytest.mark.parametrize(
    "flag, words",
    [
        (["--model", "mlp"], "--model would be ignored"),
        (["--size", "paper"], "--size would be ignored"),
        (["--batch-size", "8"], "--batch-size would be ignored"),
        (["--topology", "2x1e9", "--workers", "2"], "--workers would be ignored"),
        (["--topology", "2x1e9", "--bandwidth", "1e9"], "--bandwidth would be ignored"),
    ],
)
def test_partition_ignored_flags_are_refused(tmp_path, capsys, part_profile, flag, words):
    rc, err = _plan_of(tmp_path, capsys, ["--profile", str(part_profile), *flag])
    assert rc == 2 and words in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_partition_without_profile_uses_model_size_and_batch(tmp_path, capsys):
    """--model / --size / --batch-size choose what is measured when no --profile is given."""
    rc = main(["partition", "--model", "mlp", "--batch-size", "4", "--workers", "2", "--no-refine"])
    assert rc == 0 and "profile: 8 layers (measured" in capsys.readouterr().out


# ---- startup time -----------------------------------------------------------------------------
@pytest.mark.slow
def test_help_imports_neither_torch_nor_pandas():
    """`workbench --help` builds its parser without torch or pandas (measured: 1.9 s with them, about
    0.1 s without on this 2-core machine when quiet); a subprocess, so that nothing is imported yet."""
    code = (
        "import sys\nfrom workbench.cli.commands import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_train_help_still_lists_the_train_options():
    r = run_cli("train", "--help")
    assert r.returncode == 0 and "--microbatches" in r.stdout and "--transport" in r.stdout


def test_help_names_every_command(capsys):
    from workbench.cli.commands import build_parser

    ap = build_parser(train_arguments=False)
    commands = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert all(name in ap.description for name in commands), ap.description
