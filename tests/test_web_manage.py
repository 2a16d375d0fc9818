"""The pool managed from the browser (issue 32): groups, users, keys and backends added, changed and removed
through the web UI's forms, each checked against what the admin API (`mr`) reads afterwards."""

from __future__ import annotations

import re

from .harness import ADMIN_KEY, Daemon
from .inprocess import InProcess
from .test_web_ui import csrf_of, login, post


async def test_groups_are_added_given_quotas_and_removed(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/groups", "/ui/admin/groups", {"name": "lab-a", "weight": "2.5"})
    assert "group lab-a added with weight 2.5" in page
    page = await post(daemon, "/ui/admin/groups/lab-a", "/ui/admin/groups/lab-a/quota", {"tokens_per_day": "9000"})
    assert "quotas of group lab-a saved" in page
    form = (await (await daemon.client.get("/ui/admin/groups/lab-a")).text()).split(
        'action="/ui/admin/groups/lab-a/quota"'
    )
    assert len(form) == 2 and 'name="tokens_per_day" inputmode="numeric" value="9000"' in form[1]
    groups = {g["name"]: g for g in await daemon.admin("GET", "/admin/groups")}
    assert groups["lab-a"]["scheduler_weight"] == 2.5
    assert {q["kind"]: q["limit"] for q in groups["lab-a"]["quotas"]} == {"tokens_per_day": 9000}
    page = await post(daemon, "/ui/admin/groups", "/ui/admin/groups", {"name": "lab-a", "weight": "1"})
    assert "already exists" in page  # the store's sentence, as `mr group add` prints it
    confirm = await (await daemon.client.get("/ui/admin/groups/lab-a/remove")).text()
    assert "Remove group lab-a?" in confirm and "lab-a" in {
        g["name"] for g in await daemon.admin("GET", "/admin/groups")
    }
    page = await post(daemon, "/ui/admin/groups/lab-a/remove", "/ui/admin/groups/lab-a/remove")
    assert "group lab-a removed" in page
    assert "lab-a" not in {g["name"] for g in await daemon.admin("GET", "/admin/groups")}


async def test_users_are_added_marked_as_proxies_and_removed_after_a_confirmation(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/users", "/ui/admin/users", {"name": "ana", "group": "staff", "weight": "3"})
    assert "user ana added to group staff" in page and "Create a key" in page  # lands on ana's page
    await post(daemon, "/ui/admin/users", "/ui/admin/users", {"name": "webui", "group": "student", "proxy": "yes"})
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert (users["ana"]["group"], users["ana"]["weight"]) == ("staff", 3)
    assert users["webui"]["proxy_for"] == "student"
    listing = await (await daemon.client.get("/ui/admin/users")).text()
    assert "proxy for student" in listing
    confirm = await (await daemon.client.get("/ui/admin/users/ana/remove")).text()
    assert "Remove user ana?" in confirm and "ana" in {u["name"] for u in await daemon.admin("GET", "/admin/users")}
    page = await post(daemon, "/ui/admin/users/ana/remove", "/ui/admin/users/ana/remove")
    assert "user ana removed" in page
    assert "ana" not in {u["name"] for u in await daemon.admin("GET", "/admin/users")}


async def test_a_new_key_is_named_shown_once_after_a_redirect_and_revoked_after_a_confirmation(daemon: Daemon) -> None:
    await daemon.user("ana")  # one key already
    await login(daemon, ADMIN_KEY)
    token = csrf_of(await (await daemon.client.get("/ui/admin/users/ana")).text())
    resp = await daemon.client.post(
        "/ui/admin/users/ana/keys", data={"csrf": token, "label": "laptop"}, allow_redirects=False
    )
    assert resp.status == 303 and resp.headers["Location"] == "/ui/admin/users/ana"  # the key is not in the URL
    page = await (await daemon.client.get(resp.headers["Location"])).text()
    key = re.search(r'<pre id="new-key">([^<]+)</pre>', page)
    assert key and "laptop" in page
    reloaded = await (await daemon.client.get("/ui/admin/users/ana")).text()
    assert "new-key" not in reloaded and key.group(1) not in reloaded
    keys = await daemon.admin("GET", "/admin/users/ana/keys")
    assert [k["label"] for k in keys] == ["", "laptop"]  # reloading made no third key
    confirm = await (await daemon.client.get(f"/ui/admin/users/ana/keys/{keys[1]['id']}/revoke")).text()
    assert f"Revoke key {keys[1]['id']} (laptop)" in confirm
    assert len(await daemon.admin("GET", "/admin/users/ana/keys")) == 2  # asking revoked nothing
    page = await post(daemon, "/ui/admin/users/ana", f"/ui/admin/users/ana/keys/{keys[1]['id']}/revoke")
    assert f"key {keys[1]['id']} of ana revoked" in page
    assert (await daemon.client.get("/v1/me", headers={"Authorization": f"Bearer {key.group(1)}"})).status == 401


async def test_backends_are_added_changed_in_place_and_removed(daemon: Daemon) -> None:
    box = InProcess(models=("llama3.2",))
    daemon.adapters.inprocess[box.url] = box
    await login(daemon, ADMIN_KEY)
    form = {"name": "ws1", "url": box.url, "engine": "vllm", "max_concurrent": "2", "priority": ""}
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends", form)
    assert "backend ws1 added" in page
    (row,) = await daemon.admin("GET", "/admin/backends")
    assert (row["name"], row["max_concurrent"]) == ("ws1", 2)
    settings = await (await daemon.client.get("/ui/admin/backends/ws1")).text()
    assert 'name="max_concurrent" inputmode="numeric" value="2"' in settings
    page = await post(
        daemon, "/ui/admin/backends/ws1", "/ui/admin/backends/ws1", {"max_concurrent": "6", "parallel": "3"}
    )
    assert "backend ws1 saved" in page
    (changed,) = await daemon.admin("GET", "/admin/backends")
    assert (changed["id"], changed["max_concurrent"], changed["parallel"]) == (row["id"], 6, 3)  # the same id
    page = await post(daemon, "/ui/admin/backends/ws1", "/ui/admin/backends/ws1", {"max_concurrent": "0"})
    assert "max_concurrent" in page and (await daemon.admin("GET", "/admin/backends"))[0]["max_concurrent"] == 6
    confirm = await (await daemon.client.get("/ui/admin/backends/ws1/remove")).text()
    assert "Remove backend ws1?" in confirm and "llama3.2 would have no backend left" in confirm
    page = await post(daemon, "/ui/admin/backends/ws1/remove", "/ui/admin/backends/ws1/remove")
    assert "backend ws1 removed" in page and await daemon.admin("GET", "/admin/backends") == []


async def test_draining_a_models_last_backend_asks_first_naming_the_models(daemon: Daemon) -> None:
    await daemon.backend("a", InProcess(models=("llama3.2", "qwen")))
    await daemon.backend("b", InProcess(models=("llama3.2",)))
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/b/drain")
    assert "backend b is draining" in page or "backend b is drained" in page  # a still serves llama3.2
    page = await post(daemon, "/ui/admin/backends", "/ui/admin/backends/a/drain")
    assert "Draining a leaves llama3.2, qwen without a backend" in page
    assert {r["name"]: r["status"] for r in await daemon.admin("GET", "/admin/backends")}["a"] == "healthy"


async def test_a_user_is_made_a_proxy_and_a_person_is_added_behind_it(daemon: Daemon) -> None:
    await daemon.user("webui")
    await login(daemon, ADMIN_KEY)
    form = {"proxy": "yes", "proxy_group": "staff", "person_from": "user-field"}
    page = await post(daemon, "/ui/admin/users/webui", "/ui/admin/users/webui/proxy", form)
    assert "user webui is a proxy: the people its requests name go in group staff" in page
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert (users["webui"]["proxy_for"], users["webui"]["person_from"]) == ("staff", "user-field")
    form = {"name": "eve@lab.edu", "group": "student", "person_of": "webui"}
    page = await post(daemon, "/ui/admin/users", "/ui/admin/users", form)
    assert "user eve@lab.edu added" in page
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert users["eve@lab.edu"]["person_of"] == "webui"
    page = await post(daemon, "/ui/admin/users/webui", "/ui/admin/users/webui/proxy", {})
    assert "user webui is no longer a proxy" in page


FILE = """
version = 1

[[groups]]
name = "lab-c"
scheduler_weight = 4
tokens_per_day = 5000

[[users]]
name = "zoe"
group = "lab-c"
"""


async def test_a_pool_file_is_previewed_then_imported_all_or_nothing(daemon: Daemon) -> None:
    await login(daemon, ADMIN_KEY)
    page = await post(daemon, "/ui/admin/import", "/ui/admin/import", {"file": FILE, "do": "preview"})
    assert "would import 1 groups, 1 users, 0 backends; 2 changes" in page
    assert "group lab-c: new" in page and "user zoe: new" in page and 'id="do-import"' in page
    assert "zoe" not in {u["name"] for u in await daemon.admin("GET", "/admin/users")}  # a preview changes nothing
    page = await post(daemon, "/ui/admin/import", "/ui/admin/import", {"file": FILE, "do": "import"})
    assert "imported 1 groups, 1 users, 0 backends; 2 changes" in page
    users = {u["name"]: u for u in await daemon.admin("GET", "/admin/users")}
    assert users["zoe"]["group"] == "lab-c"
    bad = FILE + '\n[[users]]\nname = "yan"\ngroup = "nowhere"\n'
    token = csrf_of(await (await daemon.client.get("/ui/admin/import")).text())
    resp = await daemon.client.post("/ui/admin/import", data={"csrf": token, "file": bad, "do": "import"})
    assert resp.status == 400 and "nowhere" in await resp.text()
    assert "yan" not in {u["name"] for u in await daemon.admin("GET", "/admin/users")}
    resp = await daemon.client.post("/ui/admin/import", data={"csrf": token, "file": "[[groups", "do": "preview"})
    assert resp.status == 400 and "not valid TOML" in await resp.text()
