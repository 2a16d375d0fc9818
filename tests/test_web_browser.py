"""The web UI in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium): run with -m browser.

A real daemon (Unix socket for `mr`, TCP port for the browser) runs in a
thread. The browser logs in as an admin, changes a weight that `mr group
list` then shows, drains a backend, and a student's page shows nothing of
another person's. With ``MR_WEB_SCREENSHOTS=DIR`` the main pages are saved
there as PNG at 1280x800 and 390 px wide (docs/web/ holds the published ones).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .conftest import ADMIN_KEY
from .test_cli_daemon import Live, run
from .test_cli_daemon import live as live  # the module's own daemon, as test_cli_daemon's (a fixture)

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402


@pytest.fixture
def browser() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def base(live: Live) -> str:
    return f"http://127.0.0.1:{live.port}"


def submit(driver: Any, css: str) -> None:
    """Click a form's button and wait for the page the form leads to.

    While the new page replaces the old one, Chromium may answer a look at the old button with an
    inspector error ("Node with given id does not belong to the document") instead of a stale
    element: either means the old page is gone.
    """
    button = driver.find_element(By.CSS_SELECTOR, css)
    button.click()

    def gone(_: Any) -> bool:
        try:
            return bool(expected_conditions.staleness_of(button)(driver))
        except WebDriverException:
            return True

    WebDriverWait(driver, 10).until(gone)


def log_in(driver: Any, live: Live, key: str) -> None:
    driver.delete_all_cookies()
    driver.get(base(live) + "/ui/login")
    driver.find_element(By.ID, "key").send_keys(key)
    submit(driver, "form[action='/ui/login'] button")


def shoot(driver: Any, name: str) -> None:
    """Save the page at 1280x800 and 390 px wide when MR_WEB_SCREENSHOTS names a folder."""
    folder = os.environ.get("MR_WEB_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    for width, height, suffix in ((1280, 800, ""), (390, 844, "-390")):
        driver.set_window_size(width, height)
        driver.refresh()
        driver.save_screenshot(str(Path(folder) / f"{name}{suffix}.png"))
    driver.set_window_size(1280, 800)


def chat(live: Live, key: str, words: int = 3) -> str:
    async def go() -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{base(live)}/v1/chat/completions",
                json={"model": "llama3", "messages": [{"role": "user", "content": "a " * words}], "max_tokens": 8},
                headers={"Authorization": f"Bearer {key}"},
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            return resp.headers["X-Request-Id"]

    return str(live.call(go()))


def test_admin_changes_a_weight_drains_a_backend_and_a_student_sees_only_their_own(live: Live, browser: Any) -> None:
    assert run(live, "backend", "add", "ws1", live.fake.url, "--engine", "ollama").exit_code == 0
    assert run(live, "user", "add", "alice", "--group", "student").exit_code == 0
    assert run(live, "user", "add", "bob", "--group", "faculty").exit_code == 0
    alice = run(live, "user", "key", "alice", "--json").json()["key"]
    bob = run(live, "user", "key", "bob", "--json").json()["key"]
    assert run(live, "user", "set-quota", "bob", "--tokens-per-day", "424242").exit_code == 0
    assert run(live, "user", "set-quota", "alice", "--tokens-per-day", "50000").exit_code == 0
    chat(live, alice)
    rid = chat(live, bob, 40)

    # An admin logs in with the admin key and sets the student group's weight.
    log_in(browser, live, ADMIN_KEY)
    assert browser.current_url.endswith("/ui/admin/top")
    shoot(browser, "live")
    browser.get(base(live) + "/ui/admin/groups")
    field = browser.find_element(By.CSS_SELECTOR, "#group-student input[name=weight]")
    field.clear()
    field.send_keys("1.5")
    submit(browser, "#group-student button")
    assert "group student now weighs 1.5" in browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
    groups = {g["name"]: g["scheduler_weight"] for g in run(live, "group", "list", "--json").json()}
    assert groups["student"] == 1.5
    shoot(browser, "groups")

    # Drains a backend, the only one of llama3: a confirmation names it first; `mr backend list` shows the drain.
    browser.get(base(live) + "/ui/admin/backends")
    submit(browser, "#backend-ws1 button")
    assert "leaves llama3, mistral without a backend" in browser.find_element(By.ID, "question").text
    shoot(browser, "drain-confirm")
    submit(browser, "#confirm")
    assert "backend ws1 is" in browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
    status = {b["name"]: b["status"] for b in run(live, "backend", "list", "--json").json()}
    assert status["ws1"] in ("draining", "drained")
    shoot(browser, "backends")
    submit(browser, "#backend-ws1 button")
    assert {b["name"]: b["status"] for b in run(live, "backend", "list", "--json").json()}["ws1"] == "healthy"

    browser.get(base(live) + "/ui/admin/users/bob")
    shoot(browser, "user")
    browser.get(base(live) + "/ui/admin/usage?by=user")
    assert "bob" in browser.find_element(By.ID, "usage-rows").text
    shoot(browser, "usage")
    browser.get(base(live) + "/ui/admin/decisions?backend=ws1")
    shoot(browser, "decisions")
    browser.get(base(live) + f"/ui/admin/decisions/{rid}")
    assert "went to ws1" in browser.find_element(By.TAG_NAME, "main").text
    shoot(browser, "why")

    # A student sees their own figures and nothing of bob's.
    log_in(browser, live, alice)
    assert browser.current_url.endswith("/ui/me")
    text = browser.find_element(By.TAG_NAME, "body").text
    assert "alice" in text and "50000" in text
    assert "bob" not in text and "424242" not in text and "faculty" not in text
    browser.get(base(live) + "/ui/admin/users")
    assert "for admins" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(base(live) + "/ui/me")
    shoot(browser, "me")
    browser.delete_all_cookies()
    browser.get(base(live) + "/ui/login")
    shoot(browser, "login")


def test_admin_adds_a_group_a_user_with_a_named_key_and_a_backend_and_removes_them(live: Live, browser: Any) -> None:
    log_in(browser, live, ADMIN_KEY)
    browser.get(base(live) + "/ui/admin/groups")
    browser.find_element(By.CSS_SELECTOR, "#add-group input[name=name]").send_keys("lab-b")
    weight = browser.find_element(By.CSS_SELECTOR, "#add-group input[name=weight]")
    weight.clear()
    weight.send_keys("2")
    submit(browser, "#add-group button")
    assert {g["name"]: g["scheduler_weight"] for g in run(live, "group", "list", "--json").json()}["lab-b"] == 2

    browser.get(base(live) + "/ui/admin/users")
    browser.find_element(By.CSS_SELECTOR, "#add-user input[name=name]").send_keys("carol")
    browser.find_element(By.CSS_SELECTOR, "#add-user select[name=group] option[value='lab-b']").click()
    submit(browser, "#add-user button")
    assert "user carol added to group lab-b" in browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
    browser.find_element(By.CSS_SELECTOR, "#create-key input[name=label]").send_keys("laptop")
    submit(browser, "#create-key button")
    key = browser.find_element(By.ID, "new-key").text
    assert key.startswith("mr-") and browser.current_url.endswith("/ui/admin/users/carol")
    browser.refresh()  # a reload shows the key no more, and makes no other
    assert not browser.find_elements(By.ID, "new-key")
    shoot(browser, "user-keys")
    keys = run(live, "user", "keys", "carol", "--json").json()
    assert [k["label"] for k in keys] == ["laptop"]  # the reloads made no other key

    browser.get(base(live) + "/ui/admin/backends")
    form = browser.find_element(By.ID, "add-backend")
    form.find_element(By.NAME, "name").send_keys("ws2")
    form.find_element(By.NAME, "url").send_keys("http://127.0.0.1:9")  # nothing listens: added, unhealthy
    form.find_element(By.CSS_SELECTOR, "select[name=engine] option[value='ollama']").click()
    form.find_element(By.NAME, "max_concurrent").send_keys("3")
    submit(browser, "#add-backend button")
    assert "backend ws2 added" in browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
    browser.get(base(live) + "/ui/admin/backends/ws2")
    field = browser.find_element(By.NAME, "max_concurrent")
    field.clear()
    field.send_keys("5")
    submit(browser, "form[action='/ui/admin/backends/ws2'] button")
    shoot(browser, "backend")
    rows = {b["name"]: b for b in run(live, "backend", "list", "--json").json()}
    assert rows["ws2"]["max_concurrent"] == 5

    browser.get(base(live) + f"/ui/admin/users/carol/keys/{keys[0]['id']}/revoke")
    assert "(laptop)" in browser.find_element(By.ID, "question").text
    shoot(browser, "revoke-confirm")
    submit(browser, "#confirm")
    assert run(live, "user", "keys", "carol", "--json").json() == []
    browser.get(base(live) + "/ui/admin/backends/ws2/remove")
    submit(browser, "#confirm")
    assert "ws2" not in {b["name"] for b in run(live, "backend", "list", "--json").json()}
    browser.get(base(live) + "/ui/admin/users/carol/remove")
    submit(browser, "#confirm")
    assert "carol" not in {u["name"] for u in run(live, "user", "list", "--json").json()}

    # Loads users from a file as `mr import` does: the changes first, then the import.
    browser.get(base(live) + "/ui/admin/import")
    browser.find_element(By.ID, "file").send_keys('version = 1\n[[users]]\nname = "dora"\ngroup = "lab-b"\n')
    submit(browser, "#import button[value=preview]")
    assert "user dora: new" in browser.find_element(By.ID, "changes").text
    shoot(browser, "import")
    submit(browser, "#do-import")
    assert "dora" in {u["name"] for u in run(live, "user", "list", "--json").json()}
