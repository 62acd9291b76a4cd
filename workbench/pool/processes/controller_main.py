"""The controller's entry point where it is not forked from a zygote (pools off this machine): ipyparallel's
own controller, whose sessions say nothing of signing (they speak CurveZMQ: :mod:`.quiet`).

Run as ``python -m workbench.pool.processes.controller_main [ipcontroller options]`` (the pool's controller
launcher does: :class:`workbench.pool.launch.spawn.PoolControllerLauncher`).
"""

from __future__ import annotations

if __name__ == "__main__":
    from ipyparallel.controller.app import main

    from workbench.pool.processes import quiet

    quiet.pool_process()
    main()
