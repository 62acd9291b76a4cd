"""Functions the kernel sends to engines, importable in the kernel without torch.

The publisher (which loads the training loop's ``Callback``, hence torch) is imported on the
engine only, when the function runs there.

>>> callable(connect)
True
"""

from __future__ import annotations


def connect(channel: dict, **kwargs) -> dict:
    """On an engine: start its publisher and device sampler (see ``publisher.connect``)."""
    from workbench.metrics import publisher

    return publisher.connect(channel, **kwargs)


def disconnect() -> None:
    """On an engine: stop its publisher."""
    from workbench.metrics import publisher

    publisher.disconnect()
