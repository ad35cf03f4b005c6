"""Whole experiments: the recipes (plan, check, run, compare), the language pairs they cover, their
disk needs, the pre-flight checks and the demo on the tiny world."""
