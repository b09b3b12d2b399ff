"""The web console in a real headless browser: Debian's chromium driven by chromedriver through
Selenium, over a real `dmq server` and a real `dmq console` process.

  - the groups page shows each group's subscription badge in its colour (NEW green, ALL blue,
    TIMESTAMP yellow: the computed background colour, as the browser paints it) and the total
    lag `dmq groups describe` prints for it;
  - the group page shows the subscription card (mode, subscribed at, time since);
  - a topic's message browser shows the values produced;
  - an event store's page lists its groups (no name to type) and counts every event's type and tag;
  - with security on, a viewer signs in with their token and sees the groups their principal may
    describe (a cluster of its own, TLS and tokens).

Screenshots of each page (and of the overview) go to build/test-artifacts/console/. One browser session for the module.
`.ci/run` installs chromium and chromium-driver; elsewhere, without them, the module is skipped.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from collections.abc import Iterator

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)) and not os.environ.get("CI"):
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from dmq.client import AdminClient, Event, EventStore, Producer  # noqa: E402
from dmq.proto import dmq_pb2 as pb  # noqa: E402
from dmq.proto.security.acls import CLUSTER_RESOURCE, Acl  # noqa: E402
from tests.cli._console import MODES, ConsoleProcess, make_group, secure_cluster  # noqa: E402
from tests.cli.conftest import Dmq, ServerProcess  # noqa: E402
from tests.security.conftest import token_for  # noqa: E402

ARTIFACTS = pathlib.Path(__file__).resolve().parents[2] / "build" / "test-artifacts" / "console"
PAGE_LOAD_TIMEOUT_S = 30
TOPIC = "browser-orders"


def _rgb(colour: str) -> tuple[int, int, int]:
    """'rgba(45, 164, 78, 1)' or 'rgb(45, 164, 78)' as numbers."""
    inside = colour[colour.index("(") + 1: colour.index(")")]
    r, g, b = (int(float(x)) for x in inside.split(",")[:3])
    return r, g, b


@pytest.fixture(scope="module")
def console(server: ServerProcess) -> Iterator[ConsoleProcess]:
    proc = ConsoleProcess(server.bootstrap)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.stderr


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def groups(dmq: Dmq) -> dict[str, str]:
    """Three groups of TOPIC, one per subscription mode, each with its own lag: mode -> group id."""
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=2)
    with Producer(dmq.bootstrap) as p:
        for i in range(10):
            p.send(TOPIC, f"order-{i}".encode(), partition=i % 2).get(30)
    return {
        "new": make_group(dmq.bootstrap, TOPIC, "fresh", "new", {0: 5, 1: 5}),
        "all": make_group(dmq.bootstrap, TOPIC, "everything", "all", {0: 1, 1: 2}),
        "timestamp": make_group(dmq.bootstrap, TOPIC, "since", "timestamp", {0: 4},
                                from_ms=int(time.time() * 1000) - 60_000),
    }


def test_groups_page_badges_in_colour_with_the_cli_lag(browser: webdriver.Chrome, console: ConsoleProcess,
                                                        dmq: Dmq, groups: dict[str, str]) -> None:
    browser.get(console.url + "groups")
    browser.save_screenshot(str(ARTIFACTS / "groups.png"))
    # `dmq groups describe` once for every group (one process: each costs a second or more here).
    described = {d["group_id"]: d["total_lag"] for d in dmq.json("groups", "describe", "--all-groups")["groups"]}
    cli_lags = {mode: described[group] for mode, group in groups.items()}
    # The three lags differ, so a page showing one group's lag on another's row cannot pass.
    assert len(set(cli_lags.values())) == 3, cli_lags
    for mode, group in groups.items():
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-group="{group}"]')
        shown = row.find_element(By.CSS_SELECTOR, ".badge")
        assert shown.text == mode.upper()
        r, g, b = _rgb(shown.value_of_css_property("background-color"))
        if mode == "new":
            assert g > r + 60 and g > b + 60, (mode, r, g, b)  # green
        elif mode == "all":
            assert b > r + 100 and b > g + 60, (mode, r, g, b)  # blue
        else:
            assert r > 150 and g > 120 and b < 100, (mode, r, g, b)  # yellow
        assert row.find_element(By.CSS_SELECTOR, "td.lag").text == str(cli_lags[mode])


def test_group_page_shows_the_subscription_card(browser: webdriver.Chrome, console: ConsoleProcess,
                                                 groups: dict[str, str]) -> None:
    browser.get(console.url + "groups/" + groups["timestamp"])
    browser.save_screenshot(str(ARTIFACTS / "group.png"))
    card = browser.find_element(By.ID, "subscription")
    assert card.find_element(By.CSS_SELECTOR, ".badge").text == "TIMESTAMP"
    text = card.text
    assert "Subscribed at" in text and "UTC" in text and "Since subscription" in text and " ago" in text
    assert "From" in text
    partitions = browser.find_element(By.ID, "partitions").text
    assert "COMMITTED" in partitions and "LAG" in partitions


def test_overview_shows_a_healthy_cluster(browser: webdriver.Chrome, console: ConsoleProcess,
                                          server: ServerProcess) -> None:
    browser.get(console.url)
    browser.save_screenshot(str(ARTIFACTS / "overview.png"))
    assert browser.find_element(By.CSS_SELECTOR, ".health").text == "healthy"
    assert server.bootstrap in browser.find_element(By.ID, "brokers").text


def test_message_browser_shows_the_produced_values(browser: webdriver.Chrome, console: ConsoleProcess,
                                                    groups: dict[str, str]) -> None:
    browser.get(console.url + f"topics/{TOPIC}")
    browser.find_element(By.CSS_SELECTOR, "#browser button[type=submit]").click()
    _wait_for_id(browser, "summary")  # the results page has loaded (a click returns before it does)
    browser.save_screenshot(str(ARTIFACTS / "messages.png"))
    values = {e.text for e in browser.find_elements(By.CSS_SELECTOR, "table.records .value")}
    assert {f"order-{i}" for i in range(10)} <= values


def test_event_store_page_lists_groups_and_counts_every_event(browser: webdriver.Chrome, console: ConsoleProcess,
                                                               dmq: Dmq) -> None:
    store_name = "browser-orders-events"
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic(store_name, kind="event-store")
    # 150 events, so counts over the latest 100 would be wrong: order.placed 70 not 120, customer:ann 10 not 60.
    with EventStore(dmq.bootstrap, store_name) as store:
        store.append([Event("order.placed", b"", [f"customer:{'ann' if i < 60 else 'bob'}"]) for i in range(120)])
        store.append([Event("order.shipped", b"", ["customer:bob"]) for _ in range(30)])
        store.register_group("billing")
        store.register_group("shipping")
        claim = store.claim_next("billing", ["customer"], ["order.placed"], worker_id="biller-1")
        assert claim is not None
        browser.get(console.url + "events/" + store_name)
        browser.save_screenshot(str(ARTIFACTS / "event-store.png"))

        def counts(table_id: str) -> dict[str, str]:
            rows = browser.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")
            return dict(tuple(td.text for td in row.find_elements(By.TAG_NAME, "td")) for row in rows)

        assert counts("types") == {"order.placed": "120", "order.shipped": "30"}
        assert counts("tags") == {"customer:ann": "60", "customer:bob": "90"}
        groups = {row.find_element(By.TAG_NAME, "td").text: row.text
                  for row in browser.find_elements(By.CSS_SELECTOR, "#event-groups tbody tr")}
        assert set(groups) == {"billing", "shipping"}, groups
        browser.find_element(By.LINK_TEXT, "billing").click()  # the group's claims, no name typed
        claims = browser.find_element(By.ID, "claims").text
        browser.save_screenshot(str(ARTIFACTS / "event-group.png"))
        assert f"customer={claim.values['customer']}" in claims and "biller-1" in claims


def _wait_for_id(browser: webdriver.Chrome, element_id: str) -> WebElement:
    """The element once the page holding it has loaded (a condition with a deadline)."""
    try:
        return WebDriverWait(browser, PAGE_LOAD_TIMEOUT_S).until(
            expected_conditions.presence_of_element_located((By.ID, element_id)))
    except TimeoutException:
        raise AssertionError(f"no #{element_id} within {PAGE_LOAD_TIMEOUT_S}s at {browser.current_url}: "
                             f"{browser.find_element(By.TAG_NAME, 'body').text[:2000]}") from None


@pytest.fixture(scope="module")
def signed_console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ConsoleProcess, str]]:
    """A console over a cluster with security on, and the group alice may describe (beside one
    she may not): the console, the group's id."""
    with secure_cluster(tmp_path_factory.mktemp("secure-console")) as (cluster, ca):
        with AdminClient(cluster.bootstrap, ssl_cafile=ca, token=token_for("admin")) as admin:
            admin.create_topic("signed-orders", partitions=1)
            groups = [admin.cluster.group_stub().FindOrCreateGroup(
                pb.FindOrCreateGroupRequest(topic="signed-orders", app_id=app, subscription_mode=MODES["new"]),
                timeout=PAGE_LOAD_TIMEOUT_S).group_id for app in ("billing", "secret")]
            admin.add_acls([Acl.parse("alice", "cluster", CLUSTER_RESOURCE, "describe"),
                            Acl.parse("alice", "topic", "signed-orders", "describe"),
                            Acl.parse("alice", "group", groups[0], "describe")])
        proc = ConsoleProcess(cluster.bootstrap, env={"DMQ_SSL_CAFILE": ca})
        try:
            yield proc, groups[0]
        finally:
            assert proc.stop() == 0, proc.stderr


def test_a_viewer_signs_in_and_sees_the_groups_of_their_principal(
        browser: webdriver.Chrome, signed_console: tuple[ConsoleProcess, str]) -> None:
    console, group = signed_console
    try:
        browser.get(console.url + "groups")
        assert "/signin" in browser.current_url, browser.current_url  # no session: the sign-in form
        browser.save_screenshot(str(ARTIFACTS / "signin.png"))
        browser.find_element(By.NAME, "token").send_keys(token_for("alice"))
        browser.find_element(By.CSS_SELECTOR, "#signin button[type=submit]").click()
        # A click returns before the page it submits has loaded: wait for the groups page.
        table = _wait_for_id(browser, "groups")  # back where the viewer was going
        browser.save_screenshot(str(ARTIFACTS / "groups-signed-in.png"))
        assert browser.current_url == console.url + "groups"
        assert browser.find_element(By.ID, "principal").text == "alice"
        rows = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr")
        assert [r.get_attribute("data-group") for r in rows] == [group], table.text  # not G_signed-orders_secret
        assert rows[0].find_element(By.CSS_SELECTOR, ".badge").text == "NEW"
        browser.find_element(By.CSS_SELECTOR, "header form button[type=submit]").click()  # sign out
        _wait_for_id(browser, "signin")
        browser.get(console.url + "groups")
        assert "/signin" in browser.current_url, browser.current_url
    finally:
        browser.delete_all_cookies()  # cookies are per host, not per port: leave none for the other consoles
