"""End to end in a real browser: JupyterLab + headless Chromium (Debian's package, driven by
Playwright) open notebooks/06_partition_tuning.ipynb, run every cell, check that the widgets and
the timelines rendered, move a control, check that the timeline changed, and save screenshots in a
new folder under results/screenshots/. The server, the kernel and the browser are stopped at the
end even when the test fails, and the test checks that none of their processes is left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

from workbench.runtime.launch.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "06_partition_tuning.ipynb"


def _parameters(notebook: Path) -> dict:
    """The values of the notebook's cell tagged ``parameters`` (what a plain run of it uses)."""
    import ast

    cell = next(c for c in json.loads(notebook.read_text())["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict = {}
    exec(compile(ast.parse("".join(cell["source"])), str(notebook), "exec"), {}, values)
    return values


_DEFAULTS = _parameters(NOTEBOOK)
WORKERS = _DEFAULTS["servers"] * _DEFAULTS["gpus_per_server"]  # one memory bar per worker
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
if not Path(CHROMIUM).exists():
    pytestmark.append(pytest.mark.skip(reason=f"{CHROMIUM} missing: apt-get install -y chromium (.ci/run does)"))
playwright_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab")


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            tail = log.read_text().strip().splitlines()[-3:]
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}: {' | '.join(tail)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer {url} within {timeout_s} s")


def _family(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _stop(proc: subprocess.Popen, seen: list[psutil.Process]) -> None:
    """SIGTERM the server's process group (it shuts its kernels down), then SIGKILL what remains."""
    seen += _family(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    _, alive = psutil.wait_procs([p for p in seen if p.is_running()], timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def _alive(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {p.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 (free port, random token) serving a copy of the notebook."""
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    port, token = free_port(), uuid.uuid4().hex
    settings = tmp_path / "lab-settings"
    for plugin, value in (
        ("notebook-extension/tracker", {"windowingMode": "none"}),  # render every cell
        ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
    ):
        f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "run"),
        IPYTHONDIR=str(tmp_path / "ipython"),
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={work}",
        "--LabApp.expose_app_in_browser=True",
        "--ServerApp.port_retries=0",
        "--allow-root",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log_path = tmp_path / "jupyter.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seen: list[psutil.Process] = []
    try:
        _wait_ready(f"http://127.0.0.1:{port}/api/status?token={token}", proc, log_path)
        yield dict(url=f"http://127.0.0.1:{port}", token=token, proc=proc, seen=seen, work=work)
    finally:
        _stop(proc, seen)
        log.close()
        left = _alive(seen)
        assert not left, f"processes left behind: {left}"


_TIMELINES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    title: (gd.layout && gd.layout.title && gd.layout.title.text) || '',
    bars: (gd.data || []).filter(t => t.visible !== false).map(t => [t.name, (t.x || []).length,
                                                                     Array.from(t.base || []).slice(0, 50)]),
    drawn: gd.querySelectorAll('.barlayer .point').length}))"""


_MEMORY = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).filter(gd => (gd.data || []).length > 4
    && gd.data[4].name === 'memory').map(gd => Array.from(gd.data[4].y || []))"""


def _tuner_timeline(page) -> dict:
    figs = page.evaluate(_TIMELINES)
    hits = [f for f in figs if f["title"].startswith("simulated")]
    assert hits, f"no simulated timeline among {[f['title'] for f in figs]}"
    return hits[0]


def test_notebook_in_jupyterlab_headless_chromium(lab, tmp_path):
    from workbench.io.folders import run_folder, run_id

    shots = {}
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 2400},
        )
        lab["seen"].extend(psutil.Process().children(recursive=True))  # driver, Chromium, server, kernel
        try:
            page = browser.pages[0] if browser.pages else browser.new_page()
            page.set_default_timeout(120_000)
            console: list[str] = []
            page.on(
                "console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
            )
            page_errors: list[str] = []  # uncaught errors, e.g. anywidget's "Failed to initialize model."
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(f"{lab['url']}/lab/tree/{NOTEBOOK.name}?token={lab['token']}")
            page.wait_for_function(
                "() => window.jupyterapp && window.jupyterapp.shell.currentWidget "
                "&& window.jupyterapp.shell.currentWidget.context "
                "&& window.jupyterapp.shell.currentWidget.sessionContext.session"
            )
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            # the tuner and the explorer rendered: their controls and four plotly figures with bars
            page.wait_for_selector(".jp-OutputArea-output h3:has-text('PipeDream partition tuner')")
            page.wait_for_selector(".jp-OutputArea-output h3:has-text('Schedule explorer')")
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
                ".filter(gd => gd.querySelectorAll('.barlayer .point').length > 0).length >= 4"
            )
            assert page.locator(".widget-dropdown select").count() >= 3
            assert page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.error']")
            assert errors.count() == 0, errors.first.inner_text()
            before, memory_before = _tuner_timeline(page), page.evaluate(_MEMORY)
            assert len(memory_before) == 1 and len(memory_before[0]) == WORKERS
            assert before["drawn"] > 0 and "pipedream" in before["title"]
            shots["tuner"] = _shot(page, "PipeDream partition tuner")

            # move a control: the tuner's schedule dropdown -> gpipe; the same figure redraws in place
            _choose_schedule(page, "gpipe")
            after = _tuner_timeline(page)
            assert after["bars"] != before["bars"] and after["drawn"] > 0
            # the memory bars follow the new schedule where its memory differs (on a data-parallel plan
            # gpipe and pipedream hold the same), and the drawn axis follows the new data (rendered,
            # not only stored)
            page.wait_for_timeout(2000)
            memory_after = page.evaluate(_MEMORY)
            assert len(memory_after) == 1 and len(memory_after[0]) == WORKERS
            if max(memory_after[0]) < max(memory_before[0]):
                top = max(memory_before[0])
                page.wait_for_function(
                    f"() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(gd => "
                    f"gd._fullLayout && gd._fullLayout.yaxis2 && gd._fullLayout.yaxis2.range[1] < {top})"
                )
            assert len(page.evaluate(_TIMELINES)) == len(page.evaluate(_TIMELINES))  # no new output cells
            status = page.locator(".jp-OutputArea-output div", has_text="optimizer's plan:").last.inner_text()
            assert "updated in" in status
            # no widget model failed to initialize (anywidget then drops every later kernel message
            # to it: a figure that renders once and never updates; figure_loader.js)
            assert not [e for e in page_errors if "anywidget" in e], page_errors
            shots["tuner-gpipe"] = _shot(page, "PipeDream partition tuner")

            # an invalid manual plan: one line in the status bar, no traceback
            page.locator(".widget-toggle-buttons button", has_text="manual plan").click()
            box = page.locator(".widget-text", has_text="last layer of each stage").locator("input")
            box.fill("3, 1")
            box.press("Enter")
            page.locator(".jp-OutputArea-output", has_text="must end at layer").first.wait_for()
            assert page.locator("text=Traceback").count() == 0
            shots["explorer"] = _shot(page, "Schedule explorer")
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
            print("browser console:", *console[-20:], *page_errors, sep="\n  ")
            raise
        finally:
            browser.close()
    with run_folder(ROOT / "results" / "screenshots" / run_id("browser")) as d:
        for name, png in shots.items():
            (d / f"{name}.png").write_bytes(png)
        (d / "meta.json").write_text(
            json.dumps({"measured": "JupyterLab + headless Chromium, this machine", "notebook": NOTEBOOK.name})
        )
    assert len(list(d.final.glob("*.png"))) == 3


def _choose_schedule(page, name: str) -> None:
    """Select ``name`` in the tuner's schedule dropdown and wait until the timeline shows it."""
    dropdown = page.locator(".widget-dropdown", has_text="schedule").first.locator("select")
    dropdown.select_option(name)
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
        f".some(gd => ((gd.layout.title || {{}}).text || '').startsWith('simulated {name}'))",
        timeout=60_000,
    )


def _shot(page, heading: str) -> bytes:
    """Screenshot of the output area that holds ``heading`` (the whole widget)."""
    area = page.locator(".jp-OutputArea-output", has=page.locator(f"h3:has-text('{heading}')")).first
    area.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    return area.screenshot()


_LOADER_CHECK = """async ([loader, bundle]) => {
    const blobImport = (text) => import(URL.createObjectURL(new Blob([text], {type: 'text/javascript'})));
    // a Backbone-like model: on/off/get/set/save_changes, trigger('change:name') on set
    const makeModel = (state) => {
        const listeners = [];
        return {
            get: (k) => state[k],
            set(k, v) { state[k] = v; listeners.filter(l => l.event === 'change:' + k).forEach(l => l.cb()); },
            on: (event, cb) => listeners.push({event, cb}),
            off: (event, cb) => listeners.splice(0, listeners.length,
                                                  ...listeners.filter(l => !(l.event === event && l.cb === cb))),
            save_changes() {}, send() {},
        };
    };
    const mod = await blobImport(loader);
    const model = makeModel({_bundle: bundle, _bundle_version: 'test-' + Math.random(), _py2js_update: null});
    const widget = mod.default();
    const t0 = performance.now();
    widget.initialize({model});
    const initMs = performance.now() - t0;
    // kernel messages before the bundle is attached (its import has not resolved yet)
    model.set('_py2js_update', {id: 1});
    model.set('_py2js_restyle', {id: 2});
    model.set('_py2js_update', {id: 3});
    const cleanup = await widget.render({model, el: document.createElement('div')});
    model.set('_py2js_update', {id: 4});  // after: handled once, live
    return {initMs, seen: globalThis.__seen, rendered: cleanup};
}"""

_FAKE_BUNDLE = """export default () => ({
    initialize({model}) {
        globalThis.__seen = [];
        for (const name of ['_py2js_update', '_py2js_restyle'])
            model.on('change:' + name, () => globalThis.__seen.push([name, model.get(name).id]));
    },
    render({el}) { return 'rendered'; },
});"""


def test_figure_loader_initializes_at_once_and_replays_early_messages(tmp_path):
    """figure_loader.js in headless Chromium with a fake model and a fake plotly bundle:
    ``initialize`` returns at once (anywidget's 2 s budget), and the kernel's messages that
    arrive before the bundle is attached reach the bundle's handlers in order, each with its own
    value, and once; later messages reach them directly."""
    loader = (ROOT / "workbench" / "viz" / "widgets" / "figure_loader.js").read_text()
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page()
            page.set_content("<html><body></body></html>")
            out = page.evaluate(_LOADER_CHECK, [loader, _FAKE_BUNDLE])
        finally:
            browser.close()
    assert out["seen"] == [["_py2js_update", 1], ["_py2js_restyle", 2], ["_py2js_update", 3], ["_py2js_update", 4]]
    assert out["rendered"] == "rendered"
    assert out["initMs"] < 100
