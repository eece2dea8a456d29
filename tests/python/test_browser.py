"""The dashboard and the strategy lab's report in a real browser: headless Chromium (Debian's chromium, driven through
chromium-driver by Selenium) loads /ui from a running sluice under load and the report `sluice simulate` writes, checks
that the charts are drawn with the expected series and the tables with the expected numbers, and keeps screenshots in
target/browser/ as test artefacts (the README shows them)."""

import csv
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from conftest import REPO

ARTEFACTS = REPO / "target" / "browser"
TOKEN = "ui-secret"


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,1600"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(what: str, check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:  # the page may be between two refreshes
            last = e
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout}s (last: {last!r})")


def status_of(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def load(target: str, stop: threading.Event) -> None:
    """50 requests a second from one address (its limit is 10 a second: most are denied), 5 from another."""
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        def ask(address: str) -> None:
            entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=address)
            descriptor = ratelimit_pb2.RateLimitDescriptor(entries=[entry])
            stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor]), timeout=5)

        n = 0
        while not stop.is_set():
            ask("198.51.100.7")
            if n % 10 == 0:
                ask("10.0.0.1")
            n += 1
            time.sleep(0.02)


def test_dashboard_draws_live_outcomes_under_load(start_sluice, browser):
    server = start_sluice(REPO / "deploy" / "config", "--admin-token", TOKEN)
    base = f"http://127.0.0.1:{server.http_port}"
    assert status_of(f"{base}/ui") == 401, "the dashboard is behind the admin token"
    assert status_of(f"{base}/ui/chart.svg?domain=nope", TOKEN) == 404
    assert status_of(f"{base}/ui/api/overview?domain=nope", TOKEN) == 404
    with urllib.request.urlopen(urllib.request.Request(f"{base}/ui", headers={"Authorization": f"Bearer {TOKEN}"})) as r:
        assert len(r.read()) < 200_000, "the page stays light"
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(server.grpc_target, stop), daemon=True)
    loader.start()
    try:
        browser.get(f"{base}/ui?token={TOKEN}&domain=edge")
        legend = lambda: {t.text for t in browser.find_elements(By.CSS_SELECTOR, "#chart svg text")}
        wait_for(
            "the chart draws allowed and denied for the limited rule",
            lambda: {"edge.remote_address allowed", "edge.remote_address denied"} <= legend(),
        )
        lines = browser.find_elements(By.CSS_SELECTOR, "#chart svg polyline")
        assert len(lines) >= 2, "a line per series"

        def rule_row():
            for row in browser.find_elements(By.CSS_SELECTOR, "#rules tbody tr"):
                cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
                if cells and cells[0] == "edge.remote_address":
                    return cells
            return None

        cells = wait_for("the rules table counts the last minute", lambda: (c := rule_row()) and int(c[3]) > 20 and c)
        assert cells[1] == "10 per second (fixed_window)"
        assert int(cells[2]) > 0 and int(cells[3]) > 0

        def offender():
            for row in browser.find_elements(By.CSS_SELECTOR, "#offenders tbody tr"):
                cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
                if cells[:2] == ["edge.remote_address", "remote_address=198.51.100.7"]:
                    return cells
            return None

        cells = wait_for("the top offender is named", offender)
        assert int(cells[2]) > 0 and int(cells[3]) >= int(cells[2])
        rlqs = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#rlqs tbody tr")]
        assert any(r.startswith("sluice_rlqs_streams") for r in rlqs), rlqs
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTEFACTS / "dashboard.png"))
    finally:
        stop.set()
        loader.join(timeout=10)


def test_simulate_report_draws_each_strategy(sluice_bin: Path, tmp_path: Path, browser):
    out = tmp_path / "report"
    subprocess.run(
        [
            str(sluice_bin), "simulate",
            "--config", "deploy/simulate/rules.yaml",
            "--traffic", "deploy/simulate/bursty.yaml",
            "--algorithm", "sliding_log,leaky_bucket:20,token_bucket",
            "--out", str(out),
        ],
        cwd=REPO, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    browser.get((out / "report.html").as_uri())
    charts = browser.find_elements(By.CSS_SELECTOR, "figure svg")
    assert len(charts) == 8, "one chart of every strategy, worst window, fairness and delay, one per strategy"
    overview = {t.text for t in browser.find_elements(By.CSS_SELECTOR, "#admitted svg text")}
    assert {"offered", *(row["algorithm"] for row in summary)} <= overview, overview
    series = {"offered", *(row["algorithm"] for row in summary)}
    for figure in browser.find_elements(By.CSS_SELECTOR, "#admitted, figure.algorithm"):
        svg = figure.find_element(By.TAG_NAME, "svg").rect
        texts = figure.find_elements(By.CSS_SELECTOR, "svg text")
        lines = figure.find_elements(By.CSS_SELECTOR, "svg polyline")
        # The series' lines, not the legend's short swatches.
        data_bottom = max(line.rect["y"] + line.rect["height"] for line in lines if line.rect["width"] > 100)
        legend = {"admitted", "denied"} if figure.get_attribute("id") != "admitted" else series
        names = [t for t in texts if t.text in legend]
        # The legend sits under the data, never over it.
        assert names and all(t.rect["y"] > data_bottom for t in names), [(t.text, t.rect) for t in names]
        numbers = [t for t in texts if t.text.replace(".", "", 1).isdigit()]
        assert len(numbers) > 6
        for t in numbers:
            assert not t.text.endswith(".0"), f"a needless decimal: {t.text}"
            # Every tick label, the last one included, is inside the chart.
            assert t.rect["x"] + t.rect["width"] <= svg["x"] + svg["width"], (t.text, t.rect, svg)
    # The worst window over the limit and fairness are drawn, a bar per strategy with its value.
    for chart, column in (("#worst-window", "overshoot"), ("#fairness", "fairness")):
        texts = [t.text for t in browser.find_elements(By.CSS_SELECTOR, f"{chart} svg text")]
        for row in summary:
            assert row["algorithm"] in texts, (row["algorithm"], texts)
            values = [float(t) for t in texts if t.replace(".", "", 1).isdigit()]
            assert float(row[column]) in values, (row[column], texts)
        assert len(browser.find_elements(By.CSS_SELECTOR, f"{chart} svg rect")) == 1 + len(summary)
    for figure in browser.find_elements(By.CSS_SELECTOR, "figure.algorithm"):
        names = {t.text for t in figure.find_elements(By.CSS_SELECTOR, "svg text")}
        assert {"admitted", "denied"} <= names
        assert figure.find_elements(By.CSS_SELECTOR, "svg polyline"), "its lines are drawn"
    rows = browser.find_elements(By.CSS_SELECTOR, "#figures tr")[1:]
    shown = [[c.text for c in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [r[0] for r in shown] == [row["algorithm"] for row in summary]
    for cells, row in zip(shown, summary):
        assert cells[1:4] == [row["requests"], row["admitted"], row["denied"]]
        assert cells[5] == f"{float(row['overshoot']):.2f}"
    sliding = next(r for r in summary if r["algorithm"] == "sliding_log")
    assert float(sliding["overshoot"]) == 1.0
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTEFACTS / "simulate-report.png"))
