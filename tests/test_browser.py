"""JupyterLab in a real browser: lessons run from the Run menu, and the launch panel works as a learner uses it.

Playwright drives a Chromium installed from the system's packages (``apt-get install chromium``; $COURSE_CHROMIUM
names another executable). Where Playwright or a Chromium is missing the tests skip and say which; where
$COURSE_EXPECT_BROWSER is set (CI installs both) they fail instead. Screenshots go to ``test-output/browser/``.

JupyterLab is started from this environment on a free port with its own settings folder: every cell stays in the
page (no windowing), so the tests can read each one; no news or update checks.
"""
from __future__ import annotations

import ast
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from course_lib.launch import free_port
from course_lib.processes import stop_tree
from notebook_runner import ROOT, fast_parameters, inject_parameters

EXPECT_ENV = "COURSE_EXPECT_BROWSER"
SHOTS = ROOT / "test-output" / "browser"
LESSONS = ["00_setup.ipynb", "02b_ddp_results.ipynb"]  # the first lesson, and the first with the launch panel
#: 02b's sections that the panel does not build on: they run (as the rest of the lesson does) in tests/test_notebooks.py
PANEL_SKIPS = ("## 5.", "## 6.", "## 7.", "## 9.", "## 10.")
#: The names of 02b's two trainings at its top (whole epochs, the same as 02a's): the panel needs the script and the
#: flags that cell sets, not the trainings, which tests/test_notebooks.py runs with the rest of the lesson.
TRAININGS = {"torchrun", "lesson", "seed"}


def _without_trainings(source: str) -> str:
    """``source`` without its statements that launch a training or read one: the writes and names it sets stay."""
    tree = ast.parse(source)
    kept = [ast.get_source_segment(source, statement) for statement in tree.body
            if not {n.id for n in ast.walk(statement) if isinstance(n, ast.Name)} & TRAININGS]
    return "\n".join(kept) + "\n"


def panel_part(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """02b without the sections of ``PANEL_SKIPS`` and without its two trainings: its set-up, the cell that writes
    the script and the launch panel's section."""
    kept, skipping = [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            skipping = cell.source.startswith(PANEL_SKIPS)
        if skipping:
            continue
        if cell.cell_type == "code" and "torchrun(" in cell.source and "LaunchPanel(" not in cell.source:
            cell = nbformat.from_dict(dict(cell, source=_without_trainings(cell.source)))
            assert "write_scripts_of(" in cell.source and "SCRIPT = " in cell.source, cell.source
        kept.append(cell)
    part = nbformat.from_dict(dict(nb, cells=kept))
    assert any("LaunchPanel(" in c.source for c in kept), "02b's launch panel cell was left out"
    assert not any("torchrun(" in c.source for c in kept), "a training of 02b's was kept"
    return part

pytestmark = [pytest.mark.browser, pytest.mark.notebook]


def _missing(reason: str):
    if os.environ.get(EXPECT_ENV, "") not in ("", "0"):
        pytest.fail(f"{EXPECT_ENV} is set, but {reason}")
    pytest.skip(reason)


def _chromium() -> str | None:
    named = os.environ.get("COURSE_CHROMIUM")
    for name in ([named] if named else []) + ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(name)
        if path:
            return path
    return None


def _settings(folder: Path) -> None:
    """JupyterLab's user settings for the test: all cells rendered, nothing fetched from the internet."""
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class Lab:
    """A JupyterLab server on 127.0.0.1, serving copies of the lessons with their fast parameters injected (of 02b,
    the part the launch panel builds on: ``panel_part``)."""

    def __init__(self, work: Path):
        self.notebooks = work / "notebooks"
        self.notebooks.mkdir(parents=True)
        for name in LESSONS:
            nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
            nb = inject_parameters(nb, fast_parameters(nb))
            nbformat.write(panel_part(nb) if name.startswith("02b") else nb, self.notebooks / name)
        _settings(work / "settings")
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"), JUPYTER_RUNTIME_DIR=str(work / "runtime"))
        command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                   f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                   f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.notebooks}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")
        self.log = work / "jupyterlab.log"
        self.proc = subprocess.Popen(command, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while True:
            try:
                self.api("status")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"JupyterLab did not start; its log:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(0.5)

    def api(self, path: str):
        request = urllib.request.Request(f"{self.url}/api/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def kernel(self, name: str) -> dict:
        """The kernel model (id, execution_state) of the session that has notebook ``name`` open."""
        for session in self.api("sessions"):
            if Path(session["path"]).name == name:
                return session["kernel"]
        raise LookupError(f"no session has {name} open")

    def kernel_process(self, name: str) -> psutil.Process:
        kernel_id = self.kernel(name)["id"]
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if any(kernel_id in part for part in child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no process of kernel {kernel_id}")

    def close(self) -> None:
        stop_tree(self.proc.pid)


def require_browser() -> str:
    """The Chromium to drive, once Playwright and a Chromium are both here (else skip, or fail under CI)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("Playwright is not installed (it is in the test extra: pip install -e '.[test]')")
    chromium = _chromium()
    if chromium is None:
        _missing("no Chromium on PATH (Debian/Ubuntu: apt-get install chromium; or set COURSE_CHROMIUM)")
    return chromium


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_browser()
    server = Lab(tmp_path_factory.mktemp("lab"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=_chromium())
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request):
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    page.screenshot(path=str(SHOTS / f"{request.node.name}-last.png"), full_page=True)  # what it ended on
    context.close()


def open_notebook(lab: Lab, page, name: str) -> None:
    # ?reset: a fresh workspace, not the tabs an earlier test left open
    page.goto(f"{lab.url}/lab/tree/{name}?reset&token={lab.token}")
    page.locator(".jp-Notebook:visible .jp-Cell").first.wait_for(timeout=60_000)
    _wait_idle(lab, name, 60)


def _wait_idle(lab: Lab, name: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if lab.kernel(name)["execution_state"] == "idle":
                return
        except LookupError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the kernel of {name} was not idle within {seconds}s")
        time.sleep(0.5)


def run_all(lab: Lab, page, name: str, timeout: float) -> nbformat.NotebookNode:
    """Run > Run All Cells, wait until nothing is queued and the kernel is idle, save, and read the saved file."""
    page.locator(".jp-Notebook:visible").click()
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    started = time.monotonic()
    quiet = 0
    while quiet < 3:  # three polls in a row with nothing queued and the kernel idle
        time.sleep(1)
        busy = page.locator(".jp-InputPrompt", has_text="[*]").count()
        quiet = quiet + 1 if busy == 0 and lab.kernel(name)["execution_state"] == "idle" else 0
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{name}: Run All Cells had not finished after {timeout}s ({busy} cells still queued)")
    page.keyboard.press("Control+s")
    path = lab.notebooks / name
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nb = nbformat.read(path, as_version=4)
        if any(c.get("execution_count") for c in nb.cells if c.cell_type == "code"):
            return nb
        time.sleep(0.5)
    raise TimeoutError(f"{name} was not saved with its outputs")


def assert_ran_cleanly(nb, name: str) -> None:
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    not_run = [c.get("id") for c in code if not c.get("execution_count")]
    errors = [(c.get("id"), o.get("ename"), o.get("evalue")) for c in code for o in c.outputs
              if o.get("output_type") == "error"]
    assert not errors, f"{name}: cells raised {errors}"
    assert not not_run, f"{name}: cells never ran: {not_run}"


def test_lesson_00_runs_all_cells_in_jupyterlab(lab, page):
    name = "00_setup.ipynb"
    open_notebook(lab, page, name)
    nb = run_all(lab, page, name, timeout=300)
    page.screenshot(path=str(SHOTS / "00_setup.png"), full_page=True)
    assert_ran_cleanly(nb, name)


def _family(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _bar_widths(panel) -> list[float]:
    """The fill of each progress bar in the panel, in percent, as the browser shows it."""
    styles = panel.locator(".widget-hprogress .progress-bar").evaluate_all("els => els.map(e => e.style.width)")
    return [float(s.rstrip("%") or 0) for s in styles]


# The bottom of the box's last line of text lies inside the box (not below its visible part).
_NEWEST_LINE_IN_VIEW = """e => {
    const box = e.getBoundingClientRect();
    const outputs = e.querySelectorAll('.jp-OutputArea-output');
    const last = outputs[outputs.length - 1].getBoundingClientRect();
    return last.bottom <= box.bottom + 1 && last.bottom > box.top;
}"""


def _until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"within {seconds}s: {what}")
        time.sleep(0.25)


def test_lesson_02_and_its_launch_panel_in_jupyterlab(lab, page):
    name = "02b_ddp_results.ipynb"  # lesson 02's second part holds the launch panel
    open_notebook(lab, page, name)
    nb = run_all(lab, page, name, timeout=600)
    assert_ran_cleanly(nb, name)
    kernel = lab.kernel_process(name)
    assert not _family(kernel), f"the lesson left processes running: {[p.cmdline() for p in _family(kernel)]}"

    # The panel renders as widgets, not as a text fallback.
    outputs = page.locator(".jp-OutputArea-output")
    text = " ".join(outputs.all_inner_texts())
    for fallback in ("VBox(children=", "Loading widget...", "Error displaying widget"):
        assert fallback not in text
    # A button's accessible name includes its icon's glyph, so buttons are found by their title.
    panel = page.locator(".widget-vbox").filter(has=page.locator('button[title="Stop"]')).first
    panel.scroll_into_view_if_needed()
    assert panel.locator("select").count() >= 2  # the script and precision dropdowns
    titles = panel.locator(".widget-tab .lm-TabBar-tab").all_inner_texts()
    assert [t.strip() for t in titles] == ["rank 0", "rank 1", "launcher"]
    assert "finished" in panel.inner_text()  # the lesson's own run, started from code
    panel.screenshot(path=str(SHOTS / "02_panel_after_run_all.png"))

    # A learner's run: far more epochs than the lesson's (so it is still running when Stop is pressed), from Run.
    epochs = panel.locator(".widget-text").filter(has=page.locator("label", has_text=re.compile("^epochs$")))
    epochs.locator("input").fill("200")
    epochs.locator("input").press("Enter")
    panel.locator('button[title="Run"]').click()
    _until(lambda: "running" in panel.inner_text(), 60, "the panel says it is running")

    outputs = panel.locator(".widget-tab .widget-output")
    rank_text = lambda i: outputs.nth(i).text_content() or ""  # noqa: E731
    _until(lambda: rank_text(0).strip() and rank_text(1).strip(), 120, "both rank tabs show the ranks' output")
    run = [p for p in _family(kernel) if _alive(p)]
    lines = [" ".join(p.cmdline()) for p in run]
    assert any("torchrun" in line or "torch.distributed.run" in line for line in lines), lines
    assert sum("train.py" in line for line in lines) >= 2, lines  # both workers

    before, bars = rank_text(0), _bar_widths(panel)
    _until(lambda: _bar_widths(panel) != bars and max(_bar_widths(panel)) > 0, 120, "the progress bars move")
    _until(lambda: len(rank_text(0)) > len(before), 120, "rank 0's tab receives new lines")
    # Once rank 0's lines overflow their box, the newest one is still in view: the box follows its tail.
    rank0 = outputs.nth(0)
    _until(lambda: rank0.evaluate("e => e.scrollHeight > e.clientHeight + 20"), 120,
           "rank 0's lines overflow their box (one line per epoch)")
    _until(lambda: rank0.evaluate(_NEWEST_LINE_IN_VIEW), 10, "rank 0's newest line is in view without scrolling")
    panel.screenshot(path=str(SHOTS / "02_panel_rank0_tail.png"))
    plot = panel.locator("img.widget-image")
    _until(lambda: plot.evaluate("img => img.offsetWidth > 0 && img.naturalWidth > 0"), 180,
           "the loss/accuracy plot appears (after the first epoch)")
    panel.locator(".widget-tab .lm-TabBar-tab", has_text="rank 1").click()
    panel.screenshot(path=str(SHOTS / "02_panel_running.png"))

    panel.locator('button[title="Stop"]').click()
    _until(lambda: "stopped" in panel.inner_text(), 60, "the panel says the run stopped")
    _until(lambda: not any(_alive(p) for p in run), 15, f"every process of the run ends (pids {[p.pid for p in run]})")
    assert not [p for p in _family(kernel) if _alive(p)]
    assert "finished" not in panel.inner_text()  # stopped mid-way, not run to its end
    panel.locator(".widget-tab .lm-TabBar-tab", has_text="launcher").click()
    assert re.search(r"Stopped: ended \d+ process", outputs.nth(2).text_content() or "")
    panel.screenshot(path=str(SHOTS / "02_panel_stopped.png"))
