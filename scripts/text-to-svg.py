#!/usr/bin/env python3
"""Draws a terminal's text (stdin) as an SVG picture (stdout): what docs/ shows of a
command's screen, such as `braid top`. Monospace text on a dark background, one
<text> line per input line, sized to the longest line.
  braid top -n 1 braid://MGS/ | scripts/text-to-svg.py "braid top" > docs/img/braid-top.svg
"""
import html
import sys

title = sys.argv[1] if len(sys.argv) > 1 else ""
lines = sys.stdin.read().rstrip("\n").split("\n")
char_w, line_h, pad = 8.4, 17, 14
width = int(max(len(l) for l in lines + [title]) * char_w + 2 * pad)
top = pad + (line_h + 6 if title else 0)
height = int(top + len(lines) * line_h + pad)
out = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
    f'<rect width="{width}" height="{height}" rx="6" fill="#1e1f24"/>',
    '<g font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="14" xml:space="preserve">',
]
if title:
    out.append(f'<text x="{pad}" y="{pad + 12}" fill="#8ab4f8">{html.escape(title)}</text>')
for i, line in enumerate(lines):
    colour = "#f2c94c" if line.startswith(("TARGET", "JOB")) else "#e8eaed"
    out.append(f'<text x="{pad}" y="{top + (i + 1) * line_h - 4}" fill="{colour}">{html.escape(line)}</text>')
out.append("</g></svg>")
print("\n".join(out))
