"""The report as data: sections of paragraphs, tables and figures, rendered by markdown.py and html.py.

Every number is formatted once here (meshplan.report.fmt), so the Markdown and the HTML show the
same strings by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    highlight_row: int = -1
    """Row index drawn emphasised (the chosen plan in the alternatives table); -1 for none."""


@dataclass(kw_only=True)
class Figure:
    name: str
    """File stem of the SVG written beside the Markdown (plots/NAME.svg)."""
    svg: str
    caption: str


@dataclass(kw_only=True)
class Section:
    title: str
    anchor: str
    items: list[str | Table | Figure] = field(default_factory=list)
    """Paragraphs (plain text), tables and figures in reading order."""


@dataclass(kw_only=True)
class Document:
    title: str
    subtitle: str
    key_figures: list[tuple[str, str]]
    """(label, value) cards at the top: step time, tokens/s per GPU, MFU, memory, ..."""
    headline: str
    """The binding-constraint sentence."""
    sections: list[Section] = field(default_factory=list)

    def figures(self) -> list[Figure]:
        return [item for s in self.sections for item in s.items if isinstance(item, Figure)]
