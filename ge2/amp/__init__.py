"""Mixed precision: ``autocast`` (torch's per-op precision rules) and ``GradScaler`` (fp16 loss scaling)."""
from ge2.amp.autocast_mode import (  # noqa: F401
    autocast,
    autocast_low,
    cast_fp32,
    cast_low,
    cast_widest,
    clear_cache,
    get_autocast_dtype,
    is_autocast_enabled,
    state,
)
from ge2.amp.grad_scaler import GradScaler  # noqa: F401
