"""Evaluation: translating a test set and scoring it (`qeebm evaluate`), the report each run writes,
and the comparison of runs with significance tests and plots (`scripts/compare.py`)."""
