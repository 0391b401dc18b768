#!/usr/bin/env python3
"""Render a slab picture (an SVG of `metrale.picture`) in headless Chromium and
check the screenshot.

    python tools/render_svg.py SVG PNG      screenshot SVG to PNG, then check it
    python tools/render_svg.py --write-docs regenerate docs/slab.svg (the preset
                                            qwen3-next-80b at the CLI's default
                                            limits) and docs/slab.png, checked

The check decodes the PNG with the standard library only (zlib + struct, all
five PNG row filters) and verifies that the image has the size of the SVG, is
not blank, has text on it, and that each buffer fill colour covers about as
many pixels as the SVG's rectangles of that colour add up to: a browser that
drew nothing, drew at the wrong scale or lost the fills fails it.

Exit status: 0 when the screenshot passes, 1 when the check fails, 2 when
Chromium is missing or fails to render.
"""

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib
from collections import Counter
from itertools import accumulate
from pathlib import Path

_SVG_NS = "{http://www.w3.org/2000/svg}"
_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_DOCS_PRESET = "qwen3-next-80b"
REPO = Path(__file__).resolve().parent.parent


class CheckError(Exception):
    """The screenshot does not show what the SVG draws."""


class RenderError(Exception):
    """Chromium is missing, or failed to produce a screenshot."""


# -- Chromium -------------------------------------------------------------------

def find_chromium():
    """The path of a Chromium (or Chrome) executable on PATH, or None.

    Returns
    -------
    str or None
        The first of ``chromium``, ``chromium-browser``, ``google-chrome`` and
        ``google-chrome-stable`` found on PATH.
    """
    for name in _BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def svg_size(svg_path):
    """The pixel size the SVG document asks for.

    Parameters
    ----------
    svg_path : str or os.PathLike
        An SVG file whose root has integer ``width`` and ``height``.

    Returns
    -------
    tuple of int
        ``(width, height)``.

    Raises
    ------
    ValueError
        If the root is not ``<svg>`` or lacks integer ``width``/``height``.
    """
    root = ET.parse(svg_path).getroot()
    if root.tag != _SVG_NS + "svg":
        raise ValueError(f"{svg_path}: the root element is {root.tag}, not an SVG <svg>")
    try:
        return int(root.get("width")), int(root.get("height"))
    except (TypeError, ValueError):
        raise ValueError(f"{svg_path}: the <svg> root needs integer width and height "
                         f"(got {root.get('width')!r}, {root.get('height')!r})") from None


def screenshot(svg_path, png_path, chromium=None, timeout=60):
    """Render `svg_path` in headless Chromium into the PNG `png_path`.

    The window is exactly the SVG's size, so one screenshot pixel is one SVG
    unit.

    Parameters
    ----------
    svg_path, png_path : str or os.PathLike
        The SVG to render and the PNG to write (overwritten).
    chromium : str, optional
        The browser executable; `find_chromium` when None.
    timeout : float
        Seconds to wait for the browser.

    Returns
    -------
    tuple of int
        The ``(width, height)`` rendered.

    Raises
    ------
    RenderError
        If no browser is found, it fails, times out, or writes no PNG.
    """
    chromium = chromium or find_chromium()
    if chromium is None:
        raise RenderError("no chromium on PATH (Debian: apt-get install chromium)")
    width, height = svg_size(svg_path)
    png_path = Path(png_path).resolve()
    if png_path.exists():
        png_path.unlink()
    # A sanitizer runtime preloaded into the test interpreter is not meant
    # for the browser.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    with tempfile.TemporaryDirectory(prefix="metrale-chromium-") as profile:
        cmd = [chromium, "--headless", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--no-default-browser-check", "--mute-audio",
               "--force-device-scale-factor=1", f"--user-data-dir={profile}",
               f"--window-size={width},{height}", f"--screenshot={png_path}",
               Path(svg_path).resolve().as_uri()]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")     # Chromium refuses to run as root otherwise
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise RenderError(f"{chromium} did not finish within {timeout} s") from None
    if proc.returncode != 0 or not png_path.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RenderError(f"{chromium} exited with {proc.returncode} and wrote "
                          f"{'no' if not png_path.exists() else 'a'} PNG:\n{tail}")
    return width, height


# -- PNG, with the standard library only -----------------------------------------

def _unfilter_up(f, prev):
    # Bytewise (f + prev) mod 256 on whole rows as big integers: add the low
    # 7 bits of every byte (no carry can leave a byte), then set each top bit.
    n = len(f)
    a, b = int.from_bytes(f, "little"), int.from_bytes(prev, "little")
    high = int.from_bytes(b"\x80" * n, "little")
    low = high ^ ((1 << (8 * n)) - 1)
    return bytearray((((a & low) + (b & low)) ^ ((a ^ b) & high)).to_bytes(n, "little"))


def _unfilter_sub(f, bpp):
    out = bytearray(len(f))
    for c in range(bpp):
        # Each channel is a running sum of its filtered bytes, modulo 256.
        out[c::bpp] = bytes(map((255).__and__, accumulate(f[c::bpp])))
    return out


# Average and Paeth predict each byte from the same channel of the pixel to
# its left, so each channel is decoded as its own sequence: the left neighbour
# is then the loop's previous value, not an index into the output.

def _unfilter_average(f, prev, bpp):
    out = bytearray(len(f))
    for k in range(bpp):
        res, a = [], 0
        put = res.append
        for x, b in zip(f[k::bpp], prev[k::bpp]):
            a = (x + ((a + b) >> 1)) & 255
            put(a)
        out[k::bpp] = bytes(res)
    return out


def _unfilter_paeth(f, prev, bpp):
    out = bytearray(len(f))
    for k in range(bpp):
        res, a = [], 0
        put = res.append
        up = prev[k::bpp]
        for x, b, c in zip(f[k::bpp], up, b"\0" + up[:-1]):
            pa, pb = b - c, a - c
            pc = pa + pb
            if pa < 0:
                pa = -pa
            if pb < 0:
                pb = -pb
            if pc < 0:
                pc = -pc
            if pa <= pb and pa <= pc:
                a = (x + a) & 255
            elif pb <= pc:
                a = (x + b) & 255
            else:
                a = (x + c) & 255
            put(a)
        out[k::bpp] = bytes(res)
    return out


_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}     # PNG colour type -> samples per pixel


def read_png(path):
    """Decode an 8-bit, non-interlaced PNG into RGB bytes.

    Parameters
    ----------
    path : str or os.PathLike
        The PNG file.

    Returns
    -------
    tuple
        ``(width, height, rgb)``: `rgb` is a bytes object of ``width * height
        * 3`` bytes, rows top to bottom.  Alpha, where the PNG has it, is
        dropped (a browser screenshot is opaque).

    Raises
    ------
    ValueError
        If the file is not a PNG, is truncated or corrupt, or uses a bit
        depth, colour type or interlacing this decoder does not handle.
    """
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat, header, palette = 8, [], None, None
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise ValueError(f"{path}: truncated {kind!r} chunk")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None or not idat:
        raise ValueError(f"{path}: no IHDR or IDAT chunk")
    width, height, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype not in _CHANNELS or interlace:
        raise ValueError(f"{path}: bit depth {depth}, colour type {ctype}, interlace "
                         f"{interlace}: only 8-bit non-interlaced PNGs are handled")
    if ctype == 3 and palette is None:
        raise ValueError(f"{path}: palette image without a PLTE chunk")
    bpp = _CHANNELS[ctype]
    stride = width * bpp
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise ValueError(f"{path}: corrupt image data ({e})") from None
    if len(raw) < height * (stride + 1):
        raise ValueError(f"{path}: image data holds {len(raw)} bytes, "
                         f"{height * (stride + 1)} needed")
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        start = y * (stride + 1)
        ftype, f = raw[start], raw[start + 1:start + 1 + stride]
        if ftype == 0:
            row = bytearray(f)
        elif ftype == 1:
            row = _unfilter_sub(f, bpp)
        elif ftype == 2:
            row = _unfilter_up(f, prev)
        elif ftype == 3:
            row = _unfilter_average(f, prev, bpp)
        elif ftype == 4:
            row = _unfilter_paeth(f, prev, bpp)
        else:
            raise ValueError(f"{path}: row {y} has unknown filter type {ftype}")
        rows.append(row)
        prev = row
    pixels = b"".join(rows)
    if ctype == 2:
        rgb = pixels
    elif ctype == 6:
        rgb = bytearray(width * height * 3)
        for c in range(3):
            rgb[c::3] = pixels[c::4]
    elif ctype == 0:
        rgb = bytes(v for v in pixels for _ in range(3))
    elif ctype == 4:
        rgb = bytes(v for v in pixels[0::2] for _ in range(3))
    else:
        rgb = b"".join(palette[3 * i:3 * i + 3] for i in pixels)
    return width, height, bytes(rgb)


# -- the check ------------------------------------------------------------------

def _hex_rgb(colour):
    c = colour.lstrip("#")
    return tuple(int(c[i:i + 2], 16) for i in (0, 2, 4))


def expected_fill_areas(svg_path):
    """Square pixels each buffer fill colour covers, from the SVG's geometry.

    Parameters
    ----------
    svg_path : str or os.PathLike
        A picture from ``metrale.picture.render_svg``.

    Returns
    -------
    dict
        ``(r, g, b) -> area`` over the buffer rectangles and their table
        swatches (both ``fill="#rrggbb"`` rects).
    """
    areas = Counter()
    for el in ET.parse(svg_path).getroot().iter(_SVG_NS + "rect"):
        if el.get("data-buffer") is None and el.get("data-swatch") is None:
            continue
        areas[_hex_rgb(el.get("fill"))] += float(el.get("width")) * float(el.get("height"))
    return dict(areas)


def check_screenshot(svg_path, png_path, tolerance=4):
    """Check that the PNG screenshot shows the SVG picture.

    Parameters
    ----------
    svg_path, png_path : str or os.PathLike
        The picture and its screenshot (one pixel per SVG unit).
    tolerance : int
        Per-channel difference under which a pixel counts as a fill colour.

    Returns
    -------
    list of str
        One line per passed check, for the report.

    Raises
    ------
    CheckError
        If the size differs, the image is blank or has no text, or a fill
        colour covers too few or too many pixels.
    """
    width, height = svg_size(svg_path)
    pw, ph, rgb = read_png(png_path)
    if (pw, ph) != (width, height):
        raise CheckError(f"screenshot is {pw}x{ph}, the SVG is {width}x{height}")
    it = iter(rgb)
    colours = Counter(zip(it, it, it))
    total = pw * ph
    report = [f"size {pw}x{ph} matches the SVG"]

    white = colours.get((255, 255, 255), 0)
    if white > 0.95 * total:
        raise CheckError(f"blank: {white / total:.1%} of the pixels are white")
    dark = sum(n for c, n in colours.items() if max(c) < 110)
    if dark < 2000:
        raise CheckError(f"no text: only {dark} dark pixels")
    report.append(f"not blank: {1 - white / total:.1%} non-white, {dark} dark (text) pixels")

    def near(target):
        return sum(n for c, n in colours.items()
                   if all(abs(x - y) <= tolerance for x, y in zip(c, target)))

    expected = expected_fill_areas(svg_path)
    if not expected:
        raise CheckError("the SVG has no buffer rectangles (data-buffer)")
    seen_sum = exp_sum = 0.0
    for colour, area in sorted(expected.items(), key=lambda kv: -kv[1]):
        seen = near(colour)
        seen_sum += seen
        exp_sum += area
        # Below ~1000 px the pixel snapping of thin rectangles (a buffer under
        # a pixel tall still paints a row) and the table swatches' edges
        # dominate; those colours count in the total only.
        if area < 1000:
            continue
        ratio = seen / area
        # Labels written over a fill hide part of it (down to about 0.6 for
        # a short, labelled buffer); more than the drawn area means the scale
        # is wrong.
        if not 0.55 <= ratio <= 1.08:
            raise CheckError(f"fill #{'%02x%02x%02x' % colour}: {seen} pixels on screen, "
                             f"{area:.0f} drawn (ratio {ratio:.2f})")
    ratio = seen_sum / exp_sum
    if not 0.8 <= ratio <= 1.05:
        raise CheckError(f"buffer fills cover {seen_sum:.0f} pixels, {exp_sum:.0f} drawn "
                         f"(ratio {ratio:.2f})")
    report.append(f"buffer fills: {len(expected)} colours, {seen_sum:.0f} of {exp_sum:.0f} "
                  f"drawn pixels on screen (ratio {ratio:.3f})")
    return report


# -- the docs image -------------------------------------------------------------

def write_docs(docs=REPO / "docs", chromium=None):
    """Regenerate docs/slab.svg with ``metrale plan --preset qwen3-next-80b
    --svg``, then its screenshot docs/slab.png, and check it.

    Parameters
    ----------
    docs : str or os.PathLike
        The folder to write slab.svg and slab.png into.
    chromium : str, optional
        The browser executable; `find_chromium` when None.

    Returns
    -------
    list of str
        The check's report.

    Raises
    ------
    RenderError, CheckError
        As `screenshot` and `check_screenshot`; RenderError also when
        ``metrale plan`` fails.
    """
    import contextlib
    import io

    from metrale import cli

    docs = Path(docs)
    docs.mkdir(parents=True, exist_ok=True)
    svg, png = docs / "slab.svg", docs / "slab.png"
    # Exactly `metrale plan --preset ... --svg docs/slab.svg`; its ledger is not wanted.
    with contextlib.redirect_stdout(io.StringIO()):
        status = cli.main(["plan", "--preset", _DOCS_PRESET, "--svg", str(svg)])
    if status:
        raise RenderError(f"metrale plan --svg {svg} failed with status {status}")
    screenshot(svg, png, chromium)
    return [f"wrote {svg} and {png}"] + check_screenshot(svg, png)


def main(argv=None):
    """Command line entry; returns the exit status (0 ok, 1 check failed, 2 render)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("svg", nargs="?", help="the SVG to render")
    ap.add_argument("png", nargs="?", help="the PNG screenshot to write")
    ap.add_argument("--write-docs", action="store_true",
                    help=f"regenerate docs/slab.svg ({_DOCS_PRESET}) and docs/slab.png")
    ap.add_argument("--chromium", help="browser executable (default: chromium on PATH)")
    ap.add_argument("--no-check", action="store_true", help="render only")
    args = ap.parse_args(argv)
    if args.write_docs == bool(args.svg or args.png) or (args.svg and not args.png):
        ap.error("give either SVG and PNG, or --write-docs")
    try:
        if args.write_docs:
            lines = write_docs(chromium=args.chromium)
        else:
            screenshot(args.svg, args.png, args.chromium)
            lines = [f"rendered {args.png}"]
            if not args.no_check:
                lines += check_screenshot(args.svg, args.png)
    except RenderError as e:
        print(f"render_svg: {e}", file=sys.stderr)
        return 2
    except (CheckError, ValueError) as e:
        print(f"render_svg: check failed: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
