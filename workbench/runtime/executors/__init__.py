"""A rank's op list, run: the pipeline executor with versioned weights (``pipeline``), DDP (``ddp``),
Hogwild (``hogwild``), schedules with segments (``segment_executor``, ``segments``), remote weights of the
master family (``fetch``), weights tied across stages (``tied``), and the measured timeline's rows
(``record``) and clock (``opclock``).
"""
