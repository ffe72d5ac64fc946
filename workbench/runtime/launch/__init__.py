"""The parent side and the ranks' lifetime: the run as asked for (``jobspec``) and as described
(``job``), validation, spawn or torchrun and collection (``driver``), one rank's program (``rank``),
starting, watching and stopping the ranks (``lifetime``), the server that forks them warm
(``warm``, ``preloaded``), the rendezvous port and store, core pinning and the allocator
(``ports``, ``affinity``, ``allocator``), checkpoints, CSVs and the summary (``outputs``).
"""
