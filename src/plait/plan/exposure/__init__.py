"""Communication left on the critical path: the overlap rule (``overlap``) and ZeRO-3's per-unit
gathers and reduce-scatters (``zero3``). No torch."""
