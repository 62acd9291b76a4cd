"""A split pool on the sidebar's card (issue 43: "the card is per sub-mesh"), in a real JupyterLab in
Debian's Chromium: a notebook starts 4 ranks and splits them 2 + 2 as ``a`` and ``b``; while a cell holds
sub-mesh ``a`` the card says ``a`` busy and ``b`` idle, and its rank table names each rank's sub-mesh; once
the cell ends both are idle; after ``%dist join`` the card has no sub-meshes; ``%dist stop`` ends the pool.
Screenshots: build/ui/43-card-sub-meshes-busy.png, 43-card-sub-meshes-idle.png.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import alive, until
from tests.ui.lab import lab_page, needs_chromium, notebook, open_notebook, run_cell, run_lab

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "ui"

pytestmark = [pytest.mark.slow, needs_chromium, pytest.mark.timeout(300)]


@pytest.fixture
def lab(tmp_path):
    release = tmp_path / "release"
    nb = notebook(
        "%dist start -n 4",
        "%dist split 2 2 --names a,b",
        # holds sub-mesh a until the test lets it go (at most 120 s), with a collective on a
        "%%distributed --on a --async\nimport time, torch\nfrom pathlib import Path\n"
        f"for _ in range(1200):\n    if Path({str(release)!r}).exists(): break\n    time.sleep(0.1)\n"
        "t = torch.ones(1); dist.all_reduce(t); held = t.item()",
        "%dist join",
        "%dist stop",
        kernel="workbench-cpu")
    with run_lab(tmp_path, {"split.ipynb": nb}, install_kernel="workbench-cpu") as server:
        server["release"] = release
        yield server


def test_the_card_says_each_sub_mesh_and_which_is_busy(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from workbench.pool.records import state as pool_state

    SHOTS.mkdir(parents=True, exist_ok=True)
    pids: list[int] = []
    with sync_playwright() as p:
        with lab_page(p, tmp_path, lab, SHOTS / "failure-submesh-card.png", width=1400, height=950) as page:
            open_notebook(page, lab, "split.ipynb")
            page.locator('li.lm-TabBar-tab[data-id="workbench-pools"]').click()
            panel = page.locator("#workbench-pools")
            cells = page.locator(".jp-Notebook .jp-Cell")
            run_cell(page, cells, 0, timeout=180_000)
            card = panel.locator(".wb-Card")
            expect(card).to_have_attribute("data-state", "running", timeout=30_000)
            pool_id = card.get_attribute("data-pool-id")
            state = pool_state.read_state(lab["state_dir"] / f"pool-{pool_id}.json")
            pids = [rec["pid"] for rec in state.processes] + [r["pid"] for r in state.ranks]
            expect(card.locator(".wb-Card-meshes")).to_have_count(0)  # not split yet

            run_cell(page, cells, 1)
            run_cell(page, cells, 2)  # --async: it returns while the cell holds a
            meshes = card.locator(".wb-Card-meshes")
            expect(meshes).to_contain_text("a (ranks 0-1) busy", timeout=30_000)
            expect(meshes).to_contain_text("b (ranks 2-3) idle")
            expect(card.locator(".wb-Mesh[data-mesh='a']")).to_have_class("wb-Mesh wb-mod-busy")
            # the rank table: each rank's sub-mesh
            assert card.locator(".wb-Rank-mesh").all_inner_texts() == ["a", "a", "b", "b"]
            page.screenshot(path=str(SHOTS / "43-card-sub-meshes-busy.png"))

            lab["release"].touch()
            expect(meshes).to_contain_text("a (ranks 0-1) idle", timeout=60_000)
            expect(meshes).to_contain_text("b (ranks 2-3) idle")
            page.screenshot(path=str(SHOTS / "43-card-sub-meshes-idle.png"))

            run_cell(page, cells, 3)  # %dist join: one group again, no sub-meshes on the card
            expect(card.locator(".wb-Card-meshes")).to_have_count(0, timeout=30_000)
            expect(card.locator(".wb-Rank-mesh")).to_have_count(0)

            run_cell(page, cells, 4, timeout=60_000)
            expect(panel.locator(".wb-Card")).to_have_count(0, timeout=30_000)
            assert until(lambda: not alive(pids), timeout=30, every=0.2), alive(pids)
    shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
