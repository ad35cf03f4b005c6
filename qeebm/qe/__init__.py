"""Quality estimators (COMET family): loading and saving (`models`), fast scoring (`scoring`),
regression training (`train`), tiny random/trained stand-ins (`tiny`), the differentiable energy
(`energy`), the translator-to-QE vocabulary bridge (`bridge`), and the pre-flight report on a QE
(`check`, with the degraded references it compares in `degrade`).

Nothing is imported here: importing comet takes seconds, and `qeebm.qe.models.load_qe` must be
able to fail fast before it does.
"""
