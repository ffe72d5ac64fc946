"""``workbench reproduce``: run the paper-reproduction notebooks with papermill into a new run folder.

    workbench reproduce [--quick] [--only NAME ...] [--params FILE] [--out DIR]

Every notebook of :data:`NOTEBOOKS` found in ``notebooks/`` runs top to bottom with its
``parameters`` cell overridden (``quick``, ``out_dir`` = ``<run>/<notebook>``, the quick values
built in below, then the per-notebook values of ``--params``, a YAML or JSON file
``{notebook: {parameter: value}}`` whose keys may be a notebook's name or its number, e.g. ``"02"``).
The run folder ``<out>/reproduce-<quick|full>-<UTC time>`` is written as a temporary folder and
renamed into place at the end, so an earlier run is never overwritten (:mod:`workbench.io.folders`). It
holds the executed notebooks, each notebook's CSVs, HTML figures and ``claims.csv``, and
``summary.md``: the status of every notebook and the paper-vs-reproduction table of every claim.

Parameters are checked before anything runs (unknown notebook or parameter, a zoo model that does
not exist, a count below 1, a missing or unreadable params file): one line on stderr, exit 2. A
notebook that fails is reported with its name and failing cell; the others still run; exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.io import run_folder, run_id

if TYPE_CHECKING:  # pandas is imported where it is used: `workbench --help` starts without it
    import pandas as pd

#: notebook -> (the :mod:`repro` module with an optional ``validate_params(quick, **params)``, quick values)
NOTEBOOKS: dict[str, tuple[str | None, dict]] = {
    "01_quickstart": (None, dict(servers=2, microbatches=None, schedule="pipedream")),
    "02_dp_communication_overhead": ("dp_overhead", {}),
    "03_time_to_accuracy": ("time_to_accuracy", {}),
    "04_pipeline_timelines": ("timelines", {}),
    "05_unified_schedules": ("unified", {}),
    "07_zero_bubble_table4": ("zb_table4", {}),
}
COUNT_PARAMS = ("gpus", "gpu_counts", "workers", "servers", "ranks", "microbatches", "steps", "epochs", "batch_size")


def notebooks_dir() -> Path:
    """``notebooks/``, the folder this package lives in."""
    return Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    """What happened to one notebook."""

    name: str
    status: str  # ok | failed | missing
    seconds: float = 0.0
    error: str = ""
    files: list = field(default_factory=list)


# ---- parameters -------------------------------------------------------------------------------
def resolve_names(names, available=NOTEBOOKS) -> list[str]:
    """Full notebook names for ``names`` (full names or their number prefix, e.g. ``02``)."""
    out = []
    for n in names:
        hits = [k for k in available if k == n or k.split("_")[0] == n or k == Path(n).stem]
        if len(hits) != 1:
            raise ValueError(f"unknown notebook {n!r}; choose from {', '.join(available)} (or their numbers)")
        out.append(hits[0])
    return out


def load_params(path) -> dict[str, dict]:
    """``{notebook: {parameter: value}}`` from a YAML or JSON file (keys resolved to full names)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"params file {path} does not exist; pass a YAML or JSON file {{notebook: {{parameter: value}}}}"
        )
    text = path.read_text()
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001  (any parse error becomes one line)
        raise ValueError(f"cannot parse params file {path}: {str(e).splitlines()[0]}") from None
    data = data or {}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ValueError(f"params file {path} must map notebook names to {{parameter: value}} mappings")
    # YAML reads an unquoted 02 as the integer 2: numbers name notebooks by their two-digit prefix
    return {
        full: dict(v)
        for k, v in data.items()
        for full in resolve_names([f"{k:02d}" if isinstance(k, int) and not isinstance(k, bool) else str(k)])
    }


def notebook_parameters(path: Path) -> dict:
    """The names declared in the notebook's ``parameters`` cell (papermill's inspection)."""
    import papermill

    return papermill.inspect_notebook(str(path))


def _check_counts(name: str, params: dict) -> None:
    for key in COUNT_PARAMS:
        if key not in params or params[key] is None:
            continue
        vals = params[key] if isinstance(params[key], (list, tuple)) else [params[key]]
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"{name}: parameter {key} must be an integer >= 1 (or a list of them), got {params[key]!r}"
                )


def _check_models(name: str, params: dict) -> None:
    from workbench.models import config

    for key in ("model", "models", "measured_models"):
        vals = params.get(key)
        if vals is None:
            continue
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            config(v)  # "unknown model ..." for a name the zoo does not have


def validate(name: str, path: Path, quick: bool, params: dict) -> None:
    """One-line ``ValueError`` for parameters the notebook does not declare or cannot use."""
    declared = notebook_parameters(path)
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise ValueError(f"{name} has no parameter(s) {unknown}; it takes {sorted(declared)}")
    module, _ = NOTEBOOKS[name]
    _check_counts(name, params)
    fn = None
    if module:
        try:
            fn = getattr(importlib.import_module(f"repro.{module}"), "validate_params", None)
        except ImportError:
            fn = None
    if fn is None:
        _check_models(name, params)
        return
    try:
        fn(quick, **params)
    except ValueError as e:
        raise ValueError(f"{name}: {str(e).splitlines()[0]}") from None


# ---- running ----------------------------------------------------------------------------------
def plan_runs(only, params_file, quick: bool, nb_dir: Path) -> tuple[list[tuple[str, Path, dict]], list[str]]:
    """(notebooks to run with their parameter overrides, names listed but absent from ``nb_dir``)."""
    names = resolve_names(only) if only else list(NOTEBOOKS)
    extra = load_params(params_file) if params_file else {}
    runs, missing = [], []
    for name in names:
        path = nb_dir / f"{name}.ipynb"
        if not path.exists():
            if only:
                raise ValueError(f"notebook {path} is not in this checkout")
            missing.append(name)
            continue
        over = dict(NOTEBOOKS[name][1]) if quick else {}
        over.update(extra.get(name, {}))
        validate(name, path, quick, over)
        runs.append((name, path, over))
    return runs, missing


@contextlib.contextmanager
def children_stderr_to(path: Path):
    """While inside, the processes started here (a notebook's kernel, the ranks it starts) write their
    stderr into ``path``, while this process's own messages and progress bars still reach its stderr:
    a kernel's warnings and its exit on Ctrl-C do not interleave with the command's lines."""
    sys.stderr.flush()
    terminal, log = os.dup(2), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    own = sys.stderr
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1)
    os.dup2(log, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        sys.stderr.close()
        sys.stderr = own
        os.close(terminal)
        os.close(log)


def run_notebook(name: str, path: Path, params: dict, run_dir: Path, quick: bool, *, progress: bool) -> Outcome:
    """Execute one notebook into ``run_dir/name.ipynb`` with its outputs in ``run_dir/name``."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    run_dir = Path(run_dir).resolve()  # the kernel runs in run_dir: a relative out_dir would land inside it
    out_dir = run_dir / name
    declared = notebook_parameters(path)
    base = {"quick": quick, "out_dir": str(out_dir)} if "out_dir" in declared else {"out": str(out_dir)}
    if "quick" not in declared:
        base.pop("quick", None)
    t0, log = time.perf_counter(), run_dir / f"{name}.stderr.txt"
    try:
        with children_stderr_to(log):
            papermill.execute_notebook(
                str(path),
                str(run_dir / f"{name}.ipynb"),
                parameters=base | params,
                cwd=str(run_dir),
                kernel_name="python3",
                progress_bar=progress,
                log_output=False,
            )
        status, error = "ok", ""
    except PapermillExecutionError as e:
        status = "failed"
        first = (e.source or "").strip().splitlines()[0][:60] if (e.source or "").strip() else ""
        error = (
            f"cell {e.cell_index} of the executed {name}.ipynb (`{first}`): {e.ename}: "
            f"{str(e.evalue).splitlines()[0] if e.evalue else ''}"
        )
    except Exception as e:  # noqa: BLE001  (kernel death, missing kernel: report and go on)
        status, error = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if status == "ok" or not log.stat().st_size:
        log.unlink()  # the kernel's own messages (its ranks' too) are kept only where a notebook failed
    else:
        error += f" (the kernel's stderr: {log.name})"
    files = sorted(str(p.relative_to(run_dir)) for p in out_dir.rglob("*") if p.is_file()) if out_dir.exists() else []
    return Outcome(name, status, time.perf_counter() - t0, error, files)


def run(
    only=None,
    params_file=None,
    quick: bool = False,
    out="results/reproduce",
    nb_dir=None,
    *,
    progress: bool = True,
    lean: bool = False,
) -> tuple[Path, list[Outcome]]:
    """Check every parameter, run the notebooks, write ``summary.md``; returns (run folder, outcomes).
    ``lean``: a run folder to commit: pages load plotly.js from its CDN instead of a 4.8 MB copy,
    and the executed notebooks keep their tables and text but not their figures' data (each
    figure is a page in the notebook's folder; :func:`strip_figures`)."""
    from tqdm.auto import tqdm

    nb_dir = Path(nb_dir) if nb_dir else notebooks_dir()
    runs, missing = plan_runs(only, params_file, quick, nb_dir)
    outcomes = [Outcome(n, "missing", error=f"{n}.ipynb is not in {nb_dir}") for n in missing]
    load_start = os.getloadavg()
    with (
        run_folder(Path(out) / run_id("reproduce-" + ("quick" if quick else "full"))) as tmp,
        shared_plotlyjs(tmp, lean),
    ):
        bar = tqdm(runs, desc="notebooks", unit="nb", disable=not progress)
        for name, path, params in bar:
            bar.set_postfix_str(name)
            outcome = run_notebook(name, path, params, tmp, quick, progress=progress)
            outcomes.append(outcome)
            if lean and (tmp / f"{name}.ipynb").exists():
                strip_figures(tmp / f"{name}.ipynb")
            if outcome.status != "ok":
                tqdm.write(f"FAILED {name}: {outcome.error}", file=sys.stderr)
        order = list(NOTEBOOKS)
        outcomes.sort(key=lambda o: order.index(o.name))
        claims = collect_claims(tmp)
        claims.to_csv(tmp / "claims.csv", index=False)
        (tmp / "summary.md").write_text(summary_markdown(tmp, outcomes, quick, claims, load_start))
    return tmp.final, outcomes


def strip_figures(path: Path) -> int:
    """Replace every plotly figure output of the executed notebook ``path`` by one line of text
    naming where its page is (the notebook's folder of the run); tables, text and errors stay.
    Returns how many outputs were replaced."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))  # the .ipynb format is JSON (nbformat 4)
    note = f"[figure: its data is left out of this copy; the page is in {path.stem}/ beside this notebook]"
    n = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            html = "".join(data.get("text/html", ""))
            if "application/vnd.plotly.v1+json" in data or "plotly" in html.lower():
                out["data"] = {"text/plain": note}
                out["metadata"] = {}
                n += 1
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return n


@contextlib.contextmanager
def shared_plotlyjs(run_dir: Path, lean: bool = False):
    """While the notebooks run, their HTML figures load one ``plotly.min.js`` at the run folder's
    root by relative path (the kernels inherit the environment), instead of embedding 4.8 MB each;
    ``lean``: from plotly's CDN (a page to commit; viewing it needs the network)."""
    from workbench.viz import SHARED_PLOTLYJS_ENV, write_shared_plotlyjs

    before = os.environ.get(SHARED_PLOTLYJS_ENV)
    os.environ[SHARED_PLOTLYJS_ENV] = "cdn" if lean else str(write_shared_plotlyjs(run_dir).resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SHARED_PLOTLYJS_ENV, None)
        else:
            os.environ[SHARED_PLOTLYJS_ENV] = before


# ---- summary ----------------------------------------------------------------------------------
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`):
    floating-point kernels can round differently on another CPU, so a run says which one it had."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "model unknown"


def collect_claims(run_dir: Path) -> pd.DataFrame:
    """Every ``<run>/<notebook>/claims.csv`` (and below), concatenated with a ``notebook`` column."""
    import pandas as pd

    from repro.common import CLAIM_COLUMNS, claim_kind

    frames = []
    for path in sorted(Path(run_dir).glob("*/**/claims.csv")):
        df = pd.read_csv(path)
        df.insert(0, "notebook", path.relative_to(run_dir).parts[0])
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["notebook", *CLAIM_COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    out["kind"] = [claim_kind(r["notebook"], r) for r in out.to_dict("records")]
    return out


def _num(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "–" if not math.isfinite(x) else f"{x:.4g}"


def _cell(text) -> str:
    return (
        ""
        if text is None or (isinstance(text, float) and math.isnan(text))
        else str(text).replace("|", "\\|").replace("\n", " ")
    )


def code_version() -> str:
    """The git commit the package runs from (``+ uncommitted changes`` when the tree differs), or
    "unknown" outside a git checkout."""

    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "workbench", "notebooks"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def summary_markdown(
    run_dir: Path, outcomes: list[Outcome], quick: bool, claims: pd.DataFrame | None = None, load_start=None
) -> str:
    """The run's ``summary.md``: machine, code version, load, notebook status table, failures, the
    claims' errors by ``fit``, the calibrated parameters and settings, and the paper-vs-ours table."""
    import torch

    load = os.getloadavg()
    start = f"{load_start[0]:.1f} / {load_start[1]:.1f} / {load_start[2]:.1f} at the start, " if load_start else ""
    lines = [
        f"# Reproduction run ({'quick' if quick else 'full'}, finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Mode: **{'quick' if quick else 'full'}**. Code: commit {code_version()}. Machine: {platform.node()}, "
        f"{os.cpu_count()} CPU cores ({cpu_model()}), {platform.platform()}, Python {platform.python_version()}, torch "
        f"{torch.__version__}; load average (1/5/15 min) {start}"
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end.",
        "",
        "## Notebooks",
        "",
        "| notebook | status | seconds | outputs |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        outs = ", ".join(f for f in o.files if f.endswith((".csv", ".html")))
        status = o.status if o.status == "ok" else f"**{o.status}**: {_cell(o.error)}"
        lines.append(f"| {o.name} | {status} | {o.seconds:.0f} | {_cell(outs)} |")
    if claims is None:
        claims = collect_claims(run_dir)
    counted = claims[claims["kind"] != "repeat"] if "kind" in claims.columns else claims
    lines[4:4] = _opening(claims) + _kinds_section(claims) + headline(counted)
    lines += _fit_section(counted) + _calibration_section(run_dir) + _ledger_section(run_dir)
    lines += [
        "",
        "## Paper vs reproduction",
        "",
        "`ratio` = ours / paper. `label` says where a number was measured or what it was modeled from (`untestable`: no number of ours, and why).",
        "",
    ]
    if claims.empty:
        lines.append("(no claims.csv was written)")
    else:
        lines += [
            "| notebook | claim | paper | ours | low | high | verdict | kind | ratio | unit | comparison | met | fit "
            "| label | explanation |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in claims.itertuples(index=False):
            lines.append(
                f"| {r.notebook} | {_cell(r.claim)} | {_num(r.paper)} | {_num(r.ours)} | "
                f"{_num(getattr(r, 'low', ''))} | {_num(getattr(r, 'high', ''))} | {_cell(getattr(r, 'verdict', ''))} | "
                f"{_cell(getattr(r, 'kind', ''))} | {_num(r.ratio)} | {_cell(r.unit)} | {_cell(getattr(r, 'comparison', ''))} | "
                f"{_cell(getattr(r, 'met', ''))} | {_cell(getattr(r, 'fit', ''))} | {_cell(r.label)} | "
                f"{_cell(r.explanation)} |"
            )
    return "\n".join(lines) + "\n"


#: What each kind of row is (:data:`repro.common.KINDS`), as ``summary.md`` names it.
KIND_TEXT = {
    "measured": "(a) the papers' measured numbers, out of sample, each counted once",
    "in-sample": "(b) in-sample fits (a calibrated parameter was fitted to the number)",
    "formula": "(c) formula checks (closed-form bubbles, the unifying document's counts)",
    "qualitative": "(d) qualitative statements",
    "repeat": "repeats of a number counted in (a) (an abstract's maximum, a run on this machine); not counted",
}


def kind_counts(claims: pd.DataFrame) -> pd.DataFrame:
    """Per kind (:data:`KIND_TEXT`'s order): rows, how many are ``consistent`` / ``contradicted`` /
    ``untestable`` (the ``verdict`` over each row's interval) and how many meet the paper at our
    point value (``met``). One test recounts these from ``claims.csv``."""
    import pandas as pd

    rows = []
    for kind in KIND_TEXT:
        part = claims[claims["kind"] == kind]
        if part.empty:
            continue
        v = part["verdict"].fillna("").astype(str) if "verdict" in part.columns else part["claim"].map(lambda _: "")
        rows.append(
            dict(
                kind=kind,
                rows=len(part),
                consistent=int((v == "consistent").sum()),
                contradicted=int((v == "contradicted").sum()),
                untestable=int((~v.isin(["consistent", "contradicted"])).sum()),
                met_at_point=int((part["met"] == "yes").sum()),
            )
        )
    return pd.DataFrame(rows, columns=["kind", "rows", "consistent", "contradicted", "untestable", "met_at_point"])


def _opening(claims: pd.DataFrame) -> list[str]:
    """summary.md's first lines: what the reproduction can and cannot say, from the verdicts."""
    if claims.empty or "kind" not in claims.columns:
        return []
    counts = {r.kind: r for r in kind_counts(claims).itertuples(index=False)}
    m = counts.get("measured")
    lines = ["## What this reproduction can and cannot say", ""]
    if m is not None:
        lines.append(
            f"Of the papers' {m.rows} measured numbers (each once, compared out of sample), {m.consistent} are "
            f"consistent with our interval, {m.contradicted} contradicted and {m.untestable} untestable here. "
            "A row is consistent when the paper's value lies inside the interval our model spans over the "
            "protocol's open entries (within 25% at its ends), contradicted when outside; `width` in "
            "`claims.csv` shows how wide each interval is."
        )
    for kind in ("in-sample", "formula", "qualitative"):
        if kind in counts:
            c = counts[kind]
            lines.append(f"- {KIND_TEXT[kind]}: {c.consistent} of {c.rows} consistent, {c.contradicted} contradicted.")
    lines += [
        "",
        "What it cannot say: this machine has no GPU, so every GPU number is modeled (published GPU profiles or "
        "roofline projections, the setting's links, the protocol's all-reduce), and a consistent row says the "
        "model can give the paper's number, not that the paper's hardware did; AWD-LM and S2VT are stand-ins "
        "of their published architectures; statistical efficiency is measured on stand-in tasks (notebook 03); "
        "numbers that no source document holds (SOSP Table 1, the arXiv Cluster-B BSP values) say so in their rows.",
        "",
    ]
    contradicted = claims[(claims["kind"] == "measured") & (claims["verdict"] == "contradicted")]
    if len(contradicted):
        lines += ["Contradicted (the paper's measured number lies outside our interval):", ""]
        for r in contradicted.itertuples(index=False):
            lines.append(
                f"- {_short(r.claim)}: paper {_num(r.paper)}, ours {_num(r.ours)} [{_num(r.low)}, {_num(r.high)}]"
            )
        lines.append("")
    return lines + _open_ends(claims) + _own_errors(claims)


def _open_ends(claims: pd.DataFrame) -> list[str]:
    """The counted rows whose verdict at the interval's low end differs from the one at its high
    end: consistent over the interval, but only at one end of an entry the sources leave open."""
    from repro.common import verdict

    def at(r, x):
        return verdict(r.comparison, float(r.paper), float(x), float(x), float(getattr(r, "paper_high", math.nan)))

    if "low" not in claims.columns:
        return []
    rows = [r for r in claims[claims["kind"] != "repeat"].itertuples(index=False) if at(r, r.low) != at(r, r.high)]
    if not rows:
        return []
    out = ["Verdicts that rest on an open protocol entry (consistent at one end of the interval only):", ""]
    for r in rows:
        out.append(
            f"- {_short(r.claim)}: paper {_num(r.paper)}; ours {_num(r.low)} ({at(r, r.low)}) to "
            f"{_num(r.high)} ({at(r, r.high)})"
        )
    return out + [""]


#: PipeDream's own numbers (its speedup over one GPU, a straight pipeline's) and data parallelism's
#: own (BSP's speedup and communication share), by the words of their rows.
OWN = {"PipeDream": ("PipeDream speedup over 1 GPU", "straight pipeline speedup over 1 GPU"),
       "data parallelism": ("BSP speedup over 1 GPU", "BSP share of time communicating")}  # fmt: skip


def own_errors(claims: pd.DataFrame) -> pd.DataFrame:
    """Per side (:data:`OWN`) and ``fit``: the rows the papers measured of that side alone, the median
    ``|ours / paper − 1|`` and how many are consistent."""
    import pandas as pd

    rows = []
    for side, words in OWN.items():
        pick = claims["claim"].astype(str).map(lambda c: any(w in c for w in words)) & (claims["kind"] != "repeat")
        for fit, part in claims[pick].groupby("fit"):
            err = (pd.to_numeric(part["ratio"], errors="coerce") - 1).abs()
            rows.append(
                dict(
                    side=side,
                    fit=fit,
                    rows=len(part),
                    median_abs_error=float(err.median()),
                    consistent=int((part["verdict"] == "consistent").sum()),
                )  # fmt: skip
            )
    return pd.DataFrame(rows, columns=["side", "fit", "rows", "median_abs_error", "consistent"])


def _own_errors(claims: pd.DataFrame) -> list[str]:
    df = own_errors(claims) if "verdict" in claims.columns else None
    if df is None or df.empty:
        return []
    return [
        "PipeDream's own numbers (its speedup over one GPU where the papers measured it) beside data "
        "parallelism's (BSP's speedup and share):",
        "",
        *_table(df),
        "",
    ]


def _kinds_section(claims: pd.DataFrame) -> list[str]:
    if claims.empty or "kind" not in claims.columns:
        return []
    df = kind_counts(claims)
    df.insert(1, "what", df["kind"].map(KIND_TEXT))
    return ["## Counts by kind (recounted from `claims.csv` by tests/test_counts.py)", "", *_table(df), ""]


def _ledger_section(run_dir: Path) -> list[str]:
    """The protocol entries changed after a committed run had shown their rows (notebook 02's ledger.csv)."""
    import pandas as pd

    path = Path(run_dir) / "02_dp_communication_overhead" / "ledger.csv"
    if not path.exists():
        return []
    df = pd.read_csv(path, dtype=str).fillna("")
    changed = df[df["changed_after_seen"] == "yes"]
    lines = [
        "",
        "## The protocol's ledger (from git history, `02_dp_communication_overhead/ledger.csv`)",
        "",
        f"{len(df)} entries; {int((df['seen_before_set'] == 'yes').sum())} were written down after a committed run "
        f"had shown rows they move; {len(changed)} *changed* value after that. A changed entry with an interval "
        "(`interval` yes; tests/test_ledger.py requires one, with the value held before at one end) decides no "
        "verdict by its later value: its rows are judged at the value before and the value now, and the later "
        "value is the point only; a changed entry without one (`interval` no) would still decide its rows' "
        "verdicts. An entry written down after its rows were seen but never changed records a choice with its "
        "source; whether the code made the same choice before the entry existed is not derivable from the "
        "protocol file, so the ledger lists it (`seen_before_set`) without judging it.",
        "",
    ]
    if len(changed):
        lines += _table(changed[["key", "previous", "value", "set_commit", "shown_by", "rows_moved", "interval"]])
    return lines


def _short(text, width: int = 90) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


#: Two kinds of evidence, reported apart: the papers' measurements (PipeDream's arXiv and SOSP
#: versions, and the papers the schedules come from) and the unifying document's table of counts.
DOCUMENT_COUNTS = ("05_unified_schedules",)


def evidence(notebook: str) -> str:
    return "the unifying document's counts" if notebook in DOCUMENT_COUNTS else "the papers' measurements"


def headline(claims: pd.DataFrame, worst: int = 5) -> list[str]:
    """A few lines first, for each kind of evidence apart (:func:`evidence`): how many claims
    compared as numbers are within 25% (by ``fit``), how many bounds and qualitative statements are
    met, and the furthest misses of the papers' measurements."""
    if claims.empty or "ratio" not in claims.columns:
        return []
    claims = claims.assign(evidence=claims["notebook"].map(evidence))
    comparison = claims["comparison"] if "comparison" in claims.columns else claims["claim"].map(lambda _: "point")
    lines = [
        "## At the protocol's point values",
        "",
        "The verdicts above read each row's interval; the counts here read our point value alone (the "
        "protocol's present values, including any entry the ledger below lists as changed after its rows "
        "were seen), so they decide nothing on their own.",
        "",
    ]
    for kind, part in claims.groupby("evidence", sort=False):
        ratio = part["ratio"].map(lambda v: float(v) if isinstance(v, (int, float)) else math.nan)
        numeric = comparison[part.index].isin(["point", "up to"]) & (ratio > 0)
        num = part[numeric].copy()
        within = (ratio[numeric] - 1).abs() <= 0.25  # the fit section's "within 25%"
        fits = num["fit"] if "fit" in num.columns else within.map(lambda _: "")
        by_fit = ", ".join(f"{fit} {int(w.sum())}/{len(w)}" for fit, w in within.groupby(fits))
        text = f"**{kind[0].upper() + kind[1:]}**: {int(within.sum())} of {len(num)} claims compared as numbers are within 25% (by `fit`: {by_fit})"
        for label, cmp in (("bounds met", "at least"), ("qualitative statements that hold", "holds")):
            rows = part[comparison[part.index] == cmp]
            if len(rows):
                text += f"; {label}: {int((rows['met'] == 'yes').sum())} of {len(rows)}"
        lines += [text + ".", ""]
        if kind == "the papers' measurements" and len(num):
            lines += _headline_speedups(num, ratio[numeric])
            num["gap"] = ratio[numeric].map(lambda r: abs(math.log(r)))
            lines += ["Furthest from the paper (ours / paper):", ""]
            for r in num.nlargest(worst, "gap").itertuples(index=False):
                lines.append(
                    f"- {_short(r.claim)}: paper {_num(r.paper)}, ours {_num(r.ours)} (×{float(r.ratio):.2f}, "
                    f"{getattr(r, 'fit', '')})"
                )
            lines.append("")
    return lines


#: The papers' headline speedups: every modeled speedup to target accuracy (both versions' Table 1
#: and the arXiv version's over ASP); the rows measured on this machine stand beside them.
HEADLINE = "to target accuracy"


def _headline_speedups(num: pd.DataFrame, ratio: pd.Series) -> list[str]:
    """One line: how many of the papers' headline speedups (:data:`HEADLINE`, modeled) are within
    25%, each with ours / paper."""
    label = num["label"].astype(str) if "label" in num.columns else num["claim"].map(lambda _: "")
    pick = num["claim"].astype(str).str.contains(HEADLINE, regex=False) & ~label.str.startswith("measured")
    if not pick.any():
        return []
    picked = ratio[pick]
    # a short name: the model and setting before "PipeDream ...", or the claim up to " to target"
    names = [
        c.split(" to ")[0] if c.startswith("PipeDream") else c.split(" PipeDream ")[0] for c in num.loc[pick, "claim"]
    ]
    each = "; ".join(f"{n} ×{r:.2f}" for n, r in zip(names, picked))
    within = int(((picked - 1).abs() <= 0.25).sum())
    return [
        f"The headline speedups (time to target accuracy, modeled): {within} of {int(pick.sum())} within 25% ({each}).",
        "",
    ]


def _table(df: pd.DataFrame) -> list[str]:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += [
        "| " + " | ".join(_num(v) if isinstance(v, float) else _cell(v) for v in row) + " |"
        for row in df.itertuples(index=False)
    ]
    return out


def _fit_section(claims: pd.DataFrame) -> list[str]:
    """Errors of the numeric claims by ``fit`` (in-sample, out-of-sample, none), overall and per notebook."""
    from repro.common import fit_summary

    if claims.empty or "fit" not in claims.columns:
        return []
    lines = [
        "",
        "## How close: the claims with a number on both sides, by `fit`",
        "",
        "`in-sample`: a calibrated parameter was fitted to the paper's number; `out-of-sample`: modeled with "
        "nothing fitted to it; `none`: measured here (no model). Within 25% = |ours / paper − 1| ≤ 0.25. "
        f"Every claim is in `claims.csv` of this folder ({len(claims)} rows).",
        "",
    ]
    claims = claims.assign(evidence=claims["notebook"].map(evidence))
    lines += _table(fit_summary(claims, by=["evidence", "fit"]))
    lines += ["", "Per notebook:", ""]
    lines += _table(fit_summary(claims, by=["notebook", "fit"]))
    if "met" in claims.columns:
        from repro.common import met_summary

        lines += ["", "Bounds (`at least`) and qualitative statements (`holds`): met or not, per kind of evidence:", ""]
        lines += _table(met_summary(claims, by=["evidence", "comparison"]))
    return lines


def _calibration_section(run_dir: Path) -> list[str]:
    """The calibrated parameters and where each hardware setting comes from (notebook 02's CSVs)."""
    import pandas as pd

    folder = Path(run_dir) / "02_dp_communication_overhead"
    if not (folder / "calibration_parameters.csv").exists():
        return []
    lines = [
        "",
        "## Hardware settings and their data-parallel all-reduce (notebook 02, `notebooks/repro/paper_fit.py`)",
        "",
        "Data parallelism's all-reduce: on the arXiv settings (a parameter server) its bus bandwidth (GB/s) and "
        "per-step latency, fitted to that paper's data-parallel numbers only (the `in-sample` rows) inside their "
        "physical range; on the SOSP settings nothing is fitted (`free` = none): each link class's efficiency and "
        "step latency come from the protocol (`notebooks/repro/data/protocol.toml`). Pipeline links stay nominal.",
        "",
    ]
    lines += _table(pd.read_csv(folder / "calibration_parameters.csv"))
    lines += ["", "Where each setting comes from:", ""]
    lines += _table(pd.read_csv(folder / "settings.csv"))
    if (folder / "configurations.csv").exists():
        lines += [
            "",
            "Configurations (replicas per stage) on each setting's links: the model's, PipeDream's own "
            "optimizer's (`cost=\"pipedream\"` on the nominal links, with its predicted gain over its data-parallel estimate), the paper's:",
            "",
        ]
        lines += _table(pd.read_csv(folder / "configurations.csv"))
    return lines


# ---- command line -----------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="small built-in parameters (whole run < 10 min on 2 cores)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="notebooks to run (names or numbers, e.g. 02 05)")
    p.add_argument("--params", metavar="FILE", help="YAML or JSON {notebook: {parameter: value}}")
    p.add_argument("--out", default="results/reproduce", help="parent of the new run folder")
    p.add_argument(
        "--lean",
        action="store_true",
        help="a run folder to commit: pages load plotly.js from its CDN, notebooks keep no figure data",
    )
    p.add_argument("--notebooks", metavar="DIR", help=argparse.SUPPRESS)  # another notebooks/ folder (tests)


def cmd_reproduce(args) -> int:
    try:
        run_dir, outcomes = run(args.only, args.params, args.quick, args.out, args.notebooks, lean=args.lean)
    except KeyboardInterrupt:  # Ctrl-C: the run folder was removed unfinished (io.folders.run_folder)
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # the interrupted cell's task: no traceback at exit
        print(
            f"workbench reproduce: interrupted; the unfinished run was removed (nothing in {args.out} changed)",
            file=sys.stderr,
        )
        return 130
    width = max(len(o.name) for o in outcomes) if outcomes else 10
    for o in outcomes:
        print(f"{o.name:<{width}}  {o.status:<7}  {o.seconds:6.0f} s  {o.error}")
    print(f"wrote {run_dir} (summary.md, executed notebooks, CSVs, HTML figures)")
    return 0 if all(o.status in ("ok", "missing") for o in outcomes) else 1


def register(subcommands) -> None:
    """Add ``reproduce`` to the ``workbench`` command's sub-commands: the entry point of group
    ``workbench.commands`` in pyproject.toml names this function, and the CLI calls it with its
    ``add_subparsers()`` object (this module imports nothing heavy, so ``workbench --help`` stays fast)."""
    p = subcommands.add_parser(
        "reproduce", help="run the paper-reproduction notebooks (papermill) into a new run folder"
    )
    add_arguments(p)
    p.set_defaults(fn=cmd_reproduce)
