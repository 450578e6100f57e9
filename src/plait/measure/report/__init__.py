"""``plait report``: a sweep (and optionally a plan and published runs) as HTML and Markdown. No torch.

  build.py     the report: which sections, from which inputs, written where
  sections.py  each section's text, tables and plots
  plots.py     the PNG figures (matplotlib, Agg)
  timeline.py  a plan's pipeline schedule per rank (forward, backward, bubble)
  render.py    sections -> one HTML page or Markdown
"""
