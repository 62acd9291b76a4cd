"""Engine-side torch.distributed code: rendezvous, process group, teardown.

Runs on the engines only. Imports torch, never any UI library, and nothing of the package above it
but the leaves (``wire``). The kernel reaches it only through :mod:`workbench.remote`.
"""
