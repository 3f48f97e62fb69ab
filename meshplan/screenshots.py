"""`python -m meshplan.screenshots`: the example reports as a person sees them, rendered in headless
Chromium: reports/screenshots/<example>.png, the whole page at 1280 px wide.

Regenerable: run it after `make reports` (it needs the Debian package `chromium`; without it, it
says so and exits 2). The PNGs are for reading the reports' layout in review; tests do not compare
them (fonts and anti-aliasing differ between machines).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

EXAMPLES = ("demo", "gpt3-175b-1024xa100", "llama3-70b-64xh100")
WIDTH, MAX_HEIGHT = 1280, 16000
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
FLAGS += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _read_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB/RGBA PNG."""
    pos, idat, width, height, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, _, colour = struct.unpack(">IIBB", body[:10])
            bpp = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    import numpy as np  # with torch; only this script needs it

    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        kind, cur = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 2:  # Up, what Chromium writes for most rows: vectorised
            cur = (cur + prev) & 255
        elif kind in (1, 3, 4):  # Sub, Average, Paeth: byte by byte (PNG spec section 9)
            row = cur.tolist()
            up = prev.tolist()
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                corner = up[i - bpp] if i >= bpp else 0
                if kind == 1:
                    pred = left
                elif kind == 3:
                    pred = (left + up[i]) // 2
                else:
                    pa, pb, pc = abs(up[i] - corner), abs(left - corner), abs(left + up[i] - 2 * corner)
                    pred = left if pa <= pb and pa <= pc else up[i] if pb <= pc else corner
                row[i] = (row[i] + pred) & 255
            cur = np.array(row, np.int32)
        out[y] = cur
        prev = cur
    return width, height, bpp, out.tobytes()


def _write_png(path: Path, width: int, height: int, bpp: int, pixels: bytes) -> None:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    stride = width * bpp
    raw = b"".join(b"\x00" + pixels[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 6 if bpp == 4 else 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    )


def _trim(width: int, height: int, bpp: int, pixels: bytes) -> int:
    """The page's height: the last row that is not plain white, plus a margin."""
    stride, white = width * bpp, b"\xff" * (width * bpp)
    for y in range(height - 1, -1, -1):
        if pixels[y * stride : (y + 1) * stride] != white:
            return min(height, y + 24)
    return height


def screenshot(chromium: str, page: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="meshplan-shot-") as tmp:
        png = Path(tmp) / "page.png"
        cmd = [chromium, *FLAGS, f"--user-data-dir={tmp}/profile", f"--screenshot={png}"]
        cmd += [f"--window-size={WIDTH},{MAX_HEIGHT}", page.resolve().as_uri()]
        subprocess.run(cmd, capture_output=True, timeout=180, check=False)
        if not png.exists():
            raise RuntimeError(f"chromium wrote no screenshot of {page}")
        width, height, bpp, pixels = _read_png(png.read_bytes())
    keep = _trim(width, height, bpp, pixels)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_png(out, width, keep, bpp, pixels[: keep * width * bpp])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshplan.screenshots", description=__doc__)
    parser.add_argument("--reports", default="reports", help="the folder `make reports` writes")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("meshplan screenshots: error: headless Chromium not found (apt-get install chromium)", file=sys.stderr)
        return 2
    for name in EXAMPLES:
        page = Path(args.reports) / name / "report.html"
        if not page.exists():
            print(f"meshplan screenshots: error: {page} missing; run `make reports` first", file=sys.stderr)
            return 2
        out = Path(args.reports) / "screenshots" / f"{name}.png"
        screenshot(chromium, page, out)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
