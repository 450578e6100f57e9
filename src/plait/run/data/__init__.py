"""Training data: token files (tokens: format, preparation, layout-independent sampling) and tokenizers."""
