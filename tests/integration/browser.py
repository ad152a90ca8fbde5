"""The dashboard in headless Chromium, for the page tests: Debian's `chromium`
(ops/setup-system.sh installs it) driven by playwright; no browser is downloaded.

`fits(page, name)` shows a page at 1280 and at 390 px wide, asserts that nothing makes
the page scroll sideways (a wide table scrolls in its own box), and keeps a screenshot
of each width: under `$STREAM_JOBS_SCREENSHOTS` when set (`make screenshots` sets it to
`docs/img/`, the pictures the manual shows), else under `.stack/artifacts/`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
WIDTHS = (1280, 390)
HEIGHT = 900
NAVIGATION_TRIES = 5
# What playwright says when the page navigated away under a step.
_NAVIGATING = ("ERR_ABORTED", "frame was detached", "context was destroyed",
               "navigating", "Navigation", "Not attached to an active page")
T = TypeVar("T")

needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium "
                                    "(ops/setup-system.sh installs it)")


def screenshots() -> Path:
    """Where screenshots go: $STREAM_JOBS_SCREENSHOTS, else the stack's artifacts."""
    chosen = os.environ.get("STREAM_JOBS_SCREENSHOTS")
    if chosen:
        folder = Path(chosen)
    else:
        folder = Path(os.environ.get("STREAM_JOBS_STACK_DIR", REPO / ".stack")) / "artifacts"
    if not folder.is_absolute():
        folder = REPO / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium, closed afterwards."""
    from playwright.async_api import async_playwright

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(executable_path=str(CHROMIUM),
                                               args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def new_page(browser: Browser) -> Page:
    return await browser.new_page(viewport={"width": WIDTHS[0], "height": HEIGHT})


async def sign_in(page: Page, base_url: str, token: str, then: str = "/") -> None:
    """Sign the page's browser in with the gateway's token, then open `then`."""
    await page.goto(f"{base_url}/login?next={then}")
    await page.fill('input[name="token"]', token)
    await page.click('button[type="submit"]')
    await page.wait_for_load_state()


_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const wide = [];
  if (document.documentElement.scrollWidth > width) {
    for (const el of document.body.querySelectorAll('*')) {
      const box = el.getBoundingClientRect();
      if (box.right > width + 1 && !el.closest('.scroll')) {
        wide.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') +
                  ' ends at ' + Math.round(box.right) + ' px');
      }
    }
    if (!wide.length) wide.push('the page is ' + document.documentElement.scrollWidth + ' px');
  }
  return wide.slice(0, 10);
}"""


async def settled(page: Page, step: Callable[[], Awaitable[T]]) -> T:
    """`step()` on a page that may be navigating: a page that refreshes itself (the
    queues, every few seconds) aborts a reload or destroys a script's context when its
    own refresh comes first; then the step is taken again once it has loaded."""
    from playwright.async_api import Error

    for _ in range(NAVIGATION_TRIES - 1):
        try:
            return await step()
        except Error as exc:
            if not any(sign in str(exc) for sign in _NAVIGATING):
                raise
            await page.wait_for_load_state()
    return await step()


async def follow(page: Page, selector: str) -> None:
    """Click `selector`, a link or a button that opens another page, and wait until that
    page has loaded (a click alone returns once the navigation starts, before the new
    page can be read)."""
    async with page.expect_navigation():
        await page.click(selector)


async def reload(page: Page) -> None:
    """Reload the page (see `settled`)."""
    await settled(page, page.reload)


async def overflow(page: Page) -> list[str]:
    """What sticks out of the page sideways at its current width (empty when it fits)."""
    found: list[str] = await settled(page, lambda: page.evaluate(_OVERFLOW))
    return found


async def fits(page: Page, name: str) -> None:
    """The open page at each of WIDTHS: nothing sticks out sideways; a screenshot of
    each, `<name>-<width>.png`. Leaves the page at the first width."""
    for width in (*WIDTHS[1:], WIDTHS[0]):
        await page.set_viewport_size({"width": width, "height": HEIGHT})
        wide = await overflow(page)
        assert not wide, f"{name} at {width} px scrolls sideways: {wide}"
        await settled(page, functools.partial(
            page.screenshot, path=str(screenshots() / f"{name}-{width}.png"), full_page=True))
