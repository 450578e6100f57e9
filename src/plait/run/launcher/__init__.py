"""The `plait train` side (no torch at import): request -> RunConfig (resolve), checks before launch
(preflight), the one GPU-or-CPU decision (device), torchrun (launch) and how the run ended (outcome)."""
