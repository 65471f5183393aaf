"""Charts as inline SVG, drawn on the server (no chart script in the
browser): a line chart of a few series over minutes, and a histogram of
one value per minute. Every number and label is escaped by markupsafe."""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from markupsafe import Markup, escape

# Colours readable on white, told apart without colour too (the legend
# lists them in order and each series has its own dash pattern).
PALETTE = (("#0b4f9c", ""), ("#1d6b2f", "6 3"), ("#a1121b", "2 2"), ("#7a4b00", "8 2 2 2"), ("#5b2a86", "4 4"))


def _nice_max(value: float) -> float:
    """The axis top: value rounded up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _frame(width: int, height: int, top: float, label: str, left: int, bottom: int) -> list[str]:
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
             f'xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>']
    for i in range(5):                                    # horizontal grid, value labels at the left
        y = 8 + (height - 8 - bottom) * i / 4
        parts.append(f'<line x1="{left}" x2="{width - 4}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{_short(top * (4 - i) / 4)}</text>')
    return parts


def _short(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.3g}M"
    if value >= 1_000:
        return f"{value / 1_000:.3g}k"
    return f"{value:.3g}" if value % 1 else str(int(value))


def _time_labels(times: Sequence[dt.datetime], x_of, y: float, every: int, fmt: str) -> list[str]:
    return [f'<text x="{x_of(i):.1f}" y="{y:.1f}" text-anchor="middle">{t.strftime(fmt)}</text>'
            for i, t in enumerate(times) if i % every == 0]


def line_chart(times: Sequence[dt.datetime], series: Sequence[tuple[str, Sequence[int]]], *, label: str,
               width: int = 720, height: int = 220) -> Markup:
    """One line per (name, values), values aligned with times (minutes)."""
    left, bottom = 44, 22
    top = _nice_max(max((v for _, values in series for v in values), default=0))
    n = max(len(times), 2)

    def x_of(i: int) -> float:
        return left + (width - 4 - left) * i / (n - 1)

    def y_of(v: float) -> float:
        return 8 + (height - 8 - bottom) * (1 - v / top)

    parts = _frame(width, height, top, label, left, bottom)
    for (name, values), (colour, dash) in zip(series, PALETTE):
        points = " ".join(f"{x_of(i):.1f},{y_of(v):.1f}" for i, v in enumerate(values))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash_attr} points="{points}">'
                     f'<title>{escape(name)}</title></polyline>')
    parts += _time_labels(times, x_of, height - 6, max(1, len(times) // 6), "%H:%M")
    parts.append("</svg>")
    return Markup("".join(parts))


def histogram(times: Sequence[dt.datetime], values: Sequence[int], *, label: str, now_index: int | None = None,
              width: int = 1200, height: int = 220) -> Markup:
    """One bar per minute (times[i] holds values[i]); now_index marks the present."""
    left, bottom = 44, 22
    bar = (width - left - 8) / max(len(values), 1)
    top = _nice_max(max(values, default=0))

    def x_of(i: int) -> float:
        return left + bar * i

    parts = _frame(width, height, top, label, left, bottom)
    base = height - bottom
    for i, v in enumerate(values):
        if v:
            h = (base - 8) * v / top
            parts.append(f'<rect x="{x_of(i):.2f}" y="{base - h:.1f}" width="{max(bar, 1):.2f}" height="{h:.1f}" '
                         f'fill="#0b4f9c">'
                         f'<title>{times[i]:%H:%M}: {v}</title></rect>')
    if now_index is not None:
        x = x_of(now_index)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="8" y2="{base}" stroke="#a1121b" stroke-width="2"/>'
                     f'<text x="{x + 3:.1f}" y="18" fill="#a1121b">now</text>')
    parts += _time_labels(times, lambda i: x_of(i) + bar / 2, height - 6, 120, "%H:%M")
    parts.append("</svg>")
    return Markup("".join(parts))


def legend(names: Sequence[str]) -> Markup:
    items = "".join(f'<li><span class="key" style="background:{colour}"></span>{escape(name)}</li>'
                    for name, (colour, _) in zip(names, PALETTE))
    return Markup(f'<ul class="legend">{items}</ul>')
