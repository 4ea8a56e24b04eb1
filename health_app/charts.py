"""Server-rendered SVG charts for the dashboard: stacked bars, lines and horizontal bars.

Each function takes the labels and numbers the chart's accessible table shows and returns an ``<svg>``
(a ``SafeString``; every label is escaped) with ``role="img"`` and an ``aria-label``. Colours come from CSS
classes (``static/css/dashboard.css``), so the light and dark themes apply. Every drawn mark carries its
figure in ``data-value`` (and its label in ``data-label``) and a ``<title>`` tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

__all__ = ["bars", "hbars", "lines", "nice_top", "text_width"]

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 30
#: The largest size (SVG units) the stylesheet gives a tick's text: a phone draws the chart at about half
#: size, so ``static/css/dashboard.css`` sets this size there (and a smaller one on wider screens).
TICK_FONT = 18
#: A tick text's advance per character, in ems, a little above the console's sans-serif fonts: wide
#: characters, narrow ones (punctuation, space) and every other (digits, "$", letters).
WIDE_EM, NARROW_EM, CHAR_EM = 0.95, 0.35, 0.66
_WIDE, _NARROW = frozenset("%MWmw@"), frozenset(".,:;' |!ijl")
#: The room (SVG units) kept between a y figure and the plot, and between two x labels.
GAP = 6


def nice_top(value: float, integer: bool = False) -> float:
    """The axis' top for values up to ``value``: the smallest 1, 2, 2.5 or 5 × 10ⁿ at or above it (1 for
    nothing to draw); ``integer``: a multiple of 4 whose quarters (the grid lines) are whole numbers."""
    if integer:
        return 4 * max(1.0, nice_top(value / 4), float(math.ceil(nice_top(value / 4))))
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base * (1 + 1e-9):
            return step * base
    return 10 * base  # pragma: no cover - the loop always returns


def _fmt(value: float, unit: str) -> str:
    text = f"{value:,.4g}" if value < 1000 else f"{value:,.0f}"
    if unit == "$":
        return f"${text}"
    return f"{text} {unit}".strip() if unit not in ("", "%") else f"{text}{unit}"


def _svg(title: str, body: list[str], height: int = HEIGHT) -> SafeString:
    return mark_safe(f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" preserveAspectRatio="xMidYMid meet" '
                     f'role="img" aria-label="{escape(title)}" focusable="false">' + "".join(body) + "</svg>")


def text_width(text: str) -> float:
    """The width (SVG units) a tick's ``text`` may take at :data:`TICK_FONT`, measured by characters."""
    ems = sum(WIDE_EM if c in _WIDE else NARROW_EM if c in _NARROW else CHAR_EM for c in text)
    return ems * TICK_FONT


def _axes(labels: Sequence[str], top: float, unit: str) -> tuple[list[str], float, float, float]:
    """Grid lines with their figures, x labels (every n-th, never overlapping), the plot's left edge, width
    and height. The plot starts right of the widest y figure and ends where the last x label fits."""
    ticks = [_fmt(top * i / 4, unit) for i in range(5)]
    left = max(float(LEFT), max(text_width(t) for t in ticks) + 2 * GAP)
    label_w = max((text_width(label) for label in labels), default=0.0)
    n = max(1, len(labels))
    right = max(float(RIGHT), label_w / 2 - (WIDTH - left - RIGHT) / n / 2 + 1)
    plot_w, plot_h = WIDTH - left - right, HEIGHT - TOP - BOTTOM
    slot = plot_w / n
    every = max(1, math.ceil((label_w + GAP) / slot))
    out = []
    for i, tick in enumerate(ticks):
        y = TOP + plot_h - plot_h * i / 4
        out.append(f'<line class="grid" x1="{left:.1f}" x2="{WIDTH - right:.1f}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{left - GAP:.1f}" y="{y + 4:.1f}" text-anchor="end">{escape(tick)}</text>')
    last = n - 1  # the labels drawn count back from the last bucket, so the newest one is always named
    for i, label in enumerate(labels):
        if (last - i) % every == 0:
            x = left + slot * (i + 0.5)
            out.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 10}" text-anchor="middle">{escape(label)}</text>')
    return out, left, plot_w, plot_h


def bars(labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], *, title: str,
         unit: str = "", integer: bool = False) -> SafeString:
    """Bars per label, the ``series`` (``(css class, name, values)``) stacked bottom up; ``integer``: counts."""
    top = nice_top(max((sum(s[2][i] for s in series) for i in range(len(labels))), default=0), integer)
    body, left, plot_w, plot_h = _axes(labels, top, unit)
    slot = plot_w / max(1, len(labels))
    width = max(1.0, slot * 0.72)
    for i, label in enumerate(labels):
        base = 0.0
        for css, name, values in series:
            value = values[i]
            if not value:
                continue
            h = plot_h * value / top
            y = TOP + plot_h - plot_h * base / top - h
            x = left + slot * i + (slot - width) / 2
            tip = escape(f"{label} · {name}: {_fmt(value, unit)}")
            body.append(f'<rect class="{css}" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{h:.1f}" '
                        f'data-label="{escape(label)}" data-series="{escape(name)}" data-value="{value:g}">'
                        f"<title>{tip}</title></rect>")
            base += value
    return _svg(title, body)


def lines(labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float | None]]], *, title: str,
          unit: str = "", top: float | None = None, integer: bool = False) -> SafeString:
    """One line per series (``(css class, name, values)``), broken where a value is None, a dot per value;
    ``top``: the axis' top (default: :func:`nice_top` of the highest value); ``integer``: counts."""
    highest = max((v for _, _, values in series for v in values if v is not None), default=0)
    top = top if top is not None else nice_top(highest, integer)
    body, left, plot_w, plot_h = _axes(labels, top, unit)
    slot = plot_w / max(1, len(labels))
    for css, name, values in series:
        run: list[str] = []
        dots = []
        for i, value in enumerate(list(values) + [None]):
            if value is None:
                if len(run) > 1:
                    body.append(f'<polyline class="{css}" points="{" ".join(run)}"/>')
                run = []
                continue
            x, y = left + slot * (i + 0.5), TOP + plot_h - plot_h * min(value, top) / top
            run.append(f"{x:.1f},{y:.1f}")
            tip = escape(f"{labels[i]} · {name}: {_fmt(value, unit)}")
            dots.append(f'<circle class="{css}" cx="{x:.1f}" cy="{y:.1f}" r="3" data-label="{escape(labels[i])}" '
                        f'data-series="{escape(name)}" data-value="{value:g}"><title>{tip}</title></circle>')
        body.extend(dots)
    return _svg(title, body)


def hbars(labels: Sequence[str], values: Sequence[int], *, title: str) -> SafeString:
    """One horizontal bar per label (at most 12, the largest first as given), its figure at its end."""
    labels, values = list(labels)[:12], list(values)[:12]
    row, left = 26, 220
    height = max(60, TOP + row * len(labels) + 8)
    top = nice_top(max(values, default=0))
    span = WIDTH - left - RIGHT - 40
    body = []
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = TOP + row * i
        w = max(1.0, span * value / top)
        body.append(f'<text class="tick" x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect class="bar-handoff" x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" '
                    f'data-label="{escape(label)}" data-value="{value}"><title>{escape(label)}: {value}</title></rect>')
        body.append(f'<text class="tick" x="{left + w + 6:.1f}" y="{y + 15}">{value}</text>')
    return _svg(title, body, height)
