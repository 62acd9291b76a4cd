"""Engine-side torch.distributed code: rendezvous, process group, teardown.

Runs on the engines only. Imports torch, never any UI library.
"""
