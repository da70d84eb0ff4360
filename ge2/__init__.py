"""ge2: a small deep-learning framework whose every computation is an autotuned Triton kernel."""
from ge2 import runtime  # noqa: F401  (first: decides TRITON_INTERPRET before triton is imported)
from ge2.runtime import (  # noqa: F401
    device,
    get_matmul_precision,
    is_interpreter,
    set_default_device,
    set_matmul_precision,
)
from ge2 import backend  # noqa: F401
from ge2.backend import use_backend, get_backend  # noqa: F401
