"""Triton kernels and their launchers: torch tensors in, torch tensors out. One module per op family."""
