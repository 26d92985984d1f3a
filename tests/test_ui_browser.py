"""The Dagster UI in a real browser: Debian's Chromium driven by Playwright against ``dagster dev``.

On a small data root built headless up to the orderings' diagnostics, the README's UI steps
(``DAGSTER_HOME=<root>/dagster``, no ``STRATA_CONFIG``: the root's recorded config) start the
server; the test opens the asset graph, clicks *Materialize* on ``diagnostics_report``, waits for
the run, and checks that the asset's page shows its metadata table, a rendered figure and its asset
check, and that its report's figures fit the dialog; then edits ``k`` in the config the UI reads,
sees a run launched before *Reload definitions* stop with the fix, reloads, and finds ``centroids``
"Unsynced" and the stale ``orderings`` partitions named by its ``up_to_date`` check. Screenshots
are kept under the test's ``tmp_path`` and copied to ``$STRATA_TEST_ARTIFACTS``.

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

from assets.loaded import LOADED_ENV
from pipeline.render.figures import MAX_WIDTH_PX

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


def _until(page, address: str, find, what: str):
    """Open ``address`` again until the locator ``find()`` returns is visible (what the sensor or a
    reload changes shows on a fresh page); fails with ``what`` after :data:`WAIT_S`."""
    from playwright.sync_api import expect

    deadline = time.monotonic() + WAIT_S
    while True:
        page.goto(address, wait_until="networkidle")
        try:
            found = find()
            expect(found).to_be_visible(timeout=10_000)
            return found
        except AssertionError:
            if time.monotonic() > deadline:
                pytest.fail(f"{what} within {WAIT_S} s")


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
    env.pop(LOADED_ENV, None)  # the code server is the first to load the definitions (assets/loaded.py)
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
                # every figure fits the dialog: none is cut on the right (pipeline/render/figures.py: MAX_WIDTH_PX)
                assert max(widths) <= MAX_WIDTH_PX, widths
                # (1 px of slack: an image the dialog scales down to its content box can end a fraction of
                # a pixel past it, from rounding, and is shown whole)
                cut = figures.evaluate_all("imgs => imgs.filter(i => i.getBoundingClientRect().right > "
                                           "i.closest('[role=dialog]').getBoundingClientRect().right - 20 + 1).length")
                assert cut == 0, f"{cut} figures pass the dialog's right edge"
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

                # k edited in the config the UI reads: a run launched before Reload definitions stops with the fix
                recorded = built_root / "strata_config.yaml"
                edited = yaml.safe_load(recorded.read_text())
                recorded.write_text(yaml.safe_dump({**edited, "k": edited["k"] + 1}, sort_keys=True))
                page.goto(f"{url}/assets/centroids", wait_until="networkidle")
                page.locator("button").filter(has_text=re.compile(r"^\s*Materialize\s*$")).first.click()
                page.locator("[data-sonner-toast]").filter(has_text="Launched run").get_by_text("View", exact=True).click()
                page.wait_for_url(re.compile(r"/runs/"))
                expect(page.get_by_text("RUN_FAILURE", exact=True)).to_be_visible()
                expect(page.get_by_text(re.compile(r"configuration of `centroids` changed since the Dagster definitions "
                                                   r"were loaded")).first).to_be_visible()
                _shot(page, shots, "7_run_before_reload")

                # after Reload definitions: Dagster marks centroids "Unsynced", and the up_to_date check of a
                # partitioned asset (orderings: 2 strategies) names its stale partitions (the sensor evaluates it)
                page.goto(f"{url}/asset-groups", wait_until="networkidle")
                page.get_by_role("button", name="Reload definitions").click()
                _until(page, f"{url}/assets/centroids", lambda: page.get_by_text(re.compile(r"^Unsynced")).first,
                       "centroids is not marked Unsynced")

                def up_to_date():
                    page.get_by_text("up_to_date", exact=True).first.click()
                    return page.get_by_text(re.compile(r"^2 of 2 partitions stale: random, greedy"))

                stale = _until(page, f"{url}/assets/orderings?view=checks", up_to_date,
                               "orderings' up_to_date check did not name its stale partitions")
                expect(stale).to_contain_text("config changed: k:")
                _shot(page, shots, "8_stale_partitions")
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
        # and the stale partitions, as the up_to_date check last said
        checks = instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey("orderings"), "up_to_date"), limit=1)
        assert checks[0].status.value == "FAILED"
