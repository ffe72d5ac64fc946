"""The ``workbench`` command: models, profile, partition, simulate, schedules, train, quickstart, reproduce.

``reproduce`` comes from the reproduction beside the notebooks (``repro``), like any sub-command that
an installed package adds: an entry point of group ``workbench.commands`` (:func:`add_plugin_commands`).

Every subcommand writes files (CSV/JSON/HTML) and prints a readable table. Bad input prints one
line on stderr and exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import warnings
from typing import TYPE_CHECKING

from workbench.cli.args import FLAT_BANDWIDTH, FLAT_WORKERS, add_schedule_arguments
from workbench.cli.train import add_train_arguments

if TYPE_CHECKING:
    pass


def _schedule_option(text: str):
    from workbench.schedules.registry import parse_option

    try:
        return parse_option(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_topology(p):
    p.add_argument("--workers", type=int, default=None, help=f"workers of a flat topology (default {FLAT_WORKERS})")
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help=f"bytes/s between workers of a flat topology (default {FLAT_BANDWIDTH:.3g})",
    )
    p.add_argument(
        "--topology", help="hierarchical levels COUNTxBW,... innermost first (e.g. 4x10e9,4x1.25e9) or a preset name"
    )


def _add_fixed_costs(p):
    p.add_argument("--latency-ms", type=float, default=0.0, help="latency per message between workers (ms)")
    p.add_argument("--op-overhead-ms", type=float, default=0.0, help="fixed cost per compute op (ms)")


def _add_profile_command(sub) -> None:
    """``workbench profile``: measure, model (--gpu) or import (--pipedream) a per-layer profile."""
    p = sub.add_parser("profile", help="per-layer fwd/bwd ms, activation and parameter bytes, FLOPs")
    p.add_argument(
        "--model",
        default="vgg16",
        help="zoo name, or package.module:function returning an nn.Module "
        "(traced into layers by workbench.profiling.layering.split; needs --dataset)",
    )
    p.add_argument("--size", default="mini", choices=["mini", "paper"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads while measuring (default: what each of --workers CPU ranks gets, cores // workers)",
    )
    p.add_argument("--workers", type=int, default=None, help="CPU ranks the profile is for (default 1: all cores)")
    p.add_argument("--gpu", help="write a MODELED profile for this GPU (V100, 1080Ti, A100, H100) instead of measuring")
    p.add_argument(
        "--pipedream",
        help="import PipeDream's published profile: a shipped name (vgg16, resnet50, alexnet, inception_v3, gnmt, gnmt_large) or a graph.txt path",
    )
    p.add_argument(
        "--dataset",
        help="input samples for a user model (--model package.module:function): a built-in "
        "data set name or package.module:function returning a TensorDataset",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/profile.csv", help="output .csv or .json")
    p.set_defaults(fn="cmd_profile")


def _add_partition_command(sub) -> None:
    """``workbench partition``: the options of the dynamic program and of its two cost models."""
    p = sub.add_parser("partition", help="PipeDream's dynamic program: stages, replicas, NOAM")
    p.add_argument("--profile", help="profile CSV/JSON or PipeDream graph.txt (default: profile --model now)")
    p.add_argument("--model", default=None, help="zoo model measured here when no --profile is given (default vgg16)")
    p.add_argument("--size", default=None, choices=["mini", "paper"], help="model size (default mini)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size of that measurement (default 32)")
    _add_topology(p)
    p.add_argument("--straight", action="store_true", help="no stage replication")
    p.add_argument("--memory-gb", type=float, help="memory limit per worker (GiB)")
    p.add_argument("--fewer-workers", action="store_true", help="allow using fewer than all workers")
    _add_fixed_costs(p)
    p.add_argument("--no-refine", action="store_true", help="DP and closed form only (no simulation of the plan)")
    p.add_argument(
        "--cost",
        choices=["workbench", "pipedream"],
        default="workbench",
        help="cost model: the workbench's (default) or PipeDream's optimizer and formulas exactly",
    )
    p.add_argument(
        "--compare-costs",
        action="store_true",
        help="also show both models' choices side by side, each priced under both",
    )
    p.add_argument(
        "--activation-compression-ratio",
        type=float,
        default=1.0,
        help="--cost pipedream: cut terms divided by this ratio (0: cuts are free, PipeDream's default)",
    )
    p.add_argument(
        "--over",
        choices=["antichains", "layers"],
        default="antichains",
        help="--cost pipedream: states = antichains of a graph.txt DAG, or the profile's layer order",
    )
    p.add_argument("--out", help="write the plan JSON here (a new file: an existing one gets a -2, -3 ... suffix)")
    p.set_defaults(fn="cmd_partition")


def _add_simulate_command(sub) -> None:
    """``workbench simulate``: the schedule, its costs (unit or from a profile and a topology) and the outputs."""
    p = sub.add_parser("simulate", help="discrete-event simulation of a schedule -> timeline CSV, metrics JSON, HTML")
    add_schedule_arguments(p, _schedule_option)
    p.add_argument("--microbatches", type=int, default=16)
    p.add_argument("--plan", help="plan JSON (from `workbench partition --out`)")
    p.add_argument(
        "--stages", type=int, default=None, help="stages when no --plan is given (one worker each; default 4)"
    )
    p.add_argument("--profile", help="profile for modeled costs (needs --plan); without it unit costs are used")
    p.add_argument("--fwd", type=float, default=None, help="unit forward cost (unit costs only; default 1)")
    p.add_argument("--bwd", type=float, default=None, help="unit backward cost (unit costs only; default 2)")
    p.add_argument("--workers", type=int, default=None, help="flat topology size (default: the plan's workers)")
    p.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help=f"bytes/s of a flat topology (default {FLAT_BANDWIDTH:.3g}; profile costs only)",
    )
    p.add_argument(
        "--topology",
        help="levels COUNTxBW,... innermost first, or a preset[:servers] (default: the topology stored in the plan)",
    )
    _add_fixed_costs(p)
    p.add_argument(
        "--alltoall",
        type=float,
        default=None,
        help="in-op all-to-all of every forward/backward (expert parallelism), per stage; a schedule's "
        "overlapped F/B pairs (dualpipev) hide each other's",
    )
    p.add_argument(
        "--no-overlap-pairs",
        action="store_true",
        help="charge a schedule's overlapped F/B pairs back to back (with --alltoall)",
    )
    p.add_argument("--out", default="results/simulate")
    p.set_defaults(fn="cmd_simulate")


def build_parser(train_arguments: bool = True) -> argparse.ArgumentParser:
    """The ``workbench`` parser; ``train_arguments=False`` leaves out the options of ``train``, whose
    definitions import torch (``main`` adds them only when the command is ``train``, so that
    ``workbench --help`` and the other commands start without torch)."""
    ap = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the model zoo and the offline data sets")
    p.set_defaults(fn="cmd_models")
    _add_profile_command(sub)
    _add_partition_command(sub)
    _add_simulate_command(sub)

    p = sub.add_parser("schedules", help="list the registered schedules, their options and sources")
    p.add_argument("--markdown", action="store_true", help="print the README's table of schedules")
    p.set_defaults(fn="cmd_schedules")

    p = sub.add_parser("train", help="really train with a schedule (torch.distributed, one process per worker)")
    if train_arguments:
        add_train_arguments(p)
    p.set_defaults(fn="cmd_train")

    p = sub.add_parser(
        "quickstart", help="profile + partition + print a plan for a built-in model (no GPU, no download)"
    )
    p.add_argument("--model", default="vgg16")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=32, help="minibatches in the simulated PipeDream run")
    p.add_argument("--out", default="results/quickstart")
    p.set_defaults(fn="cmd_quickstart")

    add_plugin_commands(sub)
    return ap


#: the entry-point group of sub-commands that other packages add (pyproject.toml)
PLUGIN_GROUP = "workbench.commands"


def add_plugin_commands(sub) -> None:
    """Each entry point of :data:`PLUGIN_GROUP` names a function that adds its sub-command to ``sub``
    (and sets ``fn`` to a callable taking the parsed arguments); one that cannot be loaded is left out
    with a one-line warning on stderr."""
    for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except ImportError as e:
            print(f"workbench: warning: command {ep.name!r} ({ep.value}) not loaded: {e}", file=sys.stderr)


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning on the command line: one line, no source location."""
    return f"workbench: warning: {message}\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(train_arguments=argv[:1] == ["train"]).parse_args(argv)
    warnings.formatwarning = one_line_warning
    try:
        if isinstance(args.fn, str):  # a command of workbench.cli.actions: its imports load only now
            from workbench.cli import actions

            args.fn = getattr(actions, args.fn)
        return args.fn(args) or 0
    except ValueError as e:  # bad input: one line, status 2
        print(
            f"workbench {args.command}: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:  # output piped into a reader that stopped early (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0
    except OSError as e:  # a path that cannot be read or written (missing, a file where a folder goes, ...)
        where = f": {e.filename}" if e.filename else ""
        print(f"workbench {args.command}: error: {e.strerror or e}{where}; check the paths given", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
