"""GEMM ops (PLACEHOLDER: being written)."""
