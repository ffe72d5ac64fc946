"""This machine's calibration: links, all-reduce and stage timings measured on real ranks
(``machine``), the split of a measured step's wall time (``wall_time``), tiny deterministic models for
checks (``toy``).
"""
