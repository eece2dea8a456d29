"""The dashboard and the strategy lab's report in a real browser: headless Chromium (Debian's chromium, driven through
chromium-driver by Selenium) loads /ui from a running sluice under a known load and reads the numbers back from the
page (per second, hovered, in total, over each range), and loads the report `sluice simulate` writes and checks that
its charts are drawn with the expected series and its tables with the expected numbers. Screenshots are kept in
target/browser/ as test artefacts (the README shows the dashboard's)."""

import contextlib
import csv
import re
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
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from conftest import REPO, redis_server, running_sluice
from test_rlqs import quota_stream

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


class Sent:
    """What the load sent and what sluice answered, per epoch second of the answer: allowed and denied."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_second: dict[int, list[int]] = {}

    def note(self, denied: bool) -> None:
        with self.lock:
            self.by_second.setdefault(int(time.time()), [0, 0])[int(denied)] += 1

    def totals(self) -> tuple[int, int]:
        with self.lock:
            return sum(a for a, _ in self.by_second.values()), sum(d for _, d in self.by_second.values())


def load(target: str, stop: threading.Event, sent: Sent) -> None:
    """50 requests a second from one address (its limit is 10 a second: most are denied), 5 from another, every
    answer counted in `sent`; and, not counted, 2 a second for /login (5 a minute: about 2 a second denied) and 10 a
    second for /api/ (3 per 30 s: about 10 a second denied)."""
    with grpc.insecure_channel(target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        def ask(*entries: tuple[str, str]) -> bool:
            descriptor = ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
            )
            answer = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor]), timeout=5)
            return answer.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT

        n = 0
        while not stop.is_set():
            sent.note(ask(("remote_address", "198.51.100.7")))
            if n % 10 == 0:
                sent.note(ask(("remote_address", "10.0.0.1")))
            if n % 25 == 0:
                ask(("path", "/login"))
            if n % 5 == 0:
                ask(("path", "/api/orders"), ("user", "ann"))
            n += 1
            time.sleep(0.02)


RULE = "edge.remote_address"


def row(browser, rule: str):
    return browser.find_element(By.CSS_SELECTOR, f'article.rule[data-rule="{rule}"]')


# In the page: a chart's legend, as shown, and the last second's values (the second, as the axis clock writes it,
# then each series' count), which the legend must show whenever the cursor is away from the chart.
LEGEND_JS = """
function legendAndLast(c) {
  const n = c.data[0].length - 1;
  const last = [clock(c.data[0][n], true), ...c.data.slice(1).map(d => String(d[n]))];
  const shown = [...c.root.querySelectorAll('.u-legend .u-value')].map(e => e.textContent);
  return [shown, last];
}
"""


def watch_legend(browser, rule: str, seconds: float, settle: float = 0.0) -> dict:
    """Reads the rule's chart legend every 10 ms for `seconds` from the moment the chart exists (the readings of the
    first `settle` seconds left out): how many readings, and the first ones that did not show the last second."""
    browser.set_script_timeout(seconds + 30)
    return browser.execute_async_script(
        LEGEND_JS
        + """
        const [rule, seconds, settle, done] = arguments;
        const wrong = [];
        let since = null, readings = 0;
        (function check() {
          const c = window.dashboard.charts.get(rule);
          if (c) {
            const now = performance.now();
            if (since === null) since = now;
            const [shown, last] = legendAndLast(c);
            if (now - since >= settle * 1000) {
              readings++;
              const at = Math.round(now - since);
              if (JSON.stringify(shown) !== JSON.stringify(last)) wrong.push({at, shown, last});
            }
            if (now - since > seconds * 1000) return done({readings, wrong: wrong.slice(0, 5)});
          }
          setTimeout(check, 10);
        })();
        """,
        rule,
        seconds,
        settle,
    )


def chart_data(browser, rule: str) -> list[list[int]]:
    """What the rule's chart draws: epoch seconds, allowed and denied per second."""
    return browser.execute_script("return window.dashboard.charts.get(arguments[0]).data;", rule)


def page_bytes(base: str) -> int:
    """The page and every asset it links, as a browser loads them."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with urllib.request.urlopen(urllib.request.Request(f"{base}/ui", headers=auth)) as r:
        page = r.read().decode()
    links = re.findall(r'(?:href|src)="(/ui/assets/[^"]+)"', page)
    assert len(links) == 4, links
    total = len(page.encode())
    for link in links:
        with urllib.request.urlopen(urllib.request.Request(base + link, headers=auth)) as r:
            total += len(r.read())
    return total


def test_dashboard_reads_back_the_load_it_was_sent(start_sluice, browser):
    server = start_sluice(REPO / "deploy" / "config", "--admin-token", TOKEN)
    base = f"http://127.0.0.1:{server.http_port}"
    for path in ("/ui", "/ui/assets/dashboard.js", "/ui/assets/uPlot.iife.min.js", "/ui/api/series?domain=edge"):
        assert status_of(base + path) == 401, f"{path} is behind the admin token"
    # An unknown /ui path too: 401 without the token, 404 only with it.
    for path in ("/ui/", "/ui/nope", "/ui/api/nope", "/ui/assets/nope.css"):
        assert status_of(base + path) == 401, f"{path} is behind the admin token"
        assert status_of(base + path, TOKEN) == 404, path
    assert status_of(f"{base}/ui/api/overview?domain=nope", TOKEN) == 404
    assert status_of(f"{base}/ui/api/series?domain=nope", TOKEN) == 404
    assert status_of(f"{base}/ui/api/series", TOKEN) == 400
    assert status_of(f"{base}/ui/api/series?domain=edge&range=7", TOKEN) == 400
    # Small counts, for the y axes' ticks: 6 requests in one second (in shadow mode: all allowed).
    time.sleep(1.05 - time.time() % 1)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for key, value in [("plan", "trial")] * 6:
            entry = ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
            descriptor = ratelimit_pb2.RateLimitDescriptor(entries=[entry])
            stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor]), timeout=5)
    weight = page_bytes(base)
    assert weight < 200_000, f"the page and its assets weigh {weight} bytes"
    sent = Sent()
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(server.grpc_target, stop, sent), daemon=True)
    loader.start()
    try:
        browser.get(f"{base}/ui?token={TOKEN}&domain=edge&range=60")
        # From the moment its chart appears, and across a refresh, the legend shows the last second.
        watched = watch_legend(browser, RULE, 2.5)
        assert watched["readings"] > 50 and not watched["wrong"], watched
        wait_for("the limited rule's chart", lambda: row(browser, RULE).find_elements(By.CSS_SELECTOR, "canvas"))
        wait_for("some 15 seconds of denials", lambda: int(row(browser, RULE).get_attribute("data-denied")) > 500, 40)
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        # The whole page and no blank tail: the window as tall as the page.
        height, chrome = browser.execute_script(
            "return [Math.ceil(document.body.getBoundingClientRect().bottom) + 20,"
            " window.outerHeight - window.innerHeight]"
        )
        browser.set_window_size(1100, height + chrome)
        browser.save_screenshot(str(ARTEFACTS / "dashboard.png"))
        # Hovering the chart shows the values of the second under the cursor, below the chart (outside the data).
        over = row(browser, RULE).find_element(By.CSS_SELECTOR, ".u-over")
        ActionChains(browser).move_to_element_with_offset(over, int(over.size["width"] * 0.4), 0).perform()
        legend = [v.text for v in row(browser, RULE).find_elements(By.CSS_SELECTOR, ".u-legend .u-value")]
        hovered = browser.execute_script(
            "const c = window.dashboard.charts.get(arguments[0]); const i = c.cursor.idx;"
            "return [c.data[0][i], c.data[1][i], c.data[2][i]];",
            RULE,
        )
        assert legend[1:] == [str(hovered[1]), str(hovered[2])], (legend, hovered)
        assert hovered[2] > 0, f"a second of the load, 90 % across the last minute: {hovered}"
        # Away from the chart again, the legend shows the last second at once (after the mouse's events), and until
        # and across the next refresh.
        ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
        watched = watch_legend(browser, RULE, 2.3, settle=0.1)
        assert watched["readings"] > 50 and not watched["wrong"], watched
        # The y axes count whole requests: whole ticks only, on every chart (plan=trial's: 0 to 6 a second).
        ticks = browser.execute_script(
            "return [...window.dashboard.charts].map(([rule, c]) => [rule, c.axes[1]._splits, c.axes[1]._values]);"
        )
        assert len(ticks) >= 4, ticks
        for rule, splits, values in ticks:
            assert len(splits) >= 2 and all(float(v).is_integer() for v in splits), (rule, splits)
            assert all("." not in str(v) for v in values), (rule, values)
        # The most denied rules first: per the range in view, denied counts never rise down the page (then the
        # busiest); /api/ (about 10 denied a second) above /login (about 2) though its rule comes after.
        order = [
            (r.get_attribute("data-rule"), int(r.get_attribute("data-denied")), int(r.get_attribute("data-allowed")))
            for r in browser.find_elements(By.CSS_SELECTOR, "article.rule")
        ]
        busy = [o for o in order if o[1] + o[2] > 0]
        assert busy[0][0] == RULE, order
        assert all(a[1] >= b[1] for a, b in zip(busy, busy[1:])), order
        named = [o[0] for o in busy]
        api = next(n for n in named if "/api/" in n)
        login = next(n for n in named if "/login" in n)
        assert named.index(api) < named.index(login), order
        assert order[: len(busy)] == busy, f"rules with decisions before those without: {order}"
        # The header's clock is the axes': 24-hour; and no byte counts.
        status = browser.find_element(By.ID, "status").text
        now = time.localtime()
        assert re.fullmatch(r"updated ([01]\d|2[0-3]):[0-5]\d:[0-5]\d", status), status
        assert int(status[8:10]) in (now.tm_hour, time.localtime(time.time() - 10).tm_hour), (status, now)
        # The page asked for 15 minutes once, then only for the seconds after the last one it had.
        asked = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/ui/api/series'))"
        )
        assert len(asked) >= 3 and "since=" not in asked[0] and all("since=" in a for a in asked[1:]), asked
        # Per second, what was sent (an answer can fall on the other side of a second's edge: within 2).
        drawn = list(zip(*chart_data(browser, RULE)))
        busy = [(s, a, d) for s, a, d in drawn if a + d > 0]
        assert len(busy) >= 3, busy
        for second, allowed, denied in busy:
            a, d = sent.by_second.get(second, [0, 0])
            assert abs(allowed - a) <= 2 and abs(denied - d) <= 2, (second, allowed, denied, a, d)
    finally:
        stop.set()
        loader.join(timeout=10)
    allowed, denied = sent.totals()
    assert allowed > 50 and denied > 100, (allowed, denied)
    # Once the last second has settled, the 15 minutes on the page hold exactly what was sent.
    totals = lambda: tuple(int(row(browser, RULE).get_attribute(a)) for a in ("data-allowed", "data-denied"))
    wait_for("the page's totals match what was sent", lambda: totals() == (allowed, denied))
    ratio = float(row(browser, RULE).get_attribute("data-denial-ratio"))
    assert abs(ratio - denied / (allowed + denied)) < 1e-4
    assert f"{100 * denied / (allowed + denied):.1f} % denied" in row(browser, RULE).text
    # The ranges: 1, 5 and 15 minutes of seconds, each to the second before last.
    for label, seconds in (("5 min", 300), ("15 min", 900), ("1 min", 60)):
        browser.find_element(By.XPATH, f'//span[@id="ranges"]/button[text()="{label}"]').click()
        assert len(chart_data(browser, RULE)[0]) == seconds
        assert browser.find_element(By.ID, "rows").get_attribute("data-range") == str(seconds)
        assert int(row(browser, RULE).get_attribute("data-allowed")) == allowed, "the load is within every range"
    # Health: the store answers, the breakers are closed, one instance adds to the counts.
    store = browser.find_element(By.ID, "health-store")
    assert store.get_attribute("data-ready") == "true" and store.get_attribute("data-kind") == "memory", store.text
    assert "ready, answered a ping in" in store.text
    assert browser.find_element(By.ID, "health-breaker").get_attribute("data-state") == "closed"
    instances = browser.find_element(By.ID, "health-instances")
    assert instances.get_attribute("data-count") == "1" and "1 instance on this store" in instances.text, instances.text
    # The filter keeps the rules whose name holds what is typed.
    rules = browser.find_elements(By.CSS_SELECTOR, "article.rule")
    assert len(rules) >= 4, [r.get_attribute("data-rule") for r in rules]
    browser.find_element(By.ID, "filter").send_keys("remote")
    rules = browser.find_elements(By.CSS_SELECTOR, "article.rule")
    shown = [r.get_attribute("data-rule") for r in rules if r.is_displayed()]
    assert shown == [RULE]
    browser.find_element(By.ID, "filter").send_keys(Keys.BACKSPACE * len("remote"))
    assert all(r.is_displayed() for r in browser.find_elements(By.CSS_SELECTOR, "article.rule"))


def test_dashboard_names_every_limit_and_says_what_rlqs_does(start_sluice, browser):
    server = start_sluice(REPO / "deploy" / "config", "--admin-token", TOKEN)
    base = f"http://127.0.0.1:{server.http_port}"
    with quota_stream(server.grpc_target) as stream:
        stream.send("edge-quota", [({"name": "per_user", "user": "ann"}, 4, 1)])
        stream.receive()
        browser.get(f"{base}/ui?token={TOKEN}&domain=edge-quota")
        words = lambda: [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#rlqs-words li")]
        wait_for("RLQS in words", lambda: "1 RLQS stream is open on this instance, reporting 1 bucket." in words())
        assert "Envoys reported 4 requests allowed and 1 denied." in words(), words()
        assert not any("sluice_rlqs" in w for w in words()), "no metric names"
        share = wait_for("the stream's assignment", lambda: browser.find_elements(By.CSS_SELECTOR, "#shares li"))[0]
        assert share.get_attribute("data-bucket") == "name=per_user, user=ann"
        assert share.text.startswith("Envoy stream ") and "for name=per_user, user=ann" in share.text, share.text
        assert "good for 15 s" in share.text, share.text
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTEFACTS / "dashboard-rlqs.png"))
    # A cost report (llm's api_key rule counts a hit of a cost as a report of usage) is no decision: shown apart.
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="api_key", value="k-1")
        descriptor = ratelimit_pb2.RateLimitDescriptor(entries=[entry])
        for tokens in (300, 120_000, 5):
            request = rls_pb2.RateLimitRequest(domain="llm", descriptors=[descriptor], hits_addend=tokens)
            answer = stub.ShouldRateLimit(request, timeout=5)
            assert answer.overall_code == rls_pb2.RateLimitResponse.OK, "a report is never refused"
    # A rule of two limits shows both names.
    Select(browser.find_element(By.ID, "domain")).select_by_value("llm")
    key = wait_for(
        "the reports",
        lambda: row(browser, "llm.api_key").get_attribute("data-reported") == "3" and row(browser, "llm.api_key"),
    )
    assert (key.get_attribute("data-allowed"), key.get_attribute("data-denied")) == ("0", "0")
    assert "0 allowed, 0 denied · 3 costs reported · last second" in key.text, key.text
    labels = [t.text for t in key.find_elements(By.CSS_SELECTOR, ".u-legend .u-label")]
    assert labels == ["second", "allowed", "denied", "reported"], labels
    user = wait_for("the llm rules", lambda: row(browser, "llm.user"))
    names = [n.get_attribute("data-name") for n in user.find_elements(By.CSS_SELECTOR, ".limits .name")]
    assert names == ["user_tokens_per_minute", "user_tokens_per_day"], names
    assert "No decisions in the last 15 min." in user.text


def test_dashboard_sums_the_instances_on_one_store(sluice_bin: Path, tmp_path: Path, browser):
    args = ("--admin-token", TOKEN)
    with redis_server(tmp_path) as redis_url, contextlib.ExitStack() as stack:
        servers = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            config = REPO / "deploy" / "config"
            flags = (*args, "--redis-url", redis_url)
            servers.append(stack.enter_context(running_sluice(sluice_bin, config, tmp_path / name, flags)))
        a, b = servers
        for server, address, n in ((a, "192.0.2.1", 4), (b, "192.0.2.2", 3)):
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = rls_pb2_grpc.RateLimitServiceStub(channel)
                entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="remote_address", value=address)
                descriptor = ratelimit_pb2.RateLimitDescriptor(entries=[entry])
                request = rls_pb2.RateLimitRequest(domain="edge", descriptors=[descriptor])
                for _ in range(n):
                    stub.ShouldRateLimit(request, timeout=5)
        browser.get(f"http://127.0.0.1:{a.http_port}/ui?token={TOKEN}&domain=edge")
        wait_for("both instances' decisions, summed", lambda: row(browser, RULE).get_attribute("data-allowed") == "7")
        instances = wait_for(
            "both instances' heartbeats",
            lambda: (e := browser.find_element(By.ID, "health-instances")).get_attribute("data-count") == "2" and e,
        )
        assert "2 instances on this store" in instances.text, instances.text
        assert browser.find_element(By.ID, "health-store").get_attribute("data-kind") == "redis"


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
