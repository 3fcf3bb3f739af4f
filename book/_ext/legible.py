"""Notebook outputs that stay legible on a phone: pictures and tables printed as text.

A matplotlib figure is a raster picture: on a 390-pixel screen the theme shrinks a
990-pixel figure to a third, and its 10-point labels (14 px as drawn at 100 dpi) to
5 px. When the book is built, each picture of a cell's output gets the smallest width
at which its smallest labels are still MIN_LABEL_PX px high: from its pixels and dpi
(the PNG's header) and the smallest font size its cell asks matplotlib for (matplotlib's
10 points unless the cell's code names a smaller one). Below that width the picture's
box scrolls sideways (static/smol.css) instead of shrinking it further. The widths go
into one <style> element per page, as a class per picture.

A table printed as text (rows of columns lined up with spaces) must not wrap: on a
phone a wrapped row puts its values under the wrong headers. Such an output gets the
class `smol-columns`, which keeps its lines whole and lets its box scroll sideways;
other outputs wrap at the edge of their box as before.
"""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

from docutils import nodes

MIN_LABEL_PX = 8
DEFAULT_POINTS = 10.0  # matplotlib's font.size: tick labels, legends, axis labels
# matplotlib's named sizes, relative to font.size
NAMED = {
    "xx-small": 0.579,
    "x-small": 0.694,
    "small": 0.833,
    "medium": 1.0,
    "large": 1.2,
    "x-large": 1.44,
    "xx-large": 1.728,
}
FONT_SIZE = re.compile(
    r"\b(?:fontsize|labelsize|titlesize|size)\s*=\s*"
    r"(?:(\d+(?:\.\d+)?)|[\"']([a-z-]+)[\"'])"
)


def smallest_points(source: str) -> float:
    """The smallest font size, in points, that a cell's code gives matplotlib (the
    numbers and named sizes of fontsize=, labelsize=, titlesize= and size=), and
    never more than matplotlib's default."""
    sizes = [DEFAULT_POINTS]
    for number, name in FONT_SIZE.findall(source):
        if number:
            sizes.append(float(number))
        elif name in NAMED:
            sizes.append(DEFAULT_POINTS * NAMED[name])
    return min(sizes)


def png_size(data: bytes) -> tuple[int, float]:
    """(width in pixels, dots per inch) of a PNG: from its header and its pHYs chunk
    (72 dpi without one, as browsers and PIL assume)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    width = struct.unpack(">I", data[16:20])[0]
    at = data.find(b"pHYs")
    if at < 0:
        return width, 72.0
    per_unit, _, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    # pixels per metre, a whole number: 3937 for 100 dpi
    return width, round(per_unit * 0.0254, 1) if unit == 1 else 72.0


def legible_width(width: int, dpi: float, points: float) -> int:
    """The narrowest width, in CSS pixels, at which a picture `width` pixels wide,
    drawn at `dpi` with labels of `points`, shows them MIN_LABEL_PX px high."""
    drawn = points * dpi / 72  # a label's height in the picture's own pixels
    return min(width, math.ceil(width * MIN_LABEL_PX / drawn))


WIDEST_TABLE = 88  # characters: what an output box shows whole on a desktop


def is_text_table(text: str) -> bool:
    """Rows of columns lined up with spaces: three or more lines that share a column
    edge (a word starting after two or more spaces, or ending before them, at the same
    position), none of them wider than WIDEST_TABLE characters (wider output wraps on
    every screen anyway)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 3 or max(map(len, lines)) > WIDEST_TABLE:
        return False
    edges: dict[int, int] = {}
    for line in lines:
        found = {m.start() for m in re.finditer(r"(?<=  )\S", line)}
        found |= {-m.end() for m in re.finditer(r"\S(?=  )", line)}
        for at in found:
            edges[at] = edges.get(at, 0) + 1
    return max(edges.values(), default=0) >= 3


def _cell_source(cell: nodes.Element) -> str:
    for block in cell.findall(nodes.literal_block):
        return block.astext()
    return ""


def _mark_pictures(app, doctree) -> None:
    rules = []
    for cell in doctree.findall(nodes.container):
        if "cell" not in cell.get("classes", []):
            continue
        points = smallest_points(_cell_source(cell))
        for block in cell.findall(nodes.literal_block):
            if "output" in block.get("classes", []) and is_text_table(block.astext()):
                block["classes"].append("smol-columns")
        for image in cell.findall(nodes.image):
            uri = image.get("uri", "")
            if not uri.lower().endswith(".png"):
                continue
            path = Path(uri) if Path(uri).is_absolute() else Path(app.srcdir) / uri
            if not path.exists():
                continue
            width, dpi = png_size(path.read_bytes())
            name = f"smol-legible-{len(rules)}"
            image["classes"].append(name)
            rules.append(
                f"img.{name} {{ min-width: {legible_width(width, dpi, points)}px; }}"
            )
    if rules:
        doctree.append(
            nodes.raw("", "<style>\n" + "\n".join(rules) + "\n</style>", format="html")
        )


def setup(app):
    app.connect("doctree-read", _mark_pictures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
