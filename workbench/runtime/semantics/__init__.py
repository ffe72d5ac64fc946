"""What a training step computes, independent of how it is run: stages as pure functions of their
weights and the deterministic microbatch data (``stages``), and the single-process semantic reference
(``reference``) that every executor is tested against.
"""
