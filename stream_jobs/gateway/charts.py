"""Charts as inline SVG, drawn on the server. Pure: numbers in, markup out.

No script and nothing fetched: a chart is a polyline over the last hour (gaps where a
sample has no value) or a set of horizontal bars, sized by a viewBox so CSS scales it.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 480, 140
_PAD_LEFT, _PAD_RIGHT, _PAD_TOP, _PAD_BOTTOM = 44, 8, 18, 18


def nice_max(value: float) -> float:
    """A round upper bound for an axis: 1, 2 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1.0
    scale = 1.0
    while scale * 10 < value:
        scale *= 10
    while scale > value:
        scale /= 10
    for step in (1, 2, 5, 10):
        if step * scale >= value:
            return step * scale
    return 10 * scale


def _number(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}" if value < 1 else f"{value:.1f}"


def _span_label(span_s: float) -> str:
    """How far back a chart starts: minutes up to two hours, hours up to two days."""
    if span_s <= 7200:
        return f"{span_s / 60:.0f} min"
    return f"{span_s / 3600:.0f} h" if span_s <= 172800 else f"{span_s / 86400:.0f} d"


def line_chart(points: Sequence[tuple[int, float | None]], *, title: str, unit: str,
               end_ms: int, span_s: float = 3600.0, percent: bool = False) -> Markup:
    """`points` are (time in ms, value or None), oldest first, drawn over the `span_s`
    seconds before `end_ms`."""
    start_ms = end_ms - span_s * 1000
    inner_w = WIDTH - _PAD_LEFT - _PAD_RIGHT
    inner_h = HEIGHT - _PAD_TOP - _PAD_BOTTOM
    values = [v for t, v in points if v is not None and t >= start_ms]
    top = 1.0 if percent else nice_max(max(values, default=0.0))

    def xy(t: int, v: float) -> str:
        x = _PAD_LEFT + inner_w * min(1.0, max(0.0, (t - start_ms) / (span_s * 1000)))
        y = _PAD_TOP + inner_h * (1 - min(1.0, max(0.0, v / top)))
        return f"{x:.1f},{y:.1f}"

    lines: list[list[str]] = []
    run: list[str] = []
    for t, v in points:
        if t < start_ms:
            continue
        if v is None:
            if run:
                lines.append(run)
            run = []
        else:
            run.append(xy(t, v))
    if run:
        lines.append(run)
    paths = "".join(
        f'<polyline points="{" ".join(r)}" fill="none" stroke="currentColor" '
        f'stroke-width="1.5" stroke-linejoin="round"/>' if len(r) > 1
        else f'<circle cx="{r[0].split(",")[0]}" cy="{r[0].split(",")[1]}" r="2" '
             'fill="currentColor"/>'
        for r in lines)
    top_label = "100%" if percent else f"{_number(top)} {unit}"
    last = next((v for _, v in reversed(points) if v is not None), None)
    now_label = "no data" if last is None else (f"{last:.0%}" if percent
                                                 else f"{_number(last)} {unit}")
    bottom = HEIGHT - _PAD_BOTTOM
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<text x="{_PAD_LEFT}" y="12" class="chart-title">{escape(title)}: '
        f'{escape(now_label)}</text>'
        f'<line x1="{_PAD_LEFT}" y1="{_PAD_TOP}" x2="{_PAD_LEFT}" y2="{bottom}" class="axis"/>'
        f'<line x1="{_PAD_LEFT}" y1="{bottom}" x2="{WIDTH - _PAD_RIGHT}" y2="{bottom}" '
        'class="axis"/>'
        f'<text x="{_PAD_LEFT - 4}" y="{_PAD_TOP + 4}" text-anchor="end">'
        f'{escape(top_label)}</text>'
        f'<text x="{_PAD_LEFT - 4}" y="{bottom}" text-anchor="end">0</text>'
        f'<text x="{_PAD_LEFT}" y="{HEIGHT - 4}">-{_span_label(span_s)}</text>'
        f'<text x="{WIDTH - _PAD_RIGHT}" y="{HEIGHT - 4}" text-anchor="end">now</text>'
        f'<g class="series">{paths}</g></svg>')


def bar_chart(items: Sequence[tuple[str, int]], *, title: str) -> Markup:
    """Horizontal bars, one per (label, count), longest first as given."""
    row_h, label_w = 22, 150
    height = max(1, len(items)) * row_h + 20
    top = max((n for _, n in items), default=0) or 1
    bars = []
    for i, (label, n) in enumerate(items):
        y = 20 + i * row_h
        w = (WIDTH - label_w - 60) * n / top
        bars.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">'
                    f'{escape(label)}</text>'
                    f'<rect x="{label_w}" y="{y + 3}" width="{max(w, 1):.1f}" height="{row_h - 6}"'
                    ' class="bar"/>'
                    f'<text x="{label_w + w + 6:.1f}" y="{y + 14}">{n:,}</text>')
    empty = "" if items else '<text x="0" y="36">no letters</text>'
    return Markup(f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
                  f'aria-label="{escape(title)}"><title>{escape(title)}</title>'
                  f'<text x="0" y="12" class="chart-title">{escape(title)}</text>'
                  f'{"".join(bars)}{empty}</svg>')


__all__ = ["bar_chart", "line_chart", "nice_max"]
