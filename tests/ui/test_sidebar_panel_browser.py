"""The sidebar as a person meets it, in a real JupyterLab in Debian's Chromium (Playwright).

One server and one browser page for the module; each test leaves the page as it found it:
- the launcher shows the workbench kernels with their logo, not a letter;
- ipyparallel's own "IPython Parallel" sidebar lists no workbench pool;
- a card is compact (name, state, counts), its 5 ranks sit behind an expander, nothing overflows at the
  default width, "Use in notebook" looks disabled without a notebook, the dot turns amber when a rank dies;
- the panel is open again after a page reload;
- the Advanced dialog has each launcher's fields, as the server's options say, checks them before anything
  starts and says what is wrong in the dialog's own words; a field the options gain is in the dialog;
- a failed start says what failed in words, and Retry reopens the dialog with the values it had;
- a failed Slurm or ssh start says what sbatch or ssh said (a failing one first on the server's PATH);
- the card shows the whole name, "degraded" beside the amber dot, a big pool's counts as its expander.
Screenshots go to build/ui/ (the issue's items as 24-<item>-<what>.png).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import alive
from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS, needs_chromium, run_lab

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "ui"

pytestmark = [pytest.mark.slow, needs_chromium]

BIG = 5  # ranks of the pool the cards are looked at with: more than the 4 a card shows at once


def _api(lab, method: str, path: str, body=None) -> tuple[int, dict | list | None]:
    req = urllib.request.Request(f"{lab['base']}/{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {lab['token']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _pools(lab) -> list[dict]:
    return _api(lab, "GET", "workbench/pools")[1]["pools"]


# what a failing sbatch and ssh say (the server finds these first on its PATH; the real ones stay untouched)
FAILING = {
    "sbatch": 'echo "sbatch: error: invalid partition specified: nosuch7 (a test)" >&2\nexit 1\n',
    "ssh": 'echo "ssh: Could not resolve hostname nohost7 (a test)" >&2\nexit 255\n',
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("panel")
    fake_bin = tmp / "fake-bin"
    fake_bin.mkdir()
    for command, script in FAILING.items():
        (fake_bin / command).write_text("#!/bin/sh\n" + script)
        (fake_bin / command).chmod(0o755)
    path = f"{fake_bin}{os.pathsep}{os.environ['PATH']}"
    kernels = ("workbench-cpu", "workbench-gpu")
    with run_lab(tmp, {}, install_kernel=kernels, extra_env={"PATH": path}) as server:
        server["tmp"] = tmp
        yield server


@pytest.fixture(scope="module")
def page(lab):
    """The Lab page (no notebook open: the launcher shows), with our sidebar open."""
    from playwright.sync_api import expect, sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(lab["tmp"] / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 850})
        page = browser.new_page()
        page.goto(f"{lab['base']}/lab?token={lab['token']}")
        page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
        page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
        expect(page.locator("#workbench-pools .wb-StartRow")).to_be_visible(timeout=30_000)
        try:
            yield page
        finally:
            browser.close()


@pytest.fixture(scope="module")
def big_pool(lab):
    """A running pool of 5 CPU ranks started from the panel's API; stopped at the end."""
    code, body = _api(lab, "POST", "workbench/pools", {"n": BIG})
    assert code == 202, body
    request_id = body["pool"]["request_id"]
    deadline = time.monotonic() + 200
    while True:
        pool = next(p for p in _pools(lab) if request_id in (p["id"], p["request_id"]))
        if pool["state"] == "running" and len(pool["ranks"]) == BIG:
            break
        assert pool["state"] != "failed" and time.monotonic() < deadline, pool
        time.sleep(0.5)
    yield pool
    _api(lab, "DELETE", f"workbench/pools/{pool['id']}")
    pids = [r["pid"] for r in pool["ranks"]]
    deadline = time.monotonic() + 20
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids)


def _no_dialog(page) -> None:
    """Close a dialog an earlier test may have left open (each test starts from the plain panel)."""
    for _ in range(3):
        if page.locator(".jp-Dialog").count() == 0:
            return
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)


def _shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / name))


def _no_overflow(page) -> list[str]:
    """Elements of the panel wider than their box (what would be cut off or scroll sideways)."""
    return page.evaluate("""() => {
        const panel = document.querySelector('#workbench-pools');
        const out = [];
        for (const el of [panel, ...panel.querySelectorAll('.wb-Card, .wb-Card > *')]) {
            if (el.scrollWidth > el.clientWidth + 1) {
                out.push(`${el.className}: ${el.scrollWidth} > ${el.clientWidth}`);
            }
        }
        return out;
    }""")


def _warn_colour(page) -> str:
    return page.evaluate("""() => {
        const probe = document.createElement('div');
        probe.style.background = 'var(--jp-warn-color1)';
        document.body.appendChild(probe);
        const colour = getComputedStyle(probe).backgroundColor;
        probe.remove();
        return colour;
    }""")


@pytest.mark.timeout(120)
def test_the_launcher_shows_the_workbench_kernels_with_their_logo(page, lab):
    from playwright.sync_api import expect

    for label in ("Python 3 (workbench, CPU)", "Python 3 (workbench, GPU)"):
        card = page.locator(".jp-LauncherCard").filter(has_text=label).first
        expect(card).to_be_visible(timeout=30_000)
        # without a logo JupyterLab shows the kernel name's first letter ("P") instead
        expect(card.locator(".jp-LauncherCard-noKernelIcon")).to_have_count(0)
        logo = card.locator(".jp-LauncherCard-icon img")
        expect(logo).to_have_count(1)
        assert logo.evaluate("img => img.complete && img.naturalWidth >= 32"), "the logo did not load"
    _shot(page, "launcher-kernel-logos.png")


@pytest.mark.timeout(300)
def test_ipyparallels_own_sidebar_lists_no_workbench_pool(page, lab, big_pool):
    from playwright.sync_api import expect

    with page.expect_response(lambda r: "/ipyparallel/clusters" in r.url and r.ok, timeout=30_000):
        page.locator('li.lm-TabBar-tab[data-id="ipp-cluster-launcher"]').click()  # it lists on opening
    listing = page.locator(".ipp-ClusterListing")
    expect(listing).to_be_visible(timeout=30_000)
    _shot(page, "ipyparallel-panel-no-workbench-pool.png")
    try:
        expect(listing).not_to_contain_text("workbench")
        expect(listing).not_to_contain_text(big_pool["id"])
    finally:
        page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
    # what its panel lists, from ipyparallel's server extension
    code, clusters = _api(lab, "GET", "ipyparallel/clusters")
    assert code == 200
    assert not [c["id"] for c in clusters if "workbench" in json.dumps(c)], clusters


@pytest.mark.timeout(300)
def test_a_card_is_compact_expands_and_turns_amber_when_a_rank_dies(page, lab, big_pool):
    from playwright.sync_api import expect

    panel = page.locator("#workbench-pools")
    card = panel.locator(f'.wb-Card[data-pool-id="{big_pool["id"]}"]')
    expect(card).to_have_attribute("data-state", "running", timeout=30_000)
    expect(card.locator(".wb-Card-status")).to_have_text("running")
    # the whole name (issue 24 item 9: it was cut to "pool-brisk-t…"), as `%dist attach` takes it
    title = card.locator(".wb-Card-title")
    expect(title).to_have_text(big_pool["name"])
    assert title.evaluate("t => t.scrollWidth <= t.clientWidth && t.getClientRects().length > 0")
    assert "…" not in title.inner_text()
    # 5 ranks: summed up on the counts line, which is the expander; the table waits behind it (issue 25)
    counts = card.locator("button.wb-Card-counts")
    expect(counts).to_contain_text(f"running · {BIG} ranks: all idle", timeout=30_000)
    expect(counts).to_have_attribute("aria-expanded", "false")
    expect(card.locator(".wb-Ranks")).to_have_count(0)
    _shot(page, "sidebar-card-compact.png")
    _shot(page, "24-9-full-name.png")
    assert card.bounding_box()["height"] < 130, card.bounding_box()
    # no notebook is open: "Use in notebook" is disabled and looks it
    use = card.get_by_role("button", name="Use in notebook")
    expect(use).to_be_disabled()
    assert float(use.evaluate("b => getComputedStyle(b).opacity")) <= 0.6
    assert _no_overflow(page) == []
    # a closed table: the panel asks the server for their states only, not each rank's figures (issue 25)
    with page.expect_request(lambda r: f"count_only={big_pool['id']}" in r.url, timeout=15_000):
        pass

    counts.click()
    expect(card.locator(".wb-Ranks tbody tr")).to_have_count(BIG)
    expect(counts).to_have_attribute("aria-expanded", "true")
    # open: the figures come (the server measures the ranks of an open table)
    cpu = card.locator(".wb-Ranks tbody tr").first.locator("td").nth(3)
    expect(cpu).to_have_text(re.compile(r"^\d+%$"), timeout=10_000)
    assert _no_overflow(page) == []
    _shot(page, "sidebar-card-expanded.png")

    # a rank dies: the dot turns amber, the word beside it says so, the counts too, the failed rank first
    victim = big_pool["ranks"][-1]
    os.kill(victim["pid"], signal.SIGKILL)
    expect(card).to_have_attribute("data-health", "degraded", timeout=30_000)
    expect(card.locator(".wb-Card-status")).to_have_text("degraded")  # was "running" (issue 24 item 9)
    expect(card.locator(".wb-Card-counts")).to_contain_text(f"{BIG} ranks: {BIG - 1} idle, 1 failed")
    dot = card.locator(".wb-Dot")
    assert dot.evaluate("d => getComputedStyle(d).backgroundColor") == _warn_colour(page)
    expect(card.locator(".wb-Rank.wb-mod-failed")).to_have_count(1)
    expect(card.locator(".wb-Ranks tbody tr").first.locator("td").first).to_have_text(str(victim["rank"]))
    assert _no_overflow(page) == []
    _shot(page, "sidebar-card-amber.png")
    _shot(page, "24-9-degraded.png")
    counts.click()  # closed again: the summary alone
    expect(card.locator(".wb-Ranks")).to_have_count(0)
    _shot(page, "25-big-pool-summary.png")


@pytest.mark.timeout(120)
def test_the_panel_is_open_again_after_a_reload(page, lab):
    from playwright.sync_api import expect

    # the layout restorer saves the workspace a moment after a change
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        code, workspaces = _api(lab, "GET", "lab/api/workspaces")
        if "workbench-pools" in json.dumps(workspaces):
            break
        time.sleep(0.5)
    page.reload()
    page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    expect(page.locator("#workbench-pools .wb-StartRow")).to_be_visible(timeout=30_000)
    _shot(page, "sidebar-after-reload.png")


def _field(form, name: str):
    return form.locator(f'[name="{name}"]')


def _shown_whole(locator) -> bool:
    """Whether an element of a dialog is read whole: inside the dialog body's visible box, the body not
    scrolled past anything, and nothing cut inside the element itself."""
    return locator.evaluate("""el => {
        const box = el.getBoundingClientRect();
        const body = el.closest('.jp-Dialog-body');
        const seen = body.getBoundingClientRect();
        return box.height > 0 && box.top >= seen.top - 1 && box.bottom <= seen.bottom + 1
            && box.left >= seen.left - 1 && box.right <= seen.right + 1
            && body.scrollHeight <= body.clientHeight + 1
            && el.scrollWidth <= el.clientWidth + 1 && el.scrollHeight <= el.clientHeight + 1;
    }""")


def _visible_fields(form) -> set[str]:
    return set(form.evaluate("""f => [...f.querySelectorAll('[name]')]
        .filter(e => e.offsetParent !== null).map(e => e.getAttribute('name'))"""))


@pytest.mark.timeout(180)
def test_the_slurm_dialog_has_its_fields_and_checks_them_before_starting(page, lab):
    from playwright.sync_api import expect

    _no_dialog(page)
    panel = page.locator("#workbench-pools")
    before = [p["id"] for p in _pools(lab)]
    panel.get_by_role("button", name="Advanced…").click()
    form = page.locator(".jp-Dialog .wb-StartForm")
    expect(form).to_be_visible()
    _field(form, "launcher").select_option("slurm")
    assert _visible_fields(form) == {"launcher", "n", "nodes", "gpus_per_node", "partition", "time",
                                     "account", "interface", "backend", "timeout"}
    for label in ("Nodes", "GPUs per node", "Partition", "Time limit", "Account", "Interface"):
        expect(form.get_by_text(label, exact=True)).to_be_visible()
    # the interfaces of this machine to pick from
    _, body = _api(lab, "GET", "workbench/interfaces")
    offered = _field(form, "interface").evaluate("s => [...s.options].map(o => o.value)")
    assert {i["name"] for i in body["interfaces"]} <= set(offered) and "lo" in offered
    _field(form, "nodes").fill("1")
    _field(form, "partition").fill("debug")
    _field(form, "time").fill("2 hours")
    _field(form, "interface").select_option("lo")
    _shot(page, "dialog-slurm-fields.png")
    # the help line below the fields is read whole (issue 24 item 9: it was clipped)
    hint = form.locator(".wb-StartForm-hint")
    expect(hint).to_contain_text("Interface: where engines on other machines reach this server's pool.")
    assert _shown_whole(hint), hint.bounding_box()

    # a bad value: the dialog says what is wrong, with the values kept; nothing starts
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    error = page.locator(".jp-Dialog .wb-StartForm-error")
    expect(error).to_contain_text("time '2 hours' is not a Slurm time limit")
    form = page.locator(".jp-Dialog .wb-StartForm")
    expect(_field(form, "time")).to_have_value("2 hours")
    expect(_field(form, "partition")).to_have_value("debug")
    expect(_field(form, "launcher")).to_have_value("slurm")
    assert [p["id"] for p in _pools(lab)] == before
    _shot(page, "dialog-slurm-bad-time.png")
    # with the server's sentence above the fields too
    hint = page.locator(".jp-Dialog .wb-StartForm-hint")
    assert _shown_whole(hint), hint.bounding_box()
    _shot(page, "24-9-slurm-dialog-hint.png")

    # loopback for engines on other machines: said with the dialog's field names, no command-line flag
    _field(form, "time").fill("10")
    _field(form, "interface").select_option("")
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    error = page.locator(".jp-Dialog .wb-StartForm-error")
    expect(error).to_contain_text("starts engines on other machines")
    expect(error).to_contain_text("e.g. Interface “eth0”")
    text = error.inner_text()
    assert "--" not in text and "Error:" not in text, text
    assert [p["id"] for p in _pools(lab)] == before
    _shot(page, "dialog-slurm-no-interface.png")

    form = page.locator(".jp-Dialog .wb-StartForm")
    _field(form, "launcher").select_option("ssh")
    expect(error).to_have_count(0)  # it was about slurm's values
    assert _visible_fields(form) == {"launcher", "n", "hosts", "gpus_per_node", "interface", "backend",
                                     "timeout"}
    _field(form, "launcher").select_option("mpi")
    assert _visible_fields(form) == {"launcher", "n", "hosts", "interface", "backend", "timeout"}
    _shot(page, "dialog-mpi-fields.png")
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert [p["id"] for p in _pools(lab)] == before


@pytest.mark.timeout(120)
def test_the_dialog_has_the_fields_the_servers_options_name(page, lab):
    """The dialog is rendered from GET /workbench/options: each launcher shows the options that apply to it,
    labelled as the server labels them; an option the server's answer gains (what a field added to
    PoolConfig makes it say; here added to the answer on its way to the page) is offered and sent, with no
    change to the page's code."""
    from playwright.sync_api import expect

    _no_dialog(page)
    _, form_said = _api(lab, "GET", "workbench/options")
    dialog = [o for o in form_said["options"] if o["advanced"]]
    panel = page.locator("#workbench-pools")
    panel.get_by_role("button", name="Advanced…").click()
    form = page.locator(".jp-Dialog .wb-StartForm")
    expect(form).to_be_visible()
    for launcher in ("local", "slurm", "mpi", "ssh"):
        _field(form, "launcher").select_option(launcher)
        assert _visible_fields(form) == {o["name"] for o in dialog
                                         if not o["launchers"] or launcher in o["launchers"]}, launcher
    labels = form.locator("[data-field] > span:first-child").all_inner_texts()
    assert labels == [f"{o['label']} ({o['unit']})" if o["unit"] else o["label"] for o in dialog]
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel").click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)

    margin = {"name": "walltime_margin", "label": "Walltime margin", "unit": "s", "kind": "seconds",
              "help": "seconds kept free before the allocation ends", "choices": [], "default": None,
              "hint": "300", "launchers": ["slurm"], "advanced": True}

    def gains_a_field(route):
        answer = route.fetch()
        route.fulfill(response=answer, json={**answer.json(), "options": [*dialog, margin]})

    page.route("**/workbench/options*", gains_a_field)
    try:
        panel.get_by_role("button", name="Advanced…").click()
        form = page.locator(".jp-Dialog .wb-StartForm")
        expect(form.get_by_text("Walltime margin (s)", exact=True)).to_be_hidden()
        _field(form, "launcher").select_option("slurm")
        expect(form.get_by_text("Walltime margin (s)", exact=True)).to_be_visible()
        expect(_field(form, "walltime_margin")).to_have_attribute("placeholder", "300")
        _field(form, "walltime_margin").fill("120")
        _field(form, "interface").select_option("lo")
        _shot(page, "dialog-a-field-the-options-gained.png")
        def a_start(request) -> bool:  # (Lab adds a number to each URL against caches)
            return request.method == "POST" and urllib.parse.urlsplit(request.url).path == "/workbench/pools"

        with page.expect_request(a_start) as sent:
            page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
        assert json.loads(sent.value.post_data)["walltime_margin"] == 120
        # this server's PoolConfig has no such field: it says so, in the dialog, and nothing starts
        refused = page.locator(".jp-Dialog .wb-StartForm-error")
        expect(refused).to_contain_text("unknown field 'walltime_margin'")
        page.locator(".jp-Dialog").get_by_role("button", name="Cancel").click()
        expect(page.locator(".jp-Dialog")).to_have_count(0)
    finally:
        page.unroute("**/workbench/options*")


@pytest.mark.timeout(180)
def test_a_failed_start_says_it_in_words_and_retry_reopens_the_dialog(page, lab):
    from playwright.sync_api import expect

    _no_dialog(page)
    panel = page.locator("#workbench-pools")
    panel.get_by_role("button", name="Advanced…").click()
    form = page.locator(".jp-Dialog .wb-StartForm")
    assert _visible_fields(form) == {"launcher", "n", "oversubscribe", "backend", "timeout"}
    # no engine: said with the field's own name (issue 24 item 9: "n must be at least 1" under "Engines")
    _field(form, "n").fill("0")
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    error = page.locator(".jp-Dialog .wb-StartForm-error")
    expect(error).to_contain_text("Engines must be at least 1 (got 0)")
    assert "n must" not in error.inner_text()
    _shot(page, "24-9-engines-in-words.png")
    form = page.locator(".jp-Dialog .wb-StartForm")
    # more ranks than the machine holds: refused in the dialog, naming the box that allows it
    _field(form, "n").fill("100000")
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    error = page.locator(".jp-Dialog .wb-StartForm-error")
    expect(error).to_contain_text("Engines “100000” is more than this machine holds")
    expect(error).to_contain_text("or tick Oversubscribe to start 100000 anyway")
    assert "--" not in error.inner_text() and "PoolConfig" not in error.inner_text()
    _shot(page, "dialog-local-too-many.png")
    form = page.locator(".jp-Dialog .wb-StartForm")
    _field(form, "n").fill("2")
    _field(form, "timeout").fill("0.001")  # engines are forks: 2 start within 0.2 s
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    failed = panel.locator(".wb-Card[data-state=failed]")
    expect(failed).to_have_count(1, timeout=60_000)
    error = failed.locator(".wb-Error-text")
    expect(error).to_contain_text("engines registered within 0.001 s")
    expect(error).to_contain_text("Try a longer Start timeout")
    text = error.inner_text()
    assert "PoolStartError" not in text and "--timeout" not in text, text
    # the server's parts, as it sent them: what, the log's path, what to do
    card = next(p for p in _pools(lab) if p["id"] == failed.get_attribute("data-pool-id"))
    expect(error.locator(".wb-Error-what")).to_have_text(card["problem"]["what"])
    expect(error.locator(".wb-Error-log")).to_have_text(f"\nLog: {card['problem']['log']}")
    expect(error.locator(".wb-Error-todo")).to_have_text(f"\n{card['problem']['todo']}")
    assert _no_overflow(page) == []
    first_id = failed.get_attribute("data-pool-id")
    _shot(page, "sidebar-failed-start-in-words.png")

    failed.get_by_role("button", name="Retry").click()
    form = page.locator(".jp-Dialog .wb-StartForm")
    expect(form).to_be_visible()
    expect(_field(form, "launcher")).to_have_value("local")
    expect(_field(form, "n")).to_have_value("2")
    expect(_field(form, "timeout")).to_have_value("0.001")
    _shot(page, "dialog-retry-last-values.png")
    # the same again: the new start takes the failed card's place
    page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
    expect(panel.locator(f'.wb-Card[data-pool-id="{first_id}"]')).to_have_count(0, timeout=30_000)
    expect(failed).to_have_count(1, timeout=60_000)
    failed.get_by_role("button", name="Dismiss").click()
    expect(failed).to_have_count(0, timeout=10_000)


@pytest.mark.timeout(240)
def test_failed_slurm_and_ssh_starts_say_what_sbatch_and_ssh_said(page, lab):
    """Issue 24 items 1 and 4, on the card: sbatch's own words with Slurm's advice; which host ssh could
    not reach and what ssh said. The failed card keeps the pool's name (item 9)."""
    from playwright.sync_api import expect

    _no_dialog(page)
    panel = page.locator("#workbench-pools")
    cases = [
        ("slurm", {"n": "2", "partition": "nosuch7"}, ["invalid partition specified: nosuch7", "sinfo"],
         "24-1-slurm-failed-start.png"),
        ("ssh", {"hosts": "nohost7"}, ["ssh could not reach nohost7", "Could not resolve hostname nohost7"],
         "24-4-ssh-failed-start.png"),
    ]
    for launcher, values, says, shot in cases:
        panel.get_by_role("button", name="Advanced…").click()
        form = page.locator(".jp-Dialog .wb-StartForm")
        _field(form, "launcher").select_option(launcher)
        for name, value in values.items():
            _field(form, name).fill(value)
        _field(form, "interface").select_option("lo")
        _field(form, "timeout").fill("30")
        page.locator(".jp-Dialog").get_by_role("button", name="Start").click()
        failed = panel.locator(".wb-Card[data-state=failed]")
        expect(failed).to_have_count(1, timeout=90_000)
        for words in says:
            expect(failed.locator(".wb-Error-text")).to_contain_text(words)
        expect(failed.locator(".wb-Card-title")).to_have_text(re.compile(r"^pool-[a-z]+-[a-z]+$"))
        expect(failed.locator(".wb-Card-status")).to_have_text("failed")
        assert _no_overflow(page) == []
        _shot(page, shot)
        failed.get_by_role("button", name="Dismiss").click()
        expect(failed).to_have_count(0, timeout=10_000)
