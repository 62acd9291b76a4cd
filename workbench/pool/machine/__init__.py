"""What this machine has, asked without touching CUDA: its GPUs (``devices``, through NVML), its network
interfaces (``netif``), and where the pool's channels listen (``exposure``)."""
