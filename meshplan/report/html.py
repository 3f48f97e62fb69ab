"""Render a report Document as one self-contained HTML file: inline CSS and SVG, no scripts,
no fonts, no links outside the page."""

from __future__ import annotations

from html import escape

from meshplan.report.document import Document, Figure, Table

CSS = """
:root { --ink: #1f2328; --muted: #59636e; --line: #d1d9e0; --accent: #d62728; --card: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #ffffff;
       font: 14px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; }
header { padding: 24px 32px 8px; border-bottom: 1px solid var(--line); }
header h1 { margin: 0 0 4px; font-size: 24px; }
header p { margin: 0; color: var(--muted); }
nav { padding: 8px 32px; border-bottom: 1px solid var(--line); background: var(--card); }
nav a { margin-right: 16px; color: #0969da; text-decoration: none; }
main { padding: 8px 32px 48px; max-width: 1280px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
        min-width: 160px; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .value { font-size: 18px; font-weight: 600; }
.headline { border-left: 4px solid var(--accent); padding: 8px 12px; background: #fff5f5; font-weight: 600; }
h2 { margin-top: 32px; padding-bottom: 4px; border-bottom: 1px solid var(--line); font-size: 18px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; color: var(--muted); padding-bottom: 4px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--card); }
tr.chosen td { background: #fff5f5; font-weight: 600; }
.scroll { overflow-x: auto; }
figure { margin: 12px 0; }
figure svg { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 12px; }
"""


def table_html(table: Table) -> str:
    parts = ['<div class="scroll"><table>']
    if table.caption:
        parts.append(f"<caption>{escape(table.caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in table.headers) + "</tr></thead><tbody>")
    for i, row in enumerate(table.rows):
        cls = ' class="chosen"' if i == table.highlight_row else ""
        parts.append(f"<tr{cls}>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>")
    parts.append("</tbody></table></div>")
    return "".join(parts)


def figure_html(figure: Figure) -> str:
    return f'<figure id="fig-{figure.name}">{figure.svg}<figcaption>{escape(figure.caption)}</figcaption></figure>'


def render_html(doc: Document) -> str:
    cards = "".join(
        f'<div class="card"><div class="label">{escape(label)}</div><div class="value">{escape(value)}</div></div>'
        for label, value in doc.key_figures
    )
    nav = "".join(f'<a href="#{s.anchor}">{escape(s.title)}</a>' for s in doc.sections)
    body = []
    for section in doc.sections:
        body.append(f'<section id="{section.anchor}"><h2>{escape(section.title)}</h2>')
        for item in section.items:
            if isinstance(item, Table):
                body.append(table_html(item))
            elif isinstance(item, Figure):
                body.append(figure_html(item))
            else:
                body.append(f"<p>{escape(item)}</p>")
        body.append("</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(doc.title)}</title><style>{CSS}</style></head><body>"
        f"<header><h1>{escape(doc.title)}</h1><p>{escape(doc.subtitle)}</p></header>"
        f'<nav>{nav}</nav><main><div class="cards">{cards}</div>'
        f'<p class="headline">{escape(doc.headline)}</p>' + "\n".join(body) + "</main></body></html>\n"
    )
