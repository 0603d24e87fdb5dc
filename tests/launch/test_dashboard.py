"""The live web dashboard: its JSON and page over real HTTP on loopback, the token rule, and a real
headless Chromium watching a real run advance (issue 13, item 3)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from ddiloco.launch.dashauth import view_credential
from ddiloco.launch.dashboard import Dashboard

from ..support.runtime import wait_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_page_and_state_over_http():
    state = {"version": 3, "learners": [{"id": 0, "state": "running"}], "history": []}
    board = Dashboard(lambda: state)
    url = board.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        code, body = get(url + "state.json")
        assert code == 200 and json.loads(body)["version"] == 3
        state["version"] = 4  # the JSON is computed per request
        assert json.loads(get(url + "state.json")[1])["version"] == 4
        code, page = get(url)
        assert code == 200 and b'id="version"' in page and b"state.json" in page
        assert get(url + "nothing")[0] == 404
    finally:
        board.stop()


def test_a_token_guards_page_and_state_with_its_view_credential():
    board = Dashboard(lambda: {"version": 1}, token="s3cret")
    opened = board.start()  # the address to open carries the view credential (issue 46)
    url, view = board.url, view_credential("s3cret")
    try:
        assert get(url + "state.json")[0] == 401 and get(url)[0] == 401
        assert get(url + "state.json", {"X-Ddiloco-View": "wrong"})[0] == 401
        assert get(url + "state.json", {"X-Ddiloco-View": view})[0] == 200
        assert get(opened)[0] == 200 and opened == f"{url}?view={view}"
    finally:
        board.stop()


def dump_dom(url: str, wait_ms: int, screenshot: str | None = None) -> str:
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--virtual-time-budget={wait_ms}",
        "--window-size=1200,900",
    ]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=120)
    return out.stdout


def shown(dom: str, element: str) -> str:
    match = re.search(rf'id="{element}">([^<]*)<', dom)
    return match.group(1) if match else ""


@pytest.mark.timeout(240)
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)")
def test_chromium_sees_the_run_advance(tmp_path, shakespeare, procs):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "ddiloco",
        "run",
        "--model-size",
        "tiny",
        "--seq-len",
        "16",
        "--data",
        shakespeare,
        "--batch-size",
        "4",
        "--learners",
        "2",
        "--fragments",
        "2",
        "--sync-every",
        "4",
        "--heartbeat",
        "0.2",
        "--duration",
        "90",
        "--min-step-seconds",
        "0.05",
        "--eval-every",
        "2",
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    child = procs.start("run", cmd, tmp_path / "run.stderr", tmp_path / "run.stdout")
    url = wait_for(
        lambda: (run_dir / "dashboard.url").is_file() and (run_dir / "dashboard.url").read_text().strip(),
        60,
        0.2,
        "the dashboard's address",
    )

    def version_and_count() -> tuple[int, int]:
        dom = dump_dom(url, 2500)
        version, count = shown(dom, "version"), shown(dom, "learner-count")
        return (int(version), int(count)) if version.isdigit() and count.isdigit() else (-1, -1)

    first = wait_for(lambda: (v := version_and_count())[1] == 2 and v, 90, 1.0, "both learners running on the page")
    later = wait_for(lambda: (v := version_and_count())[0] > first[0] and v, 60, 1.0, "the version shown to advance")
    assert later[0] > first[0] >= 0 and later[1] <= 2
    shot = tmp_path / "dashboard.png"
    dump_dom(url, 3000, screenshot=str(shot))
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("DDILOCO_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["DDILOCO_KEEP_SCREENSHOT"])
    child.signal(2)  # Ctrl+C: the run stops in order
    deadline = time.monotonic() + 60
    while child.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
