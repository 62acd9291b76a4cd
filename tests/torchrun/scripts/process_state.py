"""What a new process starts with, as rank 0 sees it: the state a `%dist run` must not inherit from earlier
scripts or cells (issue 39). Prints only on rank 0, one "state" line each.

torchrun --nproc-per-node 2 process_state.py
"""

import os
import sys

import torch


def main():
    seen = {
        "default dtype": torch.get_default_dtype(),
        "default device": torch.get_default_device(),
        "matmul precision": torch.get_float32_matmul_precision(),
        "grad enabled": torch.is_grad_enabled(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch seed left at 1234": torch.initial_seed() == 1234,
        "interactive (sys.ps1)": hasattr(sys, "ps1"),
        "helper module loaded": "datautils" in sys.modules,
        "accelerate state made": "accelerate.state" in sys.modules
        and bool(sys.modules["accelerate.state"].PartialState._shared_state),
        "PL_GLOBAL_SEED": os.environ.get("PL_GLOBAL_SEED"),
        "ACCELERATE_MIXED_PRECISION": os.environ.get("ACCELERATE_MIXED_PRECISION"),
        "main module": type(sys.modules["__main__"]).__name__,
        "a global of an earlier script": "make_dataset" in globals(),
    }
    from accelerate import PartialState

    state = PartialState()
    seen["accelerate processes"] = state.num_processes
    seen["accelerate type"] = state.distributed_type
    if os.environ["RANK"] == "0":
        for key, value in seen.items():
            print(f"state {key}: {value}")


if __name__ == "__main__":
    main()
