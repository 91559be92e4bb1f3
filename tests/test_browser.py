"""The course as a learner meets it: JupyterLab in a real browser (Chromium, driven by Playwright).

The test starts JupyterLab on 127.0.0.1 (a free port, a token, no browser of its own) over a
copy of ``lessons/`` and ``exercises/``, so nothing it runs or autosaves touches the
repository. It opens lesson 02, runs every cell, moves each explorer slider with the keyboard
and checks that the figure and the readout change and that no cell shows an error; then it
opens exercise 01, runs its check cells and reads the "not attempted" table; and it types a
prompt into lesson 11's explorer (a two-cell notebook that shows it over the real model),
presses Generate and reads the coloured speculative text: identical to plain greedy text.
Screenshots go to ``test-artifacts/`` (git-ignored), whose path the test prints.

It drives the system's Chromium (Debian: ``apt-get install chromium``; ``.ci/run`` installs
it) and never downloads a browser; without one, or without Playwright, it is skipped and says
why. About 60 to 120 s on a 2-core CPU, most of it lesson 02's own cells and loading SmolLM2.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
# SPECDEC_CHROMIUM names another Chromium-based browser (GitHub's Ubuntu runners ship Google
# Chrome, and Ubuntu's chromium package is only a snap stub).
CHROMIUM = next(
    (
        p
        for p in (os.environ.get("SPECDEC_CHROMIUM"), "/usr/bin/chromium")
        if p and Path(p).exists()
    ),
    None,
)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="needs Playwright for Python (the test extra)"
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium at /usr/bin/chromium (nor at $SPECDEC_CHROMIUM): install it "
    "(Debian: apt-get install chromium)",
)

# The state of the open notebook, read from JupyterLab's own model (the app is exposed to
# the page for this test): how many code cells ran, which outputs are errors, kernel status.
_NOTEBOOK_STATE = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  if (!nb || !nb.content || !nb.sessionContext) return null;
  const cells = nb.content.model.cells;
  let code = 0, ran = 0; const errors = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    code++;
    if (c.executionCount !== null) ran++;
    for (const o of c.outputs.toJSON()) {
      if (o.output_type === 'error') errors.push(i + ': ' + o.ename + ': ' + o.evalue);
    }
  }
  const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
  return {code, ran, errors, status: kernel ? kernel.status : 'none'};
}"""


def _write_explorer_notebook(path: Path) -> None:
    """A two-cell notebook that shows lesson 11's explorer (``token_view.Explorer``) over the
    real model, as the lesson builds it, without running the rest of the lesson."""
    import nbformat

    setup = (
        "import specdec_course; specdec_course.notebook_setup(seed=0, threads=1)\n"
        "import torch\n"
        "from specdec_course import llm, token_view\n"
        "model, tok = llm.load(torch.float32)\n"
        "chat = lambda text: tok.apply_chat_template([{'role': 'user', 'content': text}])"
    )
    show = (
        "explorer = token_view.Explorer(model, llm.proposers(model), chat, tok.decode,\n"
        "                               max_new_tokens=24, stop_ids=tok.stop_ids)\n"
        "explorer"
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(show)]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server over a copy of the course's notebooks: yields its base URL and
    token; stopped (and its kernels with it) when the module's tests are done."""
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "course"
    for folder in ("lessons", "exercises"):
        shutil.copytree(ROOT / folder, root / folder)
    _write_explorer_notebook(root / "lessons" / "explorer_check.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"))
    env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    log = open(tmp / "jupyterlab.log", "w")  # noqa: SIM115 - closed in the finally below
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "JupyterLab did not start: " + (tmp / "jupyterlab.log").read_text()
                    ) from None
                time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def page(lab, tmp_path_factory):
    """A Chromium page (a fresh profile) logged in to ``lab``."""
    ARTIFACTS.mkdir(exist_ok=True)
    print(f"\nscreenshots: {ARTIFACTS}")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as pw:
        try:
            context = pw.chromium.launch_persistent_context(
                str(profile),
                executable_path=CHROMIUM,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1400, "height": 1000},
            )
        except sync_api.Error as e:
            pytest.skip(f"Chromium at {CHROMIUM} cannot start here: {e}")
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


def _open_and_run_all(page, lab, path: str, timeout_s: float = 240) -> dict:
    base, token = lab
    page.goto(f"{base}/lab/tree/{path}?token={token}&reset")
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel",
        timeout=120_000,
    )
    page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.ready"
        ".then(() => window.jupyterapp.commands.execute('notebook:run-all-cells'))"
    )
    deadline = time.monotonic() + timeout_s
    state, idle_since = None, None
    while time.monotonic() < deadline:
        state = page.evaluate(_NOTEBOOK_STATE)
        if state and state["errors"]:
            break
        if state and state["ran"] == state["code"] and state["status"] == "idle":
            # The kernel can show idle for a moment between two queued cells: done only
            # once it has stayed idle, with every cell run, for two seconds.
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= 2.0:
                break
        else:
            idle_since = None
        time.sleep(0.5)
    assert state is not None, f"{path} did not open"
    assert not state["errors"], f"{path}: cells raised: {state['errors']}"
    assert state["ran"] == state["code"], f"{path}: {state['ran']}/{state['code']} cells ran"
    return state


def _explorer_state(page) -> tuple[str, str]:
    readout = page.locator(".widget-html-content").filter(has_text="tokens per target call")
    image = page.locator(".widget-image").last
    return readout.last.inner_text(), image.get_attribute("src") or ""


def test_lesson_02_explorer_responds_to_the_keyboard(page, lab):
    _open_and_run_all(page, lab, "lessons/02_acceptance_rate.ipynb")
    sliders = {
        name: page.locator(".widget-slider").filter(
            has=page.locator(".widget-label", has_text=name)
        )
        for name in ("alpha", "gamma", "c")
    }
    first = sliders["alpha"].first
    first.scroll_into_view_if_needed()
    # The explorer is live once its readout and its first figure have arrived.
    page.wait_for_function(
        "() => [...document.querySelectorAll('.widget-html-content')].some("
        "e => e.innerText.includes('tokens per target call'))"
        " && [...document.querySelectorAll('.widget-image')].some(i => i.getAttribute('src'))",
        timeout=60_000,
    )
    page.screenshot(path=str(ARTIFACTS / "lesson02_explorer_before.png"))
    for name, slider in sliders.items():
        assert slider.count() == 1, f"the explorer's {name} slider is missing"
        before_text, before_image = _explorer_state(page)
        before_value = slider.locator(".widget-readout").inner_text()
        slider.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "([sel, old]) => { const r = [...document.querySelectorAll(sel)].filter("
            "e => e.innerText.includes('tokens per target call')).pop();"
            " return r && r.innerText !== old; }",
            arg=[".widget-html-content", before_text],
            timeout=30_000,
        )
        page.wait_for_function(
            "(old) => { const i = [...document.querySelectorAll('.widget-image')].pop();"
            " return i && i.getAttribute('src') !== old; }",
            arg=before_image,
            timeout=60_000,
        )
        after_text, after_image = _explorer_state(page)
        after_value = slider.locator(".widget-readout").inner_text()
        assert after_value != before_value, f"{name}: the slider's value did not move"
        assert after_text != before_text and after_image != before_image
    page.screenshot(path=str(ARTIFACTS / "lesson02_explorer_after.png"))
    state = page.evaluate(_NOTEBOOK_STATE)
    assert not state["errors"], state["errors"]
    # No widget failed to render (ipywidgets shows an error box in its place).
    assert (
        page.locator(".jupyter-widgets.widget-error, .jp-RenderedText:has-text('Error')").count()
        == 0
    )


# The speculative pane's committed text: its <pre> without the refused drafts.
_SPEC_TEXT = """() => { const pres = [...document.querySelectorAll('.specdec-watch pre')];
  if (!pres.length) return null; const c = pres[pres.length - 1].cloneNode(true);
  c.querySelectorAll('.sv-rejected').forEach(e => e.remove()); return c.textContent; }"""


def test_lesson_11_explorer_colours_the_learners_own_prompt(page, lab):
    pytest.importorskip("gguf", reason="needs the [llm] extra (lesson 11's model)")
    try:
        from specdec_course.llm import gguf_path

        gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    _open_and_run_all(page, lab, "lessons/explorer_check.ipynb")
    box = page.locator(".widget-textarea textarea").last
    box.wait_for(timeout=60_000)
    prompt = "Repeat this exactly: the lighthouse keeper lit the lamp at dusk every day."
    box.fill(prompt)
    page.locator("button", has_text="Generate").last.click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.sv-status')]"
        ".some(e => e.innerText.includes('done'))",
        timeout=120_000,
    )
    page.screenshot(path=str(ARTIFACTS / "lesson11_explorer.png"))
    status = page.locator(".sv-status").last.inner_text()
    assert "identical to plain" in status, status
    spans = {k: page.locator(f".specdec-watch .sv-{k}").count() for k in ("accepted", "target")}
    assert spans["target"] > 0 and spans["accepted"] > 0, spans
    colour = page.locator(".specdec-watch .sv-accepted").first.evaluate(
        "e => getComputedStyle(e).color"
    )
    assert colour == "rgb(26, 127, 55)", colour  # green: KINDS["accepted"]
    plain = page.locator(".widget-html-content pre").first.text_content()
    assert plain and page.evaluate(_SPEC_TEXT) == plain
    assert page.evaluate(_NOTEBOOK_STATE)["errors"] == []


def test_exercise_01_check_shows_the_not_attempted_table(page, lab):
    _open_and_run_all(page, lab, "exercises/ex01_residual.ipynb")
    summary = page.locator(".jp-OutputArea-output").filter(has_text="ex01: 0/10 points")
    summary.last.scroll_into_view_if_needed()
    text = summary.last.inner_text()
    for name in ("residual_distribution", "speculative_sample", "chi_square_p_value"):
        assert f"ex01.{name}" in text
    assert text.count("not attempted") == 3, text
    page.screenshot(path=str(ARTIFACTS / "ex01_check_not_attempted.png"))
    with contextlib.suppress(Exception):
        page.evaluate("() => window.jupyterapp.commands.execute('kernelmenu:shutdown')")
