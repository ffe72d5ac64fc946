"""``workbench train``: the command-line face of :func:`workbench.runtime.train`.

Exit status 0 on success, 2 on bad input (one line on stderr), 1 when a rank fails at run time,
128 + the signal's number when a stop signal ends the job (SIGINT 130, SIGTERM 143, SIGHUP 129; one
line naming it: :mod:`workbench.runtime.lifetime`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

from workbench.cli.args import add_schedule_arguments


def _kv(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    from workbench.runtime.shm import TRAIN_TRANSPORTS

    p.add_argument(
        "--model",
        default="mlp",
        help="zoo model name (or toy-mlp), or package.module:function returning "
        "an nn.Module (traced into layers by workbench.profiling.layering.split)",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="built-in data set name (`workbench models`) or package.module:function "
        "returning a TensorDataset or a (train, test) pair; default: the zoo model's own",
    )
    add_schedule_arguments(p, _kv)
    p.add_argument(
        "--weights",
        choices=["stash", "vertical-sync", "no-stash"],
        default=None,
        help="PipeDream weight rule (schedule pipedream only)",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4, help="microbatches per minibatch (one pass of the schedule)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--epochs", type=int, default=1)
    g.add_argument("--steps", type=int, default=None, help="minibatches to train (overrides --epochs)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (heavy ball, no dampening)")
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation at each epoch end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", default=None, help="plan JSON written by `workbench partition` (default: even split)")
    p.add_argument("--out", default=None, help="run folder (default: results/train/<model>-<schedule>-w<N>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in --out")
    p.add_argument("--fail-rank", type=int, default=None, help="fault injection: this rank raises ...")
    p.add_argument("--fail-at-step", type=int, default=None, help="... at the start of this step")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when every rank gets its own GPU)")
    p.add_argument("--backend", default=None, help="gloo or nccl (default from the device)")
    p.add_argument(
        "--transport",
        choices=TRAIN_TRANSPORTS,
        default="auto",
        help="activations and gradients through torch.distributed (gloo) or through shared memory "
        "(shm: CPU ranks on this machine, pipeline schedules); auto (default): shm where it can run "
        "with a core per rank, else gloo",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="schedules without a flush (pipedream, pipedream-2bw, model-parallel): the epoch's minibatches "
        "flow through the pipeline as one stream, drained at the epoch end only",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take before the job fails")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch threads per worker")
    p.add_argument("--allow-oversubscribe", action="store_true", help="allow more workers than cores/GPUs")
    p.add_argument("--dtype", default=None, help="e.g. float64")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--model-option",
        type=_kv,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model override, e.g. depth=4 (repeatable)",
    )


def run_train(args) -> int:
    from workbench.cost.plan import Plan
    from workbench.runtime.launch import train
    from workbench.runtime.lifetime import JobStopped

    try:
        plan = Plan.load(args.plan) if args.plan else None
        sopts = dict(args.schedule_option)
        if args.weights:
            sopts["weights"] = args.weights
        summary = train(
            model=args.model,
            schedule=args.schedule,
            workers=args.workers,
            microbatches=args.microbatches,
            steps=args.steps,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            out=args.out,
            plan=plan,
            device=args.device,
            backend=args.backend,
            resume=args.resume,
            fail_rank=args.fail_rank,
            fail_at_step=args.fail_at_step,
            timeout_s=args.timeout,
            port=args.port,
            threads=args.threads,
            allow_oversubscribe=args.allow_oversubscribe,
            dtype=args.dtype,
            progress=not args.no_progress,
            schedule_options=sopts,
            momentum=args.momentum,
            evaluate=not args.no_eval,
            dataset=args.dataset,
            transport=args.transport,
            stream=args.stream,
            **dict(args.model_option),
        )
    except ValueError as e:
        print(f"workbench train: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"workbench train: failed: {e}", file=sys.stderr)
        return 1
    except JobStopped as e:  # the ranks are stopped and the job's files removed: nothing is left to tear down
        print(f"workbench train: {e}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + e.signum)  # not the interpreter's teardown, which took 2.5 s with torch loaded at load 15
    if "schedule" not in summary:  # a non-zero rank under torchrun: rank 0 reports the run
        return 0
    _draw_timeline(summary)
    test = summary.get("final_test_accuracy")
    print(
        f"{summary['schedule']}: {summary['steps']} steps in {summary['wall_s']:.1f} s, "
        f"{summary['samples_per_s_steady'] or summary['samples_per_s']:.0f} samples/s (steady), "
        f"final loss {summary['final_loss']:.4f}, train accuracy {summary['final_accuracy']:.3f}"
        + (f", test accuracy {test:.3f}" if test is not None else "")
        + f"; wrote {summary['out']}"
    )
    return 0


def _draw_timeline(summary: dict) -> None:
    """timeline.html and trace.json beside the measured timeline.csv (last steps only when the run is long)."""

    import pandas as pd

    from workbench.viz.plot import save_html, timeline_figure

    out = Path(summary["out"])
    if not (out / "timeline.csv").exists():
        return
    tl = pd.read_csv(out / "timeline.csv")
    if "step" in tl and tl["step"].nunique() > 4:
        tl = tl[tl["step"] >= tl["step"].max() - 3]
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
