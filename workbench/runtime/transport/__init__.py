"""How tensors move between ranks: pre-posted point-to-point transfers (``comm``), the check of a
schedule's messages against NCCL's matching and blocking (``comm_plan``), shared memory between the
ranks of one machine (``shm``), and the kinds of the messages (``messages``).
"""
