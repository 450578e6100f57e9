"""``plait validate``'s library side: ``cross`` holds the leave-one-source-out cross-validation (fit the
defaults without a code base, predict it). The row reader and the in-sample comparison are still
``plait.measure.published`` and ``published_specs``."""
