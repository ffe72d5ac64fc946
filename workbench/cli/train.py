"""``workbench train``: the command-line face of :func:`workbench.runtime.train`.

Exit status 0 on success, 2 on bad input (one line on stderr), 1 when a rank fails at run time,
128 + the signal's number when a stop signal ends the job (SIGINT 130, SIGTERM 143, SIGHUP 129; one
line naming it: :mod:`workbench.runtime.launch.lifetime`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from workbench.cli.args import add_run_option_arguments
from workbench.runtime.launch.jobspec import cli_fields


def _kv(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per run option (:func:`workbench.cli.args.add_run_option_arguments`), and ``--weights``:
    a shorthand for ``--schedule-option weights=...``."""
    add_run_option_arguments(p, _kv)
    p.add_argument(
        "--weights",
        choices=["stash", "vertical-sync", "no-stash"],
        default=None,
        help="PipeDream weight rule (schedule pipedream only)",
    )


_END_BAR = "\n"  # rank 0's progress bar leaves its line open (it redraws with \r): a stop's cause starts a new one


def run_train(args) -> int:
    from workbench.cost.plan import Plan
    from workbench.runtime.launch.driver import train
    from workbench.runtime.launch.lifetime import JobStopped

    try:
        options = {f.name: getattr(args, f.name) for f, _ in cli_fields()}
        options["plan"] = Plan.load(args.plan) if args.plan else None
        options["model_options"] = dict(args.model_options)
        options["schedule_options"] = dict(args.schedule_options)
        if args.weights:
            options["schedule_options"]["weights"] = args.weights
        summary = train(**options)
    except ValueError as e:
        print(f"workbench train: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"{_END_BAR if args.progress else ''}workbench train: failed: {e}", file=sys.stderr)
        return 1
    except JobStopped as e:  # the ranks are stopped and the job's files removed: nothing is left to tear down
        print(f"{_END_BAR if args.progress else ''}workbench train: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + e.signum)  # not the interpreter's teardown, which took 2.5 s with torch loaded at load 15
    if "schedule" not in summary:  # a non-zero rank under torchrun: rank 0 reports the run
        return 0
    draw_timeline(summary)
    test = summary.get("final_test_accuracy")
    print(
        f"{summary['schedule']}: {_steps_line(summary)}, "
        f"{summary['samples_per_s_steady'] or summary['samples_per_s']:.0f} samples/s (steady), "
        f"final loss {summary['final_loss']:.4f}, train accuracy {summary['final_accuracy']:.3f}"
        + (f", test accuracy {test:.3f}" if test is not None else "")
        + f"; wrote {summary['out']}"
    )
    return 0


def _steps_line(summary: dict) -> str:
    """``154 steps in 3.6 s`` (this invocation's), and where a resumed run started."""
    line = f"{summary.get('steps_trained', summary['steps'])} steps in {summary['wall_s']:.1f} s"
    if summary.get("resumed_at"):
        line += f" (resumed at step {summary['resumed_at']}; {summary['steps']} steps in all)"
    return line


def draw_timeline(summary: dict) -> None:
    """timeline.html and trace.json beside the measured timeline.csv (last steps only when the run is long)."""

    import pandas as pd

    from workbench.viz.plot import save_html, timeline_figure

    out = Path(summary["out"])
    if not (out / "timeline.csv").exists():
        return
    tl = pd.read_csv(out / "timeline.csv")
    if tl["round"].nunique() > 4:
        tl = tl[tl["round"] >= tl["round"].max() - 3]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = timeline_figure(
            tl,
            title=f"{summary['schedule']}: measured on {summary.get('workers')} "
            f"{summary.get('backend', '')} ranks ({summary.get('device', '')}), last steps",
        )
    save_html(fig, out / "timeline.html")
    from workbench.viz.trace import to_chrome_trace  # the same last steps, for Perfetto / chrome://tracing

    to_chrome_trace(tl, out / "trace.json", label=f"{summary['schedule']} (measured), last steps")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="workbench-train", description=__doc__)
    add_train_arguments(p)
    return run_train(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
