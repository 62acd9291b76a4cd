"""The pool's processes on this machine: how they start and how every one of them ends.

``zygote`` forks a local pool's controller and engines from one process that imported torch once;
``spare`` starts a zygote ahead of the first pool; ``engine_main`` is an engine's entry point; ``reap``
finds every process of a pool by its tag and ends it; ``lease`` ends a pool whose owner died.
"""
