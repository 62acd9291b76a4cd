"""Training metrics: plain records, the engine-side publisher and device sampler, the kernel-side collector.

Engine side (``publisher``, ``sampler``) imports no IPython display, ipywidgets, plotly or tornado;
kernel side (``collector``, ``history``) imports no torch. ``records`` is shared by both. The kernel
connects and disconnects the publishers through :mod:`workbench.remote` (``connect_metrics``).

>>> from workbench.metrics.records import STEP_FIELDS
>>> "loss" in STEP_FIELDS
True
"""
