"""What a pool writes down for every other process of this user: the kernels, the Jupyter server, the lease
and the command line read it from the Jupyter runtime folder.

``state``: the pool's state file (:class:`~workbench.pool.records.state.PoolState`, the only code that reads
or writes it) and the process records in it; ``sharing``: the notebooks driving it, its cell lock, and who
stopped it.
"""
