"""Thin IPython magics over :class:`workbench.Session`: parse arguments, call, display."""

from workbench.magics.dist_magics import DistributedMagics


def load_ipython_extension(ipython):
    ipython.register_magics(DistributedMagics)


def unload_ipython_extension(ipython):
    magics = ipython.magics_manager.registry.get("DistributedMagics")
    if magics is not None:
        magics.auto(False)
