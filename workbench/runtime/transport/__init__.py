"""How tensors move between ranks: pre-posted point-to-point transfers and the warm-up (``comm``), the
messages and communicators of a schedule (``comm_plan``), shared memory between the ranks of one
machine (``shm``), the kinds of the messages (``messages``); and the NCCL check: the runtime's
``torch.distributed`` calls recorded (``trace``), every rank's executor run on a dry world
(``dry_run``), NCCL's and torch's rules run on the record (``nccl_model``).
"""
