"""Number formatting shared by the Markdown and HTML reports, so both show the same strings."""

from __future__ import annotations

GIB = 1024**3


def seconds(value_s: float) -> str:
    """Seconds with a unit chosen for readability: 1.234 s, 56.7 ms, 890 us."""
    if value_s == 0:
        return "0 s"
    if value_s >= 1:
        return f"{value_s:.3f} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.2f} ms"
    return f"{value_s * 1e6:.1f} us"


def gib(value_bytes: float) -> str:
    if abs(value_bytes) >= 0.1 * GIB:
        return f"{value_bytes / GIB:.2f} GiB"
    return f"{value_bytes / 1024**2:.1f} MiB"


def pct(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def signed_pct(fraction: float) -> str:
    return f"{fraction * 100:+.1f}%"


def rate(value: float) -> str:
    """Tokens/s and similar: 3 significant figures, thousands separated."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def tflops(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def loss(value: float | None) -> str:
    return "not finite" if value is None else f"{value:.4f}"


def nbytes(value_bytes: float) -> str:
    """Bytes in binary units, about 3 significant figures: 512 B, 3.50 KiB, 12.6 MiB, 1.23 GiB."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value_bytes) >= scale:
            value = value_bytes / scale
            digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
            return f"{value:.{digits}f} {unit}"
    return f"{value_bytes:.0f} B"


def ratio(value: float) -> str:
    """A ratio such as measured / predicted: 1.07x."""
    return f"{value:.2f}x"
