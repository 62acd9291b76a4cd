"""How the kernel sees a pool alive, and hears its ranks.

``heart`` paces the controller's heartbeat; ``relay`` is the pool's side channel (beacons, metrics and
commands, signed); ``beacons`` keeps what the ranks last said; ``knock`` asks whether a silent rank's process
still holds its port; ``queues`` says what each rank is doing, as the controller sees it; ``idle`` releases a
pool nobody uses. The session's health room is their main user.
"""
