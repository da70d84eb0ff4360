"""torch reference implementations of the GEMM ops (PLACEHOLDER: being written)."""
