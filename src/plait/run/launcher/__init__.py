"""The `plait train` side (no torch at import): request -> RunConfig (resolve), checks before launch
(preflight), torchrun (launch) and how the run ended (outcome). The one GPU-or-CPU decision, which
the ranks make too, is ``plait.run.device``: rank code never imports this folder."""
