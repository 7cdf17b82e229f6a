"""``tpudash.web.colab.show()``: the real function, with Colab's output module provided at its seam.

Inside Colab it starts ``tpudash serve`` once, on a free port, and hands
that port to ``google.colab.output.serve_kernel_port_as_iframe``; outside
Colab it prints the URL. The fake module records the call; the server it
names is real and is asked for the page.
"""

from __future__ import annotations

import subprocess
import sys
import types

import psutil
import pytest

from tests.conftest import REPO_ROOT
from tests.serve_process import http_get
from tpudash import colab
from tpudash.web.colab import embed_path


@pytest.fixture(autouse=True)
def stop_the_server(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUDASH_RUNS_DIR", str(tmp_path / "runs"))
    yield
    colab.stop()


@pytest.fixture
def in_colab(monkeypatch):
    calls = []
    output = types.ModuleType("google.colab.output")
    output.serve_kernel_port_as_iframe = lambda port, **options: calls.append((port, options))
    package = types.ModuleType("google.colab")
    package.output = output
    monkeypatch.setitem(sys.modules, "google.colab", package)
    monkeypatch.setitem(sys.modules, "google.colab.output", output)
    return calls


@pytest.fixture
def outside_colab(monkeypatch):
    # None in sys.modules makes the import fail, as on a machine without Colab.
    monkeypatch.setitem(sys.modules, "google.colab", None)


def test_show_in_colab_serves_the_dashboard_port_as_an_iframe_once(in_colab):
    colab.show(height=480)
    assert len(in_colab) == 1
    port, options = in_colab[0]
    token = colab._server.token
    assert options == {"path": f"/?token={token}&embed=1", "height": "480"}
    # Colab's proxy reaches the kernel's port under a host name of its own.
    status, page = http_get(port, options["path"], "abc-8000-colab.googleusercontent.com")
    assert status == 200 and b"static/js/textual.js" in page
    server = psutil.Process(colab._server.process.pid)
    assert server.cmdline()[-4:] == ["serve", "--port", "0", "--allow-any-host-header"]

    colab.show()
    assert [call[0] for call in in_colab] == [port, port]
    assert colab._server.process.pid == server.pid


def test_the_colab_frame_works_without_a_cookie_and_nothing_works_without_the_token(in_colab):
    colab.show()
    ((port, options),) = in_colab
    proxy = "abc-8000-colab.googleusercontent.com"
    token = colab._server.token
    assert options["path"] == embed_path(token)
    # Cross-site, the frame is sent no SameSite=Strict cookie: the page is served, not redirected to one,
    # and every address it asks for itself carries the token.
    status, page = http_get(port, options["path"], proxy)
    assert status == 200
    for address in ("static/js/textual.js", "static/css/xterm.css", "static/fonts/RobotoMono-VariableFont_wght.ttf"):
        assert f"{address}?token={token}".encode() in page
        assert http_get(port, f"/{address}?token={token}", proxy)[0] == 200
    assert f'const token = "{token}"'.encode() in page
    # Any Host is accepted behind Colab's proxy, but never without the token.
    assert http_get(port, "/", proxy)[0] == 403
    assert http_get(port, "/?embed=1", proxy)[0] == 403
    assert http_get(port, "/static/js/textual.js", proxy)[0] == 403


def test_show_outside_colab_prints_the_url_and_stop_ends_the_server(outside_colab, capsys):
    colab.show(tpu="none", cpu_devices=2)
    out = capsys.readouterr().out
    url = colab.url()
    assert url is not None and f"the dashboard is at {url}" in out
    port = colab._server.port
    assert url == f"http://127.0.0.1:{port}/?token={colab._server.token}"
    path = url.split(f":{port}", 1)[1]
    assert http_get(port, path, f"127.0.0.1:{port}")[0] == 302  # to the cookie, as in any browser
    # Not behind Colab's proxy: the loopback server answers to loopback names only.
    assert http_get(port, path, "attacker.example")[0] == 403
    server = colab._server.process
    assert psutil.Process(server.pid).cmdline()[2:] == [
        "tpudash",
        "--tpu",
        "none",
        "--cpu-devices",
        "2",
        "serve",
        "--port",
        "0",
    ]
    colab.stop()
    assert server.poll() == 0 and colab.url() is None


def test_show_with_other_options_replaces_the_server(outside_colab, capsys):
    colab.show()
    first = colab._server.process
    colab.show(cpu_devices=2)
    assert first.poll() == 0 and colab._server.process.pid != first.pid


@pytest.mark.parametrize(
    "height, why",
    [(50, "50 is out of range"), ("600", "'600' is not a whole number"), (True, "True is not a whole number")],
)
def test_a_bad_height_is_refused_naming_it(height, why, outside_colab):
    with pytest.raises(ValueError, match=f"height: {why}"):
        colab.show(height=height)
    assert colab._server is None


def test_importing_tpudash_colab_loads_neither_tensorflow_nor_textual_nor_the_web_server():
    code = (
        "import sys, tpudash.web.colab; print(sorted(m for m in ('tensorflow', 'textual', 'aiohttp', "
        "'textual_serve') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.strip() == "[]", result.stderr
