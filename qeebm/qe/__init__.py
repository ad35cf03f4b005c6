"""Quality estimators (COMET family): loading and saving (`models`), fast scoring (`scoring`) with a
padding-free encoder forward (`packed`), regression training (`train`), tiny random/trained
stand-ins (`tiny`), the differentiable energy (`energy`), the translator-to-QE vocabulary bridge
(`bridge`), the QE that QE-dynamic trains (`dynamic`: its trainable parts in `trainable`, its
held-out probe in `heldout`), and the pre-flight report on a QE (`check`, with the degraded
references it compares in `degrade`).

Nothing is imported here: importing comet takes seconds, and `qeebm.qe.models.load_qe` must be
able to fail fast before it does.
"""
