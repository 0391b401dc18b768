"""The SVG pieces metrale's pictures share (metrale.picture): escaped text,
rounded coordinates, short binary sizes, the fonts and the text colours."""

import re

_DECIMALS = 4                # coordinates are written rounded to 1e-4 units
_SANS = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif"
_MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
_TEXT = "#202124"
_MUTED = "#5f6368"
# The bar pictures' geometry (x, width and height of a bar, in units).
_BAR_X, _BAR_W, _BAR_H = 20, 860, 40
# Buffer fills cycle through pale colours so that neighbours differ and dark
# text stays readable on them.
_FILLS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
          "#dbdb8d", "#9edae5")

# Characters XML 1.0 cannot carry at all (escaping does not help); a model name
# from a user's path may hold any of them, and lone surrogates too.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _esc(text):
    """`text` made safe for XML character data and attribute values."""
    text = _NOT_XML.sub("\ufffd", str(text))
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&#39;"))


def _num(v):
    """A coordinate, rounded to _DECIMALS places, without trailing zeros."""
    s = f"{v:.{_DECIMALS}f}".rstrip("0").rstrip(".")
    return "0" if s in ("", "-0") else s


def _human(n):
    """Bytes as a short binary size: 256 B, 864.8 KiB, 46.4 MiB, 2.1 GiB."""
    if n < 1024:
        return f"{n} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    v, i = n / 1024, 0
    # Compare the rounded value, so that 1023.97 KiB reads 1 MiB, not 1024 KiB.
    while round(v, 1) >= 1024 and i < len(units) - 1:
        v, i = v / 1024, i + 1
    return f"{round(v, 1):.1f}".rstrip("0").rstrip(".") + " " + units[i]


def _shorten(text, limit):
    # Keep both ends of a long config path: the directory and the file name
    # are the parts a reader recognises.
    if len(text) <= limit:
        return text
    keep = limit - 1
    return text[:keep // 2] + "\u2026" + text[len(text) - (keep - keep // 2):]


def _attrs(**kw):
    # data_buffer -> data-buffer; values escaped; None values dropped.
    return " ".join(f'{k.rstrip("_").replace("_", "-")}="{_esc(v)}"'
                    for k, v in kw.items() if v is not None)


def _text(x, y, body, size=11, anchor="start", weight=None, fill=_TEXT, family=None,
          **extra):
    attrs = _attrs(x=_num(x), y=_num(y), font_size=size, text_anchor=anchor,
                   font_weight=weight, fill=fill, font_family=family, **extra)
    return f"<text {attrs}>{_esc(body)}</text>"
