"""``plait validate``'s library side: ``cross`` (leave-one-source-out: fit the defaults without a code
base, predict it) and ``cells`` (how a published row's cells in words are read). The row reader and
the in-sample comparison are ``plait.measure.published`` and ``published_specs``."""
