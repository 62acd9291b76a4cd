"""Draw the kernels' logos: ``logo-svg.svg``, ``logo-32x32.png`` and ``logo-64x64.png`` in each spec folder.

Four ranks joined in a ring, on a tile: blue for the CPU kernel, green for the GPU one. The SVG is
written here; the PNGs are that SVG rendered by Debian's Chromium (Playwright), so both always agree.
Run it after changing the drawing and commit what it writes:

    python kernels/make_logos.py
"""

from __future__ import annotations

import base64
from pathlib import Path

HERE = Path(__file__).resolve().parent
COLOURS = {"workbench-cpu": "#1e63b0", "workbench-gpu": "#2e8540"}

LOGO = """<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64" viewBox="0 0 64 64">
  <rect x="2" y="2" width="60" height="60" rx="14" fill="{colour}"/>
  <g fill="none" stroke="#ffffff" stroke-linecap="round">
    <rect x="18" y="18" width="28" height="28" stroke-width="3.5"/>
    <path d="M18 18 L46 46 M46 18 L18 46" stroke-width="2.5" stroke-opacity="0.5"/>
  </g>
  <g fill="#ffffff" stroke="{colour}" stroke-width="2.5">
    <circle cx="18" cy="18" r="7.5"/>
    <circle cx="46" cy="18" r="7.5"/>
    <circle cx="18" cy="46" r="7.5"/>
    <circle cx="46" cy="46" r="7.5"/>
  </g>
</svg>
"""


def main() -> None:
    from playwright.sync_api import sync_playwright

    from tests.ui.lab import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        for name, colour in COLOURS.items():
            svg = LOGO.format(colour=colour)
            (HERE / name / "logo-svg.svg").write_text(svg)
            src = "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode()
            for size in (32, 64):
                page.set_content(f'<img src="{src}" width="{size}" height="{size}" '
                                 'style="display:block">')
                page.locator("img").screenshot(path=str(HERE / name / f"logo-{size}x{size}.png"),
                                               omit_background=True)
        browser.close()


if __name__ == "__main__":
    main()
