"""JupyterLab as a student meets it: the server that `make lab` starts, driven by a real headless
Chromium. Notebook 00 opens first and runs without an error, `lessons/` is in the file browser
at the repository's root, and a Lab terminal would find the venv's Python.

Needs Debian's `chromium` and a venv that `make lab` or `make test` installed; CI has both
(`.ci/run` installs chromium). Elsewhere: `apt-get install chromium`, then
`.venv/bin/python -m pytest tests/test_lab_browser.py`.
"""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NOTEBOOK = "notebooks/00_setup_and_tour.ipynb"
TOKEN = "course-smoke-test"


def _venv_ready() -> bool:
    """`make lab` would start the server at once, installing nothing."""
    dry_run = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True)
    return dry_run.returncode == 0 and "tools/install.py" not in dry_run.stdout


# CI installs chromium (.ci/run), so there a missing browser fails the test instead of skipping it.
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="no chromium here"),
    pytest.mark.skipif(not _venv_ready(), reason="no venv from `make lab`/`make test` here"),
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(what: str, ready, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.load(response)
    except OSError:
        return None


class Page:
    """One Chromium tab, driven through the DevTools protocol (JavaScript in, JSON out)."""

    def __init__(self, debug_port: int):
        import websocket  # websocket-client, which jupyter-server already needs

        listing = f"http://127.0.0.1:{debug_port}/json"
        targets = _wait_for("Chromium's DevTools", lambda: _get_json(listing), 30)
        page = next(target for target in targets if target["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=120)
        self.next_id = 0

    def evaluate(self, expression: str):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": "Runtime.evaluate", "params": {
            "expression": expression, "awaitPromise": True, "returnByValue": True}}))
        while True:
            reply = json.loads(self.socket.recv())
            if reply.get("id") == self.next_id:
                result = reply["result"]
                if "exceptionDetails" in result:
                    raise AssertionError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
                return result["result"].get("value")


# Headless, nothing has focus, so `shell.currentWidget` stays empty: find the notebook among the
# main area's widgets instead.
PANEL = ("Array.from(jupyterapp.shell.widgets('main'))"
         f".find(w => w.context && w.context.path === '{NOTEBOOK}')")
KERNEL_IDLE = f"(() => {{ const w = {PANEL}; const s = w && w.sessionContext.session;" \
              " return !!(s && s.kernel && s.kernel.status === 'idle'); })()"
CELLS_DONE = f"(() => {{ const w = {PANEL};" \
             " const code = w.content.widgets.filter(c => c.model.type === 'code');" \
             " return code.length > 0 && code.every(c => c.model.executionCount !== null) &&" \
             " w.sessionContext.session.kernel.status === 'idle'; })()"
ERRORS = f"{PANEL}.content.widgets.filter(c => c.model.type === 'code')" \
         ".flatMap(c => c.model.outputs.toJSON()).filter(o => o.output_type === 'error')" \
         ".map(o => o.ename + ': ' + o.evalue)"
ROOT_LISTING = "Array.from(document.querySelectorAll('.jp-DirListing-itemText')).map(e => e.textContent)"


@pytest.fixture
def lab(tmp_path):
    """The server `make lab` starts, on a free port, with autosave off (the test must leave the
    tracked notebook untouched) and Lab's state in a temporary folder."""
    settings = tmp_path / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    port = _free_port()
    arguments = (f"--no-browser --ServerApp.port={port} --ServerApp.port_retries=0 "
                 f"--IdentityProvider.token={TOKEN} --LabApp.expose_app_in_browser=True")
    environment = dict(os.environ, COURSE_IMPL="solutions",
                       JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
                       JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
                       JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={arguments}"], cwd=ROOT,
                              env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        status = f"http://127.0.0.1:{port}/api/status?token={TOKEN}"
        _wait_for("the Jupyter server", lambda: _get_json(status), 120)
        yield port, server
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture
def page():
    assert CHROMIUM, "CI needs Debian's chromium for this test: .ci/run installs it"
    debug_port = _free_port()
    profile = tempfile.mkdtemp(prefix="course-chromium-")
    browser = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--remote-debugging-port={debug_port}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield Page(debug_port)
    finally:
        browser.terminate()
        browser.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


def _server_path(server: subprocess.Popen) -> str:
    """PATH as the Jupyter server (and so every Lab terminal and kernel) sees it."""
    # The jupyter-lab process itself: `make` and its shell set PATH only for the command they run.
    children = subprocess.run(["pgrep", "-s", str(server.pid), "-f", "jupyter-lab"], capture_output=True,
                              text=True)
    for pid in children.stdout.split():
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        for entry in environ:
            if entry.startswith(b"PATH="):
                return entry[5:].decode()
    return ""


def test_make_lab_opens_notebook_00_which_runs_and_lessons_is_one_click_away(lab, page):
    port, server = lab
    notebook_before = (ROOT / NOTEBOOK).read_bytes()
    page.evaluate(f"window.location.href = 'http://127.0.0.1:{port}/?token={TOKEN}'; true")

    _wait_for("notebook 00 to open", lambda: page.evaluate(f"!!window.jupyterapp && !!{PANEL}"), 120)
    _wait_for("the notebook's kernel", lambda: page.evaluate(KERNEL_IDLE), 120)
    page.evaluate(f"(() => {{ jupyterapp.shell.activateById({PANEL}.id);"
                  " return jupyterapp.commands.execute('notebook:run-all-cells').then(() => true); })()")
    _wait_for("every cell of notebook 00 to run", lambda: page.evaluate(CELLS_DONE), 600, every=2)
    assert page.evaluate(ERRORS) == []

    page.evaluate("jupyterapp.commands.execute('filebrowser:go-to-path', {path: '/'}).then(() => true)")
    listing = _wait_for("the file browser at the root",
                        lambda: (lambda names: names if "lessons" in (names or []) else None)(
                            page.evaluate(ROOT_LISTING)), 60)
    assert {"lessons", "notebooks", "course"} <= set(listing)

    assert _server_path(server).split(":")[0] == str(ROOT / ".venv" / "bin")
    assert (ROOT / NOTEBOOK).read_bytes() == notebook_before  # autosave off: nothing written
