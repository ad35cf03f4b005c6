"""Measurements about QEs and estimators rather than translators: `qeebm qe-check`, the
hackability probe, the gradient-bias study and the benchmarks."""
