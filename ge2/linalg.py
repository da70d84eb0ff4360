"""``ge2.linalg``: torch.linalg's names for ge2's ops (``matmul``, ``vector_norm``)."""
from ge2.autograd.linalg import matmul  # noqa: F401
from ge2.autograd.reduction import vector_norm  # noqa: F401
