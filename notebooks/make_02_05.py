"""Write notebooks 02_dp_communication_overhead and 05_unified_schedules (thin papermill drivers).

    python notebooks/make_02_05.py      # rewrites the two .ipynb files next to this script

Every code cell calls ``repro``; the cell tagged ``parameters`` holds what
``workbench reproduce`` (papermill) overrides.
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent


def md(text):
    return new_markdown_cell(text.strip())


def code(text, tags=()):
    cell = new_code_cell(text.strip())
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


NB02 = [
    md("""
# 02 · Data-parallel communication overhead (PipeDream, SOSP'19, Figure 1) and each claim on its own hardware

Share of data-parallel training time stalled on communication vs number of GPUs (1 to 32, weak
scaling) for AlexNet, VGG-16, ResNet-50, GNMT-8 and GNMT-16 on the paper's three server types.
**Modeled**: per-layer profiles from `workbench.project` (roofline, paper-size zoo models; GNMT-16 is
the zoo's `gnmt`, GNMT-8 the same with 4+4 LSTM layers) and PipeDream's own measured GPU profiles of
the CNNs; the workbench simulator runs `dp-bsp` (ring all-reduce of 25 MiB DDP buckets, each once
its backward has ended, overlapped with the rest of the backward) with every link class's all-reduce
efficiency (at most 1) and step latency from the protocol (`notebooks/repro/data/protocol.toml`,
each with its source; nothing fitted). **Measured**: the same share for small zoo models trained here
with real gloo ranks. Also bytes sent per sample by PipeDream's configurations vs data parallelism (Figure 17),
and the epochs to target of data parallelism at the paper's global batch (measured on a stand-in task).
Logic: `notebooks/repro/dp_overhead.py`.
"""),
    code(
        """
quick = False
out_dir = "results/reproduce/manual/02_dp_communication_overhead"
models = None            # Figure-1 models (None: quick/full default), e.g. ["vgg16", "resnet50"]
servers = None           # server types (None: all three), see dp_overhead.SERVERS
gpu_counts = None        # None: 1, 2, 4, 8, 16, 32
measured_models = None   # zoo models trained for real here (None: quick/full default; [] to skip)
ranks = 2                # gloo CPU ranks of the measured runs
measured_steps = None
epochs_seeds = None     # seeds of the measured epochs ratio (None: seed 0 quick, the protocol's seeds full)
""",
        tags=["parameters"],
    ),
    code("""
import pandas as pd
from repro import common, dp_overhead as dpo

cfg = dpo.settings(quick, models, servers, gpu_counts, measured_models, ranks=ranks, measured_steps=measured_steps)
out = common.out_folder(out_dir)
gpus_needed = sorted({dpo.SERVERS[s] for s in cfg["servers"]} | {"V100"})
cfg, out
"""),
    md("## Profiles (modeled for each GPU; PipeDream's measured GPU profiles for the CNNs)"),
    code("""
frames = dpo.analyses(sorted(set(cfg["models"]) | {"vgg16", "awd-lstm"}))
profs = dpo.profiles(sorted(set(frames)), gpus_needed, frames)
pd.DataFrame([dict(model=m, gpu=g, source=s, layers=len(p), compute_ms=p.total_ms, param_MB=p.total_param_bytes / 1e6)
              for (m, g, s), p in profs.items()])
"""),
    md("## Figure 1: communication share of a data-parallel iteration (modeled)"),
    code("""
fig1_profs = {k: p for k, p in profs.items() if k[0] in cfg["models"]}
fig1 = dpo.figure1_table(fig1_profs, cfg["servers"], cfg["gpu_counts"])
common.save_table(fig1, out, "figure1_dp_overhead")
(100 * fig1.pivot_table(index=["server", "model", "source"], columns="gpus", values="comm_share")).round(1)
"""),
    code("""
common.save_figure(dpo.figure1(fig1), out, "figure1_dp_overhead")
dpo.figure1(fig1)
"""),
    md("""
The text's four takeaways (SOSP §2.1), each checked on this table by the rule the protocol fixes
(`fig1.*`): high for many models despite multi-GPU servers; a spike, then a plateau, once training
spans servers; growth with the number of workers for every model, even with NVLink; higher on V100s
than on 1080 Tis. Each is a `holds` row of `claims.csv`.
"""),
    code("""
observations = dpo.observations(fig1)
common.save_table(observations, out, "observations")
observations
"""),
    md("## Bytes per sample: PipeDream's configurations vs data parallelism (4 V100, one server; Figure 17)"),
    code("""
configs, picked = dpo.bytes_table(profs)
common.save_table(configs, out, "bytes_per_sample_configs")
common.save_table(picked, out, "bytes_per_sample")
common.save_figure(dpo.bytes_figure(configs), out, "bytes_per_sample")
picked.drop(columns="label")
"""),
    md("## Measured on this machine: data-parallel training with real gloo ranks"),
    code("""
measured = None
if cfg["measured_models"]:
    measured = dpo.measured_table(cfg["measured_models"], cfg["ranks"], cfg["measured_steps"], cfg["repeats"])
    common.save_table(measured, out, "measured_dp_overhead")
measured
"""),
    md("""
## Each claim on its own hardware: calibrated on data parallelism, PipeDream predicted

The papers' settings (arXiv v1: one GPU per machine, a parameter server; SOSP: multi-GPU servers,
PyTorch DDP). One model of data parallelism, Figure 1's: on the SOSP settings its all-reduce comes
from the protocol, nothing fitted; the arXiv parameter server's two parameters are fitted only to
that paper's data-parallel numbers, inside their physical range. Every PipeDream-side number is then
predicted by the same cost model (`notebooks/repro/paper_fit.py`); Table 1's speedups are time
to target (the modeled throughput ratio times the paper's ratio of epochs). **Modeled**; `fit` says
in-sample or out-of-sample, `protocol` the entries each row used.
"""),
    md("""
## Data parallelism at the paper's global batch: epochs to target (measured, stand-in task)

Table 1's speedups are time to a target accuracy. For VGG-16 and GNMT-16 the SOSP paper's
accuracy-vs-epoch figure shows both schemes reaching it in about as many epochs
(`time_to_target.sosp_epochs_ratio`); for its other models (AWD-LM, S2VT) it states no epochs. The
authors' runtime gives every data-parallel replica the per-GPU minibatch, so one step of data
parallelism averages `workers x` the samples of one microbatch of a pipeline
(`baselines.dp_global_batch`). For those rows the epochs ratio is measured here, on the
statistical-efficiency experiment's stand-in task (notebook 03's), at the configuration of the row's
time per epoch (the model's plan; the paper's configuration beside it): PipeDream at that
configuration against data parallelism at that batch, at the most favourable of the protocol's
learning rates (`statistical_efficiency.dp_lr_*`); a plan of one stage on every GPU is data
parallelism itself (ratio 1). Measured on this machine with the semantic reference; the stand-in
task's ratio, not AWD-LM's or S2VT's. In full mode the same is measured on the second stand-in task
(notebook 03's character-level LSTM language model, the protocol's `lm_*` entries), at the learning
rate and target the protocol's rule picks on its BSP curves (`second_task_lr_rule.csv`); each row's
interval also spans ours there (`dp_global_batch.csv`, column `task`). The quick run measures the
first task only.
"""),
    code("""
from repro import paper_fit, time_to_accuracy as tta

ecfg = tta.Config(seeds=tuple(epochs_seeds) if epochs_seeds else ((0,) if quick else tta.Config().seeds))
arms = paper_fit.epochs_arms()  # each row's configuration and the paper's, replicas per stage
tasks = ()
if not quick:  # the second stand-in task at the lr and target of the protocol's rule (its BSP curves)
    lm, lm_rule = tta.second_task(ecfg)
    common.save_table(lm_rule, out, "second_task_lr_rule")
    tasks = (lm,)
dp_batch, measured_epochs = tta.measured_epochs(ecfg, arms, tasks=tasks)
common.save_table(dp_batch, out, "dp_global_batch")
for (setting, model), m in measured_epochs.items():
    print(f"{model} on {setting}: {m['text']}" + (f"\\n  paper's configuration: {m['paper']['text']}" if "paper" in m else ""))
    for task, mt in m["tasks"].items():
        print(f"  second task ({task}): {mt['text']}")
dp_batch.groupby(["task", "scheme", "config", "lr_multiple", "lr", "samples_per_update", "chosen"], sort=False).agg(
    seeds=("seed", "size"), reached=("epochs_to_target", "count"), epochs_mean=("epochs_to_target", "mean"),
    best_accuracy_min=("best_accuracy", "min"))
"""),
    code("""
cal = paper_fit.run(out, measured_epochs=measured_epochs)
cal["settings"]
"""),
    code("""
cal["calibration_parameters"]
"""),
    md(
        "Configurations: the calibrated model's, PipeDream's optimizer's (`cost=\"pipedream\"`, nominal links) and the paper's."
    ),
    code("""
cal["configurations"]
"""),
    md(
        "SOSP's intra-batch comparisons on 4 GPUs of Cluster-A (one server): model parallelism (the best straight "
        "plan, one minibatch at a time) and GPipe (PipeDream's straight partition, a flush every 4S microbatches, "
        "GPipe's own rule) "
        "against PipeDream, per model; the claims take the lowest and highest ratio."
    ),
    code("""
cal["intra_batch"]
"""),
    code("""
cal["figures"]["calibration"]
"""),
    code("""
cal["figures"]["scaling"]
"""),
    code("""
cal["calibration_errors"]
"""),
    md("## Paper vs reproduction"),
    code("""
# every row with its interval: Fig. 1 and its takeaways again at each end of the protocol's ranges
claims = dpo.claims_over_intervals(fig1_profs, cfg["servers"], cfg["gpu_counts"], picked, measured) + cal["rows"]
common.write_claims(claims, out)
pd.DataFrame(claims)
"""),
    md("## The protocol's ledger (from git history)"),
    code("""
from repro import ledger

try:
    book = ledger.table(ledger.ledger())
    common.save_table(book, out, "ledger")
except ledger.NoHistory as e:
    book = pd.DataFrame()
    print(f"no ledger: {e}")
book[book.get("seen_before_set", pd.Series(dtype=str)) == "yes"] if len(book) else book
"""),
]


NB05 = [
    md("""
# 05 · Unified schedules: the table of "Unifying Parallelization Schemes to Train Deep Nets"

DDP, FSDP, PP, LPP and FSLPP built from their placements `w(s, b, d)` by the master schedule's
greedy list scheduler, simulated by the workbench simulator with unit costs (a stage's forward +
backward = 1 unit, communication hidden as the document assumes), next to the document's closed
forms. Then the bound ρ ≤ M/S with each scheme's point, LPP over group count G and group size R,
and the two readings of the greedy rule (the workbench's default and the document's simulator).
**Modeled** (unit costs, no profile). Logic: `notebooks/repro/unified.py`.
"""),
    code(
        """
quick = False
out_dir = "results/reproduce/manual/05_unified_schedules"
sweep_S = 8   # LPP sweep: stages
sweep_B = 16  # LPP sweep: microbatches
""",
        tags=["parameters"],
    ),
    code("""
import pandas as pd
from repro import common, unified

unified.check_params(sweep_S, sweep_B)
out = common.out_folder(out_dir)
"""),
    md("## The table: closed forms (`*_doc`), simulated, and the document's simulator (`*_parallelsim`)"),
    code("""
tab = unified.table(unified.configurations(quick))
common.save_table(tab, out, "unified_table")
tab.drop(columns=["rho_simulator"])
"""),
    md("## ρ ≤ M/S: every scheme and the LPP sweep below the bound"),
    code("""
sweep = unified.lpp_sweep(sweep_S, sweep_B)
common.save_table(sweep, out, "lpp_sweep")
common.save_figure(unified.rho_figure(tab, sweep), out, "rho_bound")
unified.rho_figure(tab, sweep)
"""),
    md("""
## LPP over G and R
The closed form `S + B/G − 1` holds for full groups (R = S); with R < S each group loops over
S/R stages and the simulated latency approaches the work bound `S B / (G R)`.
"""),
    code("""
common.save_figure(unified.sweep_figure(sweep), out, "lpp_sweep")
unified.sweep_figure(sweep)
"""),
    md("""
## Two readings of the greedy rule
The document's simulator (`parallelsim.py`) runs next the frontier job that can *start* earliest
(ties: the priority of the job its batch finished last); the workbench's default runs the one that
*finishes* earliest (ties: the job's own priority). With `rule="parallelsim"` the workbench
reproduces the document's simulator job for job (tests/test_master.py, recorded reference grid).
Both simulated here at the document's durations (forward 1, backward 2, no communication):
`*_ratio` = default / document.
"""),
    code("""
rules = unified.rule_comparison(unified.rule_configurations(quick))
common.save_table(rules, out, "greedy_rules")
rules
"""),
    code("""
common.save_figure(unified.rule_figure(rules), out, "greedy_rules")
unified.rule_figure(rules)
"""),
    md("## Paper vs reproduction"),
    code("""
claims = unified.claims(tab)
common.write_claims(claims, out)
pd.DataFrame(claims)
"""),
]


def write(name, cells):
    for k, cell in enumerate(cells):  # stable ids: rewriting an unchanged notebook changes nothing
        cell.id = f"{name[:2]}-{k:02d}"
    nb = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
    )
    path = HERE / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    print(write("02_dp_communication_overhead", NB02))
    print(write("05_unified_schedules", NB05))
