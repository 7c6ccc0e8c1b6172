"""Inline SVG charts for the HTML report: stacked bars, lines, horizontal bars.

Owns the drawing of small, dependency-free charts as SVG text (the report must open offline,
so no JavaScript library and no CDN). Each chart carries ``<title>`` tooltips and an
``aria-label``. Must not know about costs: it draws numbers it is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["IDLE_COLOUR", "PALETTE", "grouped_bars", "hbars", "lines", "stacked_bars"]

# Tableau 10: distinguishable, and the default people know from dashboards.
PALETTE = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
IDLE_COLOUR = "#c9ccd1"
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10.0 ** math.floor(math.log10(v))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _fmt(v: float, unit: str) -> str:
    if unit == "%":
        return f"{v:.0f} %"
    if unit == "$":
        if v == 0:
            return "$0"
        if abs(v) >= 1000:
            return f"${v / 1000:.1f}k"
        return f"${v:.2f}" if abs(v) < 10 else f"${v:.0f}"
    return f"{v:.3g}"


def _frame(width: int, height: int, label: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(label)}" style="{FONT}">'
        + "".join(body)
        + "</svg>"
    )


def _y_axis(body: list[str], left: int, top: int, w: int, h: int, vmax: float, unit: str) -> None:
    for i in range(5):
        v = vmax * i / 4
        y = top + h - h * i / 4
        body.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e8eb"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" fill="#5f6670" '
            f'text-anchor="end">{escape(_fmt(v, unit))}</text>'
        )


def _x_labels(body: list[str], labels: Sequence[str], left: int, step: float, y: int) -> None:
    every = max(1, math.ceil(len(labels) / 8))
    for i, lab in enumerate(labels):
        if i % every == 0:
            x = left + step * (i + 0.5)
            body.append(
                f'<text x="{x:.1f}" y="{y}" font-size="11" fill="#5f6670" '
                f'text-anchor="middle">{escape(lab)}</text>'
            )


def _legend(body: list[str], names: Sequence[str], colours: Sequence[str], x: int, y: int) -> None:
    # Item widths follow the text (about 7 px per character at 12 px), wrapping at 760 px.
    cx, cy = x, y
    for name, colour in zip(names, colours, strict=True):
        item_w = 16 + 7 * len(name) + 22
        if cx > x and cx + item_w > x + 760:
            cx, cy = x, cy + 18
        body.append(
            f'<rect x="{cx}" y="{cy - 9}" width="11" height="11" rx="2" fill="{colour}"/>'
            f'<text x="{cx + 16}" y="{cy}" font-size="12" fill="#2b2f36">{escape(name)}</text>'
        )
        cx += item_w


def stacked_bars(
    labels: Sequence[str],
    series: Sequence[tuple[str, str, Sequence[float]]],
    *,
    label: str,
    unit: str = "$",
    width: int = 860,
    height: int = 300,
) -> str:
    """Bars per label, stacked by series ``(name, colour, values)``."""
    left, top, right = 64, 16, 16
    legend_rows = math.ceil(len(series) / 5)
    bottom = 40 + 18 * legend_rows
    w, h = width - left - right, height - top - bottom
    totals = [sum(s[2][i] for s in series) for i in range(len(labels))]
    vmax = _nice_max(max(totals, default=0))
    body: list[str] = []
    _y_axis(body, left, top, w, h, vmax, unit)
    step = w / max(1, len(labels))
    bar_w = max(1.0, step * 0.78)
    for i, lab in enumerate(labels):
        y: float = top + h
        for name, colour, values in series:
            v = values[i]
            if v <= 0:
                continue
            bh = h * v / vmax
            y -= bh
            x = left + step * i + (step - bar_w) / 2
            body.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                f'height="{bh:.1f}" fill="{colour}"><title>{escape(name)} · {escape(lab)}: '
                f"{escape(_fmt(v, unit))}</title></rect>"
            )
    _x_labels(body, labels, left, step, top + h + 16)
    _legend(body, [s[0] for s in series], [s[1] for s in series], left, top + h + 36)
    return _frame(width, height, label, body)


def lines(
    labels: Sequence[str],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    *,
    label: str,
    unit: str = "%",
    vmax: float | None = None,
    width: int = 860,
    height: int = 260,
) -> str:
    """One polyline per series; ``None`` values break the line."""
    left, top, right, bottom = 64, 16, 16, 58
    w, h = width - left - right, height - top - bottom
    peak = max((v for s in series for v in s[2] if v is not None), default=0)
    vmax = vmax or _nice_max(peak)
    body: list[str] = []
    _y_axis(body, left, top, w, h, vmax, unit)
    step = w / max(1, len(labels))
    for name, colour, values in series:
        runs: list[list[str]] = [[]]
        for i, v in enumerate(values):
            if v is None:
                runs.append([])
                continue
            x = left + step * (i + 0.5)
            y = top + h - h * min(v, vmax) / vmax
            runs[-1].append(f"{x:.1f},{y:.1f}")
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}">'
                f"<title>{escape(name)} · {escape(labels[i])}: {escape(_fmt(v, unit))}</title>"
                "</circle>"
            )
        body.extend(
            f'<polyline class="series" points="{" ".join(r)}" fill="none" stroke="{colour}" '
            'stroke-width="2.2" stroke-linejoin="round"/>'
            for r in runs
            if len(r) > 1
        )
    _x_labels(body, labels, left, step, top + h + 16)
    _legend(body, [s[0] for s in series], [s[1] for s in series], left, top + h + 38)
    return _frame(width, height, label, body)


def hbars(
    rows: Sequence[tuple[str, float, str]],
    *,
    label: str,
    unit: str = "$",
    width: int = 420,
    value_text: Sequence[str] | None = None,
) -> str:
    """Horizontal bars ``(name, value, colour)``, largest first as given."""
    left, right, row_h = 120, 70, 24
    height = 12 + row_h * max(1, len(rows))
    w = width - left - right
    vmax = _nice_max(max((r[1] for r in rows), default=0))
    body: list[str] = []
    for i, (name, v, colour) in enumerate(rows):
        y = 6 + i * row_h
        bw = max(1.0, w * v / vmax) if v > 0 else 0
        text = value_text[i] if value_text else _fmt(v, unit)
        body.append(
            f'<text x="{left - 8}" y="{y + 15}" font-size="12" fill="#2b2f36" '
            f'text-anchor="end">{escape(name)}</text>'
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{bw:.1f}" height="{row_h - 8}" '
            f'rx="3" fill="{colour}"><title>{escape(name)}: {escape(text)}</title></rect>'
            f'<text x="{left + bw + 6:.1f}" y="{y + 15}" font-size="12" '
            f'fill="#2b2f36">{escape(text)}</text>'
        )
    return _frame(width, height, label, body)


def grouped_bars(
    labels: Sequence[str],
    series: Sequence[tuple[str, str, Sequence[float]]],
    *,
    label: str,
    unit: str = "$",
    width: int = 860,
    height: int = 260,
) -> str:
    """Bars side by side per label, one per series ``(name, colour, values)``."""
    left, top, right, bottom = 64, 16, 16, 58
    w, h = width - left - right, height - top - bottom
    vmax = _nice_max(max((v for s in series for v in s[2]), default=0))
    body: list[str] = []
    _y_axis(body, left, top, w, h, vmax, unit)
    step = w / max(1, len(labels))
    bar_w = step * 0.8 / max(1, len(series))
    for i, lab in enumerate(labels):
        for j, (name, colour, values) in enumerate(series):
            v = values[i]
            bh = h * max(v, 0) / vmax
            x = left + step * i + step * 0.1 + j * bar_w
            body.append(
                f'<rect class="bar" x="{x:.1f}" y="{top + h - bh:.1f}" width="{bar_w * 0.92:.1f}" '
                f'height="{bh:.1f}" rx="2" fill="{colour}"><title>{escape(name)} · '
                f"{escape(lab)}: {escape(_fmt(v, unit))}</title></rect>"
            )
    _x_labels(body, labels, left, step, top + h + 16)
    _legend(body, [s[0] for s in series], [s[1] for s in series], left, top + h + 38)
    return _frame(width, height, label, body)
