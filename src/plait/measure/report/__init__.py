"""``plait report``: a sweep, a saved plan or a train log as HTML and Markdown; ``plait plan --plot``. No torch.

  build.py          the report: which sections, from which inputs, written where
  sections.py       each sweep section's text, tables and plots
  plan_sections.py  the sections of one saved plan (prediction, memory per stage, waterfall)
  plots.py          the sweep's PNG figures and the pipeline timeline (matplotlib, Agg)
  plan_plots.py     one plan's picture: memory per pipeline stage, step-time waterfall
  plan_pricing.py   how a saved plan is priced beside a sweep (its own times; re-priced only for the same device)
  train_log.py      a train JSONL as loss, eval-loss and learning-rate curves
  chart_data.py     the numbers the charts draw (axis scaling, waterfall bars, spread), no matplotlib
  stage_memory.py   the planner's memory of every pipeline stage
  timeline.py       a plan's pipeline schedule per rank (forward, backward, bubble) and what of it to draw
  render.py         sections -> one HTML page or Markdown
"""
