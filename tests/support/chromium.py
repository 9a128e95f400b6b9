"""Headless Chromium for the timeline page tests: render a page, read what its script saw."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"


needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="Chromium is not installed (apt-get install -y chromium)",
)


def chromium(page: Path, tmp_path: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1400,900",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


PROBE = """<script>
  document.body.setAttribute("data-probe", JSON.stringify({
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    phases: Array.from(document.querySelectorAll(".track .bar.phase")).map(function (b) {
      return [b.className, b.textContent, b.getBoundingClientRect().width];
    }),
    summaryRight: document.getElementById("run-summary").getBoundingClientRect().right
  }));
</script></body>"""


def probe(page_html: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The page in headless Chromium at 1400 x 900: what the probe script measured, the DOM."""
    page = tmp_path / "probe.html"
    page.write_text(page_html.replace("</body>", PROBE))
    dom = chromium(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="true"' in dom.stdout and 'class="js-error"' not in dom.stdout
    assert not console_errors(dom.stderr)
    found = re.search(r'data-probe="([^"]*)"', dom.stdout)
    assert found is not None, dom.stdout[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")), dom.stdout
