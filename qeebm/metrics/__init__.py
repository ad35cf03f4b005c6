"""Metrics: their registry (names, labels, direction), sacrebleu's rebuilt from signatures, and the
bootstrap that compare.py resamples with."""
