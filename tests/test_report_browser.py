"""The HTML report as a person sees it: rendered in headless Chromium, screenshotted, no console errors.

Chromium (Debian package `chromium`) is installed by `make test-deps` (CI runs it; as root with
apt-get, when missing), never by `make install` or from inside a test.
Without it the tests skip with one line, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from report_fixtures import gpt_plan, run_for, searched_plan

from meshplan.report import write_report

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--hide-scrollbars",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser, installed by `make test-deps`: absent, the test skips here and fails in CI
    (CI=true), where .ci/run's `make test-deps` must have installed it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        why = (
            "headless Chromium not installed (`make test-deps` adds it as root with apt-get; "
            "or `apt-get install chromium`)"
        )
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why + "; CI must run the browser test")
        pytest.skip(why)
    return found


def render(chromium: str, page: Path, out_png: Path, profile: Path, size: str = "1280,2000") -> list[str]:
    """Screenshot `page`; return the console lines Chromium logged while loading it."""
    cmd = [
        chromium,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--screenshot={out_png}",
        f"--window-size={size}",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out_png.exists(), f"chromium wrote no screenshot (rc {done.returncode}): {done.stderr[-500:]}"
    return [line for line in done.stderr.splitlines() if "CONSOLE" in line]


def read_png_rgb(path: Path) -> np.ndarray:
    """Decode an 8-bit non-interlaced RGB/RGBA PNG (what Chromium writes) to an (H, W, 3) array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + width * bpp)
    return _unfilter(raw, width, bpp)[:, :, :3]


def _unfilter(raw: np.ndarray, width: int, bpp: int) -> np.ndarray:
    """Undo the PNG per-row filters (None, Sub, Up, Average, Paeth; PNG spec section 9)."""
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(raw.shape[0]):
        kind, cur = raw[y, 0], bytearray(raw[y, 1:].tobytes())
        if kind == 1:
            for x in range(bpp, stride):
                cur[x] = (cur[x] + cur[x - bpp]) & 255
        elif kind == 2:
            cur = bytearray(
                ((np.frombuffer(cur, np.uint8).astype(np.int32) + np.frombuffer(prev, np.uint8)) & 255)
                .astype(np.uint8)
                .tobytes()
            )
        elif kind == 3:
            for x in range(stride):
                cur[x] = (cur[x] + ((cur[x - bpp] if x >= bpp else 0) + prev[x]) // 2) & 255
        elif kind == 4:
            for x in range(stride):
                a, b = (cur[x - bpp] if x >= bpp else 0), prev[x]
                c = prev[x - bpp] if x >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(cur))
        prev = cur
    return np.frombuffer(b"".join(rows), np.uint8).reshape(raw.shape[0], width, bpp)


def test_report_renders_in_chromium_without_console_errors(chromium, tmp_path):
    plan = searched_plan()
    write_report(plan, tmp_path / "r", run=run_for(plan))
    shot = tmp_path / "report.png"
    console = render(chromium, tmp_path / "r" / "report.html", shot, tmp_path / "profile")
    assert console == [], "console messages while loading the report:\n" + "\n".join(console)
    pixels = read_png_rgb(shot)
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: blank or unstyled page"
    not_white = (pixels < 245).any(axis=2).mean()
    assert 0.03 < not_white < 0.9, f"{not_white:.1%} of pixels are not white"
    # the plot palette is on screen (forward-blue of the timeline and memory bars)
    assert ((pixels == np.array([0x4C, 0x78, 0xA8])).all(axis=2)).sum() > 500


def test_console_error_detection_works(chromium, tmp_path):
    # the same check must catch a broken page, or the test above could never fail
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><p>x</p><script>console.error('boom'); missing();</script></body></html>")
    console = render(chromium, bad, tmp_path / "bad.png", tmp_path / "profile", size="400,300")
    assert any("boom" in line for line in console) and any("Uncaught" in line for line in console)


def test_svg_plot_files_render(chromium, tmp_path):
    # a large interleaved schedule: the timeline is drawn at screen resolution
    plan = gpt_plan(
        pp=16, dp_replicate=1, tp=1, num_microbatches=192, micro=1, blocks=96, schedule="Interleaved1F1B", virtual=2
    )
    paths = write_report(plan, tmp_path / "r")
    timeline = next(p for p in paths if p.name == "timeline.svg")
    shot = tmp_path / "timeline.png"
    assert render(chromium, timeline, shot, tmp_path / "profile", size="900,300") == []
    pixels = read_png_rgb(shot)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 20
