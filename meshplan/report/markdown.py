"""Render a report Document as Markdown; figures are linked SVG files in plots/ beside it."""

from __future__ import annotations

from meshplan.report.document import Document, Figure, Table

PLOTS_DIR = "plots"


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def table_md(table: Table) -> str:
    lines = []
    if table.caption:
        lines += [f"*{table.caption}*", ""]
    lines.append("| " + " | ".join(_cell(h) for h in table.headers) + " |")
    lines.append("|" + "|".join("---" for _ in table.headers) + "|")
    for i, row in enumerate(table.rows):
        cells = [_cell(c) for c in row]
        if i == table.highlight_row:
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure_md(figure: Figure) -> str:
    return f"![{figure.caption}]({PLOTS_DIR}/{figure.name}.svg)"


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", "", doc.subtitle, ""]
    if doc.key_figures:
        out += [
            "| " + " | ".join(label for label, _ in doc.key_figures) + " |",
            "|" + "|".join("---" for _ in doc.key_figures) + "|",
            "| " + " | ".join(_cell(value) for _, value in doc.key_figures) + " |",
            "",
        ]
    out += [f"**{doc.headline}**", ""]
    for section in doc.sections:
        out += [f"## {section.title}", ""]
        for item in section.items:
            if isinstance(item, Table):
                out.append(table_md(item))
            elif isinstance(item, Figure):
                out.append(figure_md(item))
            else:
                out.append(item)
            out.append("")
    return "\n".join(out).rstrip() + "\n"
