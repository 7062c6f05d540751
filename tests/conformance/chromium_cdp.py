"""Drive headless Chromium over the DevTools protocol, with the standard library only.

Chromium's ``--remote-debugging-pipe`` speaks the protocol over file
descriptors 3 (commands in) and 4 (replies and events out), one JSON message
per NUL-terminated frame: no websocket client and no driver binary needed,
so it works wherever Debian's ``chromium`` package is installed, offline.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    explicit = os.environ.get("SHARDSPEC_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, executable: str, width: int = 1600, height: int = 1000, timeout_s: float = 30.0):
        self.executable, self.width, self.height, self.timeout_s = executable, width, height, timeout_s
        self.next_id = 0
        self.buffer = b""
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        self.profile = tempfile.mkdtemp(prefix="shardspec-chromium-")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        args = [
            self.executable,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            f"--user-data-dir={self.profile}",
            f"--window-size={self.width},{self.height}",
            "about:blank",
        ]

        def pipes_as_3_and_4():  # runs in the child, before exec (and after subprocess closes fds)
            high_in, high_out = os.dup(to_browser_r), os.dup(from_browser_w)  # out of the way of 3 and 4
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        self.process = subprocess.Popen(
            args, preexec_fn=pipes_as_3_and_4, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self.to_browser, self.from_browser):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    # -- the protocol ----------------------------------------------------------------

    def call(self, method: str, session: bool = False, **params) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_browser], [], [], left)[0]:
                raise BrowserError(f"no reply from chromium within {self.timeout_s:.0f}s")
            chunk = os.read(self.from_browser, 1 << 16)
            if not chunk:
                raise BrowserError(f"chromium closed the pipe (exit {self.process.poll()})")
            self.buffer += chunk
        frame, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(frame)

    def wait_event(self, method: str) -> dict[str, Any]:
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(self._read())

    # -- what the tests do ------------------------------------------------------------

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, expected: Any, timeout_s: float = 5.0) -> Any:
        """Evaluate until it gives ``expected`` (what a click starts, such as a fragment navigation,
        may finish after the input event returns); returns the last value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value == expected or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element."""
        box = self.evaluate(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView({{block: "center", inline: "center"}});
            const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1], button="left", clickCount=1
            )

    def screenshot(self, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            # The whole page is laid out at least as wide as the viewport (its scroll bar gone): all of it.
            size = self.evaluate(
                "[Math.max(document.documentElement.scrollWidth, window.innerWidth), "
                "document.documentElement.scrollHeight]"
            )
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            )
        return base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])


@contextlib.contextmanager
def headless_chromium(width: int, height: int, skipped: str):
    """A Chromium of this viewport for a test module's browser tests; the test skips, saying ``skipped`` (what
    did not run), where no Chromium is found."""
    executable = find_chromium()
    if executable is None:
        pytest.skip(
            "headless Chromium not found: install Debian's chromium (apt-get install chromium) "
            f"or set SHARDSPEC_CHROMIUM; {skipped}"
        )
    with Chromium(executable, width, height) as chromium:
        yield chromium
