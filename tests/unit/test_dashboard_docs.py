"""The dashboard's page of the manual shows the pictures the browser tests took: every
image a page of docs/ links exists, and every page the browser tests fit at 1280 and 390 px
(`fits(page, "dashboard-...")`) has its picture on docs/operating/dashboard.md."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)]+\.png)\)")
FITTED = re.compile(r'fits\(\w+, "(dashboard-[\w-]+)"\)')


def test_every_image_the_manual_shows_exists() -> None:
    missing = [f"{page.relative_to(REPO)}: {link}"
               for page in DOCS.rglob("*.md")
               for link in IMAGE.findall(page.read_text())
               if not (page.parent / link).resolve().exists()]
    assert not missing, missing


def test_the_dashboard_page_shows_every_page_the_browser_tests_fit() -> None:
    fitted = {name for test in (REPO / "tests" / "integration").glob("test_*.py")
              for name in FITTED.findall(test.read_text())}
    assert fitted, "no browser test fits a page"
    shown = set(IMAGE.findall((DOCS / "operating" / "dashboard.md").read_text()))
    missing = sorted(name for name in fitted
                     if not {f"../img/{name}-1280.png", f"../img/{name}-390.png"} & shown)
    assert not missing, f"docs/operating/dashboard.md shows no picture of {missing}"
