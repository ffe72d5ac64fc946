"""What each ``workbench`` subcommand does (:mod:`workbench.cli.commands` builds the parser and
imports this module only when a command runs, so that ``workbench --help`` stays light)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from workbench import models, schedules
from workbench.cli.args import FLAT_BANDWIDTH, FLAT_WORKERS
from workbench.cli.train import run_train
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.io.folders import check_writable, fresh_path, run_folder, run_id
from workbench.models import list_models
from workbench.models.data import dataset_info, load_dataset
from workbench.partitioning.baselines import partition_balanced_time, partition_equal_layers
from workbench.partitioning.compare import compare_costs
from workbench.partitioning.inputs import MAX_WORKERS
from workbench.partitioning.pipedream_optimizer import Settings
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile, profile, project, threads_per_rank
from workbench.profiling.pipedream import SHIPPED, shipped
from workbench.runtime.launch.job import as_dataset, as_layer_model
from workbench.simulation import plan_topology, simulate, simulate_plan, steady_microbatches
from workbench.simulation.costed_build import build_for_simulation
from workbench.viz.files import save_simulation


class UsageError(ValueError):
    pass


def parse_topology(text: str):
    """``"4x10e9,4x1.25e9"`` -> Topology levels [(4, 10e9), (4, 1.25e9)] (innermost first), or a
    preset name (``Topology.presets()``), optionally with ``:SERVERS`` (e.g. ``4xV100-pcie-10g:4``)."""

    name, _, servers = text.partition(":")
    if name in Topology.presets():
        if servers and not servers.isdigit():
            raise UsageError(
                f"bad --topology {text!r}: write PRESET:SERVERS with a whole number of servers (e.g. {name}:4)"
            )
        return Topology.preset(name, servers=int(servers) if servers else 1)
    levels: list[tuple[int, float]] = []
    for part in text.split(","):
        try:
            count, bw = part.lower().split("x")
            levels.append((int(count), float(bw)))
        except ValueError:
            raise UsageError(
                f"bad --topology {part!r}: write COUNTxBANDWIDTH levels, innermost first (e.g. "
                f"8x10e9,4x3.1e9; bandwidth in bytes/s) or a preset name[:servers] from "
                f"{sorted(Topology.presets())}"
            ) from None
    return Topology(levels=tuple(levels))


def _topology_from_args(args):

    if args.topology:
        _refuse_unused(args, ("workers", "bandwidth"), "--topology gives the workers and bandwidths")
        return parse_topology(args.topology)
    return Topology.flat(
        FLAT_WORKERS if args.workers is None else args.workers,
        FLAT_BANDWIDTH if args.bandwidth is None else args.bandwidth,
    )


def _refuse_unused(args, names, because: str) -> None:
    """A flag the command would ignore is refused (a user who gives it expects it to matter)."""
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) not in (None, False)]
    if given:
        raise UsageError(
            f"{' and '.join(given)} would be ignored: {because}; drop {'them' if len(given) > 1 else 'it'}"
        )


def _load_profile(args):

    return Profile.load(args.profile)


# ---- subcommands ----------------------------------------------------------------------------
def cmd_models(args) -> int:

    with pd.option_context("display.width", 160, "display.max_colwidth", 60):
        print(list_models().to_string(index=False))
        print()
        print(dataset_info().to_string(index=False))
    return 0


def cmd_profile(args) -> int:

    if args.pipedream or args.gpu:
        _refuse_unused(
            args,
            ("threads", "workers"),
            "they set up a measurement, and --gpu/--pipedream give modeled or published times",
        )
    if args.pipedream:
        prof = _pipedream_profile(args.pipedream)
    elif ":" in args.model:  # a user's model: package.module:function
        model, x = _user_model_and_input(args)
        prof = (
            project(model, args.gpu, example_input=x)
            if args.gpu
            else profile(
                model,
                x,
                iterations=args.iterations,
                warmup=args.warmup,
                device=args.device,
                threads=_profile_threads(args),
            )
        )
    elif args.gpu:
        model = models.build(args.model, size=args.size, device="meta")
        prof = project(model, args.gpu, batch_size=args.batch_size)
    else:
        model = models.build(args.model, size=args.size, seed=args.seed)
        prof = profile(
            model,
            batch_size=args.batch_size,
            iterations=args.iterations,
            warmup=args.warmup,
            device=args.device,
            threads=_profile_threads(args),
        )
    out = _fresh_file(Path(args.out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp{out.suffix}")
    prof.save(tmp)
    tmp.rename(out)
    if Path(str(tmp) + ".meta.json").exists():
        Path(str(tmp) + ".meta.json").rename(str(out) + ".meta.json")
    print(prof.summary())
    print(f"wrote {out}")
    return 0


def _profile_threads(args) -> int:
    """``--threads``, else what each of ``--workers`` CPU ranks on this machine will get."""

    if args.threads is not None and args.workers is not None:
        raise UsageError("give --threads or --workers (which sets the threads each rank gets), not both")
    return args.threads if args.threads is not None else threads_per_rank(1 if args.workers is None else args.workers)


def _pipedream_profile(name_or_path: str):
    """A shipped PipeDream profile by name (see pipedream_graph.SHIPPED) or a graph.txt path."""

    if name_or_path in SHIPPED:
        return shipped(name_or_path)
    if not Path(name_or_path).exists():
        raise UsageError(
            f"--pipedream {name_or_path!r} is neither a shipped profile ({', '.join(SHIPPED)}) "
            "nor an existing graph.txt"
        )
    return Profile.from_pipedream(name_or_path)


def _user_model_and_input(args):
    """``--model package.module:function`` traced into layers, and ``--batch-size`` samples of ``--dataset``."""

    if not args.dataset:
        raise UsageError(
            "a user model (--model package.module:function) needs --dataset (a built-in name, see "
            "`workbench models`, or package.module:function returning a TensorDataset) for its input"
        )
    ds = load_dataset(args.dataset, "train") if ":" not in args.dataset else as_dataset(args.dataset)[0]
    if args.batch_size < 1 or args.batch_size > len(ds):
        raise UsageError(f"--batch-size must be in 1..{len(ds)} (the data set's size), got {args.batch_size}")
    model = as_layer_model(args.model, ds, args.seed)
    *xs, _ = ds.tensors
    xs = tuple(x[: args.batch_size] for x in xs)
    return model, xs[0] if len(xs) == 1 else xs


def _fresh_file(path: Path) -> Path:
    """``path`` if free, else ``stem-2.ext``, ``stem-3.ext``, ...: an existing result is never overwritten."""
    base, k = path, 2
    while path.exists():
        path = base.with_name(f"{base.stem}-{k}{base.suffix}")
        k += 1
    return path


#: Above this many workers refinement (the plan simulated) takes minutes: 0.5 s on 64 flat workers,
#: 9 s on 256 and 161 s on 512 for a 100-layer profile (results/bench/partition_workers.csv,
#: ``benchmarks/bench_partition.py --flat``); the dynamic program alone takes 4 s on 1024.
REFINE_NOTE_WORKERS = 256


def _plan_for(args, prof, topo, mem):
    """The plan of the chosen cost model, and with ``--compare-costs`` both models' comparison."""

    if not args.no_refine and args.cost != "pipedream" and REFINE_NOTE_WORKERS < topo.num_workers <= MAX_WORKERS:
        print(
            f"note: refining a plan on {topo.num_workers} workers simulates it and can take minutes "
            f"(512 flat workers: about 3 min here); --no-refine gives the dynamic program's plan in seconds",
            file=sys.stderr,
            flush=True,
        )
    common = dict(straight=args.straight, memory_bytes=mem, use_fewer_workers=args.fewer_workers)
    if args.cost == "pipedream" or args.compare_costs:
        ratio = None if args.activation_compression_ratio == 0 else args.activation_compression_ratio
        pd_settings = Settings(activation_compression_ratio=ratio, over=args.over)
    if args.compare_costs:
        comparison = compare_costs(prof, topo, pipedream=pd_settings, refine=not args.no_refine, **common)
        return comparison.plans[args.cost], comparison
    if args.cost == "pipedream":
        return partition(prof, topo, cost="pipedream", pipedream=pd_settings, **common), None
    fixed = dict(latency_ms=args.latency_ms, op_overhead_ms=args.op_overhead_ms)
    return partition(prof, topo, refine=not args.no_refine, **fixed, **common), None


def cmd_partition(args) -> int:

    if args.profile:
        _refuse_unused(
            args, ("model", "size", "batch_size"), "they choose the model to profile, and --profile is given"
        )
        prof = _load_profile(args)
    else:
        prof = _quick_profile(
            args.model or "vgg16", args.size or "mini", 32 if args.batch_size is None else args.batch_size
        )
    topo = _topology_from_args(args)
    mem = args.memory_gb * 2**30 if args.memory_gb else None
    plan, comparison = _plan_for(args, prof, topo, mem)
    label = prof.meta.get("kind", "kind not recorded")
    where = prof.meta.get("device") or prof.meta.get("source")
    print(f"profile: {len(prof)} layers ({label}{', ' + str(where) if where else ''})")
    if prof.trust_note():
        print(prof.trust_note())
    print(f"topology: {topo.describe() if hasattr(topo, 'describe') else topo}")
    print(plan.describe())
    if comparison is not None:
        print(comparison.describe())
    k = min(topo.num_workers, len(prof))
    if k > 1 and args.cost == "workbench":
        for name, fn in (("equal layers", partition_equal_layers), ("balanced time", partition_balanced_time)):
            base = fn(prof, k, topology=topo)
            print(
                f"baseline {name:>13} ({k} straight stages): {base.predicted_ms:.3f} ms/minibatch "
                f"(cost model), x{base.predicted_ms / plan.predicted_ms:.2f} the plan's prediction"
            )
    if args.out:
        out = fresh_path(args.out)  # never overwrite an earlier plan
        out.parent.mkdir(parents=True, exist_ok=True)
        plan.save(out)
        print(f"wrote {out}")
    return 0


def cmd_simulate(args) -> int:

    check_writable(args.out)  # a folder it cannot write fails now, not after the result is printed
    plan = Plan.load(args.plan) if args.plan else None
    if plan is not None:
        _refuse_unused(args, ("stages",), "the plan gives the stages")
    opts = dict(args.schedule_options)
    if plan is not None and plan.in_flight and any(o.name == "warmup" for o in schedules.spec(args.schedule).options):
        opts.setdefault("warmup", list(plan.in_flight))  # the plan's communication-aware in-flight count
    kw, topology = _simulation_costs(args, plan)
    # master schedules are ordered by the greedy rule with the durations simulated below
    if args.alltoall is not None:
        kw.update(alltoall=args.alltoall, overlap_pairs=not args.no_overlap_pairs)
    stages = 4 if args.stages is None else args.stages
    sched = build_for_simulation(args.schedule, plan or stages, args.microbatches, kw, **opts)
    if topology is not None and topology.num_workers != sched.num_workers:
        raise UsageError(
            f"schedule {sched.name} uses {sched.num_workers} workers but the topology has "
            f"{topology.num_workers}; give a topology of {sched.num_workers} workers "
            f"(--workers {sched.num_workers}) or a schedule for {topology.num_workers}"
        )
    res = simulate(sched, **kw)
    print(res.summary())
    if plan is not None and args.profile and plan.predicted_ms == plan.predicted_ms:
        sim = (
            f"simulated {res.time_per_minibatch_ms:.4g} ms/minibatch"
            if res.metrics["steady_state"]
            else f"no steady state simulated ({res.metrics['no_steady_state_reason']})"
        )
        print(
            f"plan: predicted {plan.predicted_ms:.4g} ms/minibatch (cost model) vs {sim} here "
            f"({args.schedule}, {args.microbatches} microbatches)"
        )
    print(f"wrote {save_simulation(res, args.out)}")
    return 0


def _simulation_costs(args, plan) -> tuple[dict, Topology | None]:
    """``simulate()`` keywords for the costs the flags name, and the topology (None for unit costs);
    a flag the chosen cost mode would ignore is refused."""

    fixed = dict(latency_ms=args.latency_ms, op_overhead_ms=args.op_overhead_ms)
    if not args.profile:
        _refuse_unused(args, ("workers", "bandwidth", "topology"), "unit costs (no --profile) have no topology")
        return dict(fwd=1.0 if args.fwd is None else args.fwd, bwd=2.0 if args.bwd is None else args.bwd, **fixed), None
    _refuse_unused(args, ("fwd", "bwd"), "with --profile the costs come from the profile")
    if plan is None:
        raise UsageError("--profile needs --plan (which layers form each stage)")
    if args.topology:
        _refuse_unused(args, ("workers", "bandwidth"), "--topology gives the workers and bandwidths")
        topology, where = parse_topology(args.topology), "--topology"
    elif args.workers is not None or args.bandwidth is not None or plan_topology(plan) is None:
        bandwidth = FLAT_BANDWIDTH if args.bandwidth is None else args.bandwidth
        workers = plan.num_workers if args.workers is None else args.workers
        topology, where = Topology.flat(workers, bandwidth), "flat --workers/--bandwidth"
    else:
        topology, where = plan_topology(plan), "the plan's"
    print(f"topology ({where}): {topology.describe()}")
    return dict(profile=_load_profile(args), plan=plan, topology=topology, **fixed), topology


def cmd_schedules(args) -> int:

    if args.markdown:
        print(schedules.markdown_table())
        return 0
    for sp in schedules.REGISTRY.values():
        opts = ", ".join(f"{o.name}={o.default!r}" for o in sp.options) or "no options"
        print(f"{sp.name:<17} {sp.description}\n{'':<17} options: {opts}; source: {sp.source}")
    return 0


def cmd_train(args) -> int:

    return run_train(args)


def _quick_profile(model_name, size, batch_size):

    return profile(models.build(model_name, size=size), batch_size=batch_size, iterations=5, warmup=2)


def cmd_quickstart(args) -> int:
    """Profile a built-in mini model on this CPU and partition it for a flat cluster; then take the
    paper-size model's modeled V100 profile, partition it for PipeDream's Cluster-A (4 servers x 4
    V100) and simulate PipeDream's 1F1B schedule on that plan. Everything lands in a new run folder."""

    with run_folder(Path(args.out) / run_id("quickstart")) as tmp:
        model = models.build(args.model, size="mini", seed=0)
        prof = profile(model, batch_size=args.batch_size, iterations=5, warmup=2)
        prof.save(tmp / "profile_measured.csv")
        topo = Topology.flat(args.workers, 10e9)
        plan = partition(prof, topo)
        plan.save(tmp / "plan_measured.json")
        print(
            f"== {args.model} (mini): profile MEASURED on {prof.meta['device']}, batch {args.batch_size}; "
            f"plan MODELED for {topo.describe()}"
        )
        if prof.trust_note():
            print(prof.trust_note())
        print(plan.describe())

        paper = project(models.build(args.model, size="paper", device="meta"), "V100", batch_size=64)
        paper.save(tmp / "profile_modeled_V100.csv")
        cluster = Topology.preset("4xV100-pcie-10g", servers=4)
        plan2 = partition(paper, cluster)
        plan2.save(tmp / "plan_modeled_V100.json")
        print(
            f"\n== {args.model} (paper size): profile MODELED for V100 (roofline from FLOPs/bytes, batch 64); "
            f"plan MODELED for {cluster.describe()}"
        )
        print(plan2.describe())

        microbatches = max(args.microbatches, steady_microbatches(plan2))
        res = simulate_plan(plan2, paper, cluster, microbatches=microbatches)
        save_simulation(res, tmp / "simulation")
        print(
            f"\n== PipeDream 1F1B on that plan ({plan2.in_flight_count} minibatches in flight at the input stage, "
            f"{microbatches} minibatches): {res.label}"
        )
        print(res.summary())
        print(
            f"plan predicted {plan2.predicted_ms:.4g} ms/minibatch; simulated steady state "
            f"{res.time_per_minibatch_ms:.4g} ms/minibatch (warm-up and drain excluded; makespan / minibatches "
            f"= {res.makespan / res.metrics['minibatches']:.4g} ms includes them)"
        )
    print(f"\nwrote {tmp.final} (profiles, plans, simulation/timeline.html)")
    return 0


# ---- parser ---------------------------------------------------------------------------------
