"""``tpudash serve`` in a real browser: Debian's chromium, headless, driven by playwright.

The page is opened as a user opens it, from the URL ``tpudash serve``
printed (its token leaves the address bar once the cookie is set); the
dashboard's first frame must arrive, keys typed into the page must reach the dashboard (``g`` runs
gradient descent and its run is recorded done; ``h`` opens History), over
the WebSocket and over the HTTP polling transport Colab needs. A screenshot
is kept. Skipped, with the reason, where chromium (``apt-get install
chromium``; .ci/run installs it) or playwright is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.serve_process import start_server

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FIRST_FRAME_TIMEOUT_MS = 60_000
FREED_WITHIN_SECONDS = 20.0  # a closed tab's place, given back: well before an abandoned poll is reaped (45 s)
RUN_DONE_TIMEOUT_S = 240.0  # the engine imports TensorFlow first, on a loaded 2-core machine
LEAD_SCREENSHOT = Path("/tmp/serve_screenshot.png")
DASHBOARD_TEXT = "tpudash"  # the header's title

# Runs in the page before any of its scripts: records, against the page's own
# clock (milliseconds since navigation started), when the dashboard's text
# first arrives, and keeps the text the terminal was sent — over the native
# WebSocket, or in the polling transport's read responses.
RECORDER = """
(() => {
  const seen = {text: "", firstTextAt: null, connectedAt: null};
  window.__tpudash = seen;
  const decoder = new TextDecoder();
  const record = (bytes) => {
    seen.text = (seen.text + decoder.decode(bytes, {stream: true})).slice(-400000);
    if (seen.firstTextAt === null && seen.text.includes("DASHBOARD_TEXT")) seen.firstTextAt = performance.now();
  };
  const NativeWebSocket = window.WebSocket;
  window.WebSocket = class extends NativeWebSocket {
    constructor(...args) {
      super(...args);
      this.addEventListener("open", () => { seen.connectedAt = performance.now(); });
      this.addEventListener("message", (event) => {
        if (event.data instanceof ArrayBuffer) record(new Uint8Array(event.data));
      });
    }
  };
  const nativeFetch = window.fetch;
  window.fetch = async (...args) => {
    const response = await nativeFetch(...args);
    if (String(args[0]).includes("/open?")) seen.connectedAt = performance.now();
    if (String(args[0]).includes("/read?")) {
      const body = new Uint8Array(await response.clone().arrayBuffer());
      for (let at = 0; at + 5 <= body.length;) {
        const size = ((body[at + 1] << 24) | (body[at + 2] << 16) | (body[at + 3] << 8) | body[at + 4]) >>> 0;
        if (body[at] === 66) record(body.slice(at + 5, at + 5 + size));
        at += 5 + size;
      }
    }
    return response;
  };
})();
""".replace("DASHBOARD_TEXT", DASHBOARD_TEXT)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install '.[test]')")
    if not Path(CHROMIUM).exists():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    server = start_server(root)
    yield server, root / "runs"
    server.stop()


def open_dashboard(browser, url: str):
    """A new tab on ``url``; returns the page and the first frame's time (ms since navigation started).

    Also prints when the page had its connection to the server: the rest is
    the dashboard process starting.
    """
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.add_init_script(RECORDER)
    page.goto(url)
    # The token went into an HttpOnly cookie: not in the address bar, not readable by the page's scripts.
    assert "token=" in url and "token=" not in page.url, page.url
    assert "token" not in page.evaluate("document.cookie") and page.evaluate("document.cookie") == ""
    # textual.js marks the body once terminal bytes have been written to xterm.js.
    page.wait_for_function(
        "() => window.__tpudash.firstTextAt !== null && document.body.classList.contains('-first-byte')",
        timeout=FIRST_FRAME_TIMEOUT_MS,
    )
    first_frame_ms, connected_ms = page.evaluate("[window.__tpudash.firstTextAt, window.__tpudash.connectedAt]")
    print(f"\n{url}: first frame {first_frame_ms:.0f} ms after navigation started (connected at {connected_ms:.0f} ms)")
    return page, first_frame_ms


def finished_runs(runs_dir: Path, job: str) -> list[dict]:
    runs = []
    for record in runs_dir.glob("*/run.json"):
        try:
            run = json.loads(record.read_text())
        except (OSError, ValueError):
            continue  # replaced atomically, but may not exist yet
        if run.get("job") == job and run.get("status") not in (None, "running"):
            runs.append(run)
    return runs


def what_the_page_and_dashboards_said(page, runs_dir: Path) -> str:
    """The end of the page's terminal text, and of every dashboard's session log: what a failure needs to be read."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", page.evaluate("window.__tpudash.text"))
    logs = "".join(
        f"\n--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}" for log in sorted(runs_dir.glob(".logs/*.log"))
    )
    return f"the page's terminal, last lines:\n{text[-3000:]}{logs or chr(10) + 'no session log'}"


def test_the_dashboard_in_a_browser_runs_gradient_descent_from_a_key(browser, served, tmp_path):
    server, runs_dir = served
    page, _ = open_dashboard(browser, server.url + "&transport=websocket")
    # A click gives the page the keyboard (on an empty part of the Devices screen).
    page.mouse.click(1000, 700)
    page.keyboard.press("g")
    deadline = time.monotonic() + RUN_DONE_TIMEOUT_S
    while not (runs := finished_runs(runs_dir, "gradient-descent")):
        assert time.monotonic() < deadline, (
            f"no gradient-descent run finished in {runs_dir}: {server.log()}\n{what_the_page_and_dashboards_said(page, runs_dir)}"
        )
        page.wait_for_timeout(200)  # lets the page go on drawing while the run goes
    assert [run["status"] for run in runs] == ["done"]
    # The page has been sent the finished run (its result in the run view,
    # the notification) before the picture is taken.
    page.wait_for_function(
        "() => window.__tpudash.text.includes('0.0022596875205636024') "
        "&& window.__tpudash.text.includes('Run finished')",
        timeout=30_000,
    )
    screenshot = tmp_path / "serve_screenshot.png"
    page.screenshot(path=str(screenshot))
    shutil.copyfile(screenshot, LEAD_SCREENSHOT)
    print(f"screenshot: {screenshot} (also {LEAD_SCREENSHOT})")
    page.close()


def test_the_dashboard_over_http_polling_answers_keys(browser, served):
    server, runs_dir = served
    page, _ = open_dashboard(browser, server.url + "&transport=poll")
    page.mouse.click(1000, 700)
    page.keyboard.press("h")
    # History's title names the runs directory.
    page.wait_for_function(f"() => window.__tpudash.text.includes({json.dumps(str(runs_dir))})", timeout=30_000)
    page.close()


@pytest.mark.parametrize("transport", ["websocket", "poll"])
def test_a_tab_past_the_cap_says_why_and_a_closed_tab_frees_its_place(browser, tmp_path, transport):
    server = start_server(tmp_path, "--max-dashboards", "1")
    try:
        first, _ = open_dashboard(browser, f"{server.url}&transport={transport}")
        second = browser.new_page(viewport={"width": 1280, "height": 800})
        second.goto(f"{server.url}&transport={transport}")
        second.wait_for_function("() => document.body.classList.contains('-refused')", timeout=30_000)
        assert second.inner_text(".refused") == (
            "1 dashboard is open, the most this server allows (--max-dashboards); close one and reload"
        )
        assert second.is_visible(".refused")
        second.close()
        first.close()  # the tab closes: its place is given back
        # The closed tab says so on its way out (a WebSocket's close, a polling page's beacon), which the browser
        # delivers after close() returns: a tab opened at once may still find the place taken. It must be free
        # long before an abandoned poll is reaped (POLL_ABANDONED_SECONDS, 45 s).
        given_back_by = time.monotonic() + FREED_WITHIN_SECONDS
        while True:
            third = browser.new_page(viewport={"width": 1280, "height": 800})
            third.goto(f"{server.url}&transport={transport}")
            third.wait_for_function(
                "() => ['-refused', '-first-byte'].some((name) => document.body.classList.contains(name))",
                timeout=FIRST_FRAME_TIMEOUT_MS,
            )
            if not third.evaluate("document.body.classList.contains('-refused')"):
                break  # a dashboard in the place the first tab gave back
            third.close()
            assert time.monotonic() < given_back_by, (
                f"the closed tab's place was not given back in {FREED_WITHIN_SECONDS} s"
            )
        assert third.evaluate("document.body.classList.contains('-first-byte')")
        third.close()
    finally:
        server.stop()
