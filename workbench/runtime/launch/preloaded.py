"""Imported last by the warm server (:data:`workbench.runtime.launch.warm.PRELOAD`): moves every
object its imports created into the garbage collector's permanent generation (``gc.freeze``).

A forked rank shares the server's memory page by page until it writes to a page. A full collection
in the rank (the runtime runs one before its first barrier) would visit, and so write to, the
header of every object of torch and the workbench: about a second of copy-on-write page faults
on a small machine, in every rank of every job. Frozen objects are never visited; the rank's own
objects are collected as usual. Importing this module anywhere else only exempts the objects alive
at that moment from collection.
"""

import gc

gc.freeze()
