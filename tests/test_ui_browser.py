"""The Dagster UI in a real browser: Debian's Chromium driven by Playwright against ``dagster dev``.

On a small data root built headless up to the orderings' diagnostics, the README's UI steps
(``DAGSTER_HOME=<root>/dagster``, no ``STRATA_CONFIG``: the root's recorded config) start the
server; the test opens the asset graph, clicks *Materialize* on ``diagnostics_report``, waits for
the run, and checks that the asset's page shows its metadata table, a rendered figure and its asset
check. Screenshots are kept under the test's ``tmp_path`` and copied to ``$STRATA_TEST_ARTIFACTS``.

Skips when Chromium (``/usr/bin/chromium``, Debian's ``chromium`` package) or the ``playwright``
package is absent, unless ``STRATA_REQUIRE_BROWSER`` is set (``.ci/run`` sets it): then it fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import pytest
import yaml

from helpers import demo_slice, small_graph_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("STRATA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
WAIT_S = 300  # the longest any one wait may take (server start, the run), in seconds


def _need(ok: bool, reason: str) -> None:
    if ok:
        return
    if os.environ.get("STRATA_REQUIRE_BROWSER"):
        pytest.fail(f"{reason} (STRATA_REQUIRE_BROWSER is set)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"dagster dev did not answer on {url} within {WAIT_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def playwright_api():
    """Playwright's ``sync_playwright`` and ``expect``, once Chromium and the package are both there."""
    _need(CHROMIUM.is_file(), f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _need(False, "the playwright package is not installed (pip install -e '.[test]')")
    return sync_playwright, expect


@pytest.fixture(scope="module")
def built_root(playwright_api, tmp_path_factory) -> Path:
    """A small data root materialized headless up to ``ordering_diagnostics`` (``strata run``)."""
    tmp = tmp_path_factory.mktemp("ui")
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in demo_slice(200)))
    cfg = {**small_graph_config(corpus), "data_root": str(tmp / "root")}
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DAGSTER_HOME": "", "STRATA_HOME": "", "STRATA_CONFIG": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp / "cfg.yaml"),
                           "--select", "*ordering_diagnostics"], capture_output=True, text=True, env=env, cwd=tmp, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "root"


def _shot(page, shots: Path, name: str) -> Path:
    path = shots / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def test_materialize_from_the_ui_shows_metadata_figure_and_check(playwright_api, built_root, tmp_path):
    sync_playwright, expect = playwright_api
    assert (built_root / "strata_config.yaml").is_file()  # what the UI reads: no STRATA_CONFIG below

    shots = tmp_path / "screenshots"
    shots.mkdir()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "dagster_dev.log"
    env = {**os.environ, "DAGSTER_HOME": str(built_root / "dagster"), "STRATA_HOME": "", "STRATA_CONFIG": "",
           "PYTHONPATH": str(REPO)}
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "dagster", "dev", "-h", "127.0.0.1", "-p", str(port)],
                                  cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_server(url, server, log)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                page.set_default_timeout(WAIT_S * 1000)
                expect.set_options(timeout=WAIT_S * 1000)
                # a fresh instance greets with a "Join the Dagster community" dialog: skip it whenever it shows
                page.add_locator_handler(page.get_by_role("button", name="Skip"), lambda b: b.click())

                page.goto(f"{url}/asset-groups", wait_until="networkidle")
                for group in ("data", "representation", "orderings", "ablation"):
                    expect(page.get_by_text(group, exact=True).first).to_be_visible()
                _shot(page, shots, "1_asset_graph")

                page.goto(f"{url}/assets/diagnostics_report", wait_until="networkidle")
                expect(page.get_by_text("Never materialized")).to_be_visible()
                page.locator("button").filter(has_text=re.compile(r"^\s*Materialize\s*$")).first.click()
                toast = page.locator("[data-sonner-toast]").filter(has_text="Launched run")
                _shot(page, shots, "2_launched")
                toast.get_by_text("View", exact=True).click()  # the launched run's page follows it live
                page.wait_for_url(re.compile(r"/runs/"))
                expect(page.get_by_text("RUN_SUCCESS", exact=True)).to_be_visible()
                _shot(page, shots, "3_run")

                page.goto(f"{url}/assets/diagnostics_report", wait_until="networkidle")
                table = page.locator("table").filter(has_text="rows/figures")
                expect(table).to_be_visible()
                expect(table.locator("tr").filter(has_text="rows/strategies")).to_contain_text("2")
                for key in ("path", "wall_s", "report", "parameter_values"):
                    expect(table.locator("td").filter(has_text=re.compile(rf"^{key}$"))).to_be_visible()
                expect(table).to_contain_text(str(built_root / "report" / "diagnostics.md"))
                _shot(page, shots, "4_metadata")

                table.get_by_text("[Show Markdown]").click()
                dialog = page.get_by_role("dialog")
                figures = dialog.locator("img[src^='data:image/png']")
                expect(figures.first).to_be_visible()
                widths = figures.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
                assert len(widths) >= 5 and min(widths) > 0, widths  # decoded, not broken images
                expect(dialog.get_by_text("ordering_bars", exact=True)).to_be_visible()
                figures.first.scroll_into_view_if_needed()
                _shot(page, shots, "5_figure")
                page.keyboard.press("Escape")

                page.get_by_role("tab", name="Checks").click()
                expect(page.get_by_text("report_covers_strategies").first).to_be_visible()
                expect(page.get_by_text("Passed", exact=True)).to_be_visible()
                # passing means the UI read the recorded config: under the defaults, 5 strategies have no ordering
                expect(page.get_by_text(re.compile(r"^2 strategies, \d+ figures$"))).to_be_visible()
                _shot(page, shots, "6_checks")
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        if os.environ.get("STRATA_TEST_ARTIFACTS") and shots.is_dir():
            dest = Path(os.environ["STRATA_TEST_ARTIFACTS"]) / "ui_browser"
            shutil.copytree(shots, dest, dirs_exist_ok=True)
            shutil.copy2(log, dest / log.name)

    # what the UI showed is what the instance recorded: one run, the check passed under the recorded config
    with dg.DagsterInstance.from_config(str(built_root / "dagster")) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("diagnostics_report"))
        assert event is not None and event.asset_materialization.metadata["rows/strategies"].value == 2
        checks = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey("diagnostics_report"), "report_covers_strategies"), limit=10)
        assert [c.status.value for c in checks] == ["SUCCEEDED"]
