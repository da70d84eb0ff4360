"""The op registry and its two backends ("triton", the product; "torch", the oracle).

Importing this package registers every op: each op family declares its schema and Triton
implementation in its own module here, and ``torch_backend`` registers the torch reference.
"""
from ge2.backend.registry import (  # noqa: F401
    ALL_DTYPES,
    BOOL_DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    call,
    defop,
    get_backend,
    get_op,
    ops,
    register,
    use_backend,
)
from ge2.backend.schema import Schema, TensorArg  # noqa: F401

# Op families (each: defop + triton implementations), then the torch oracle for all of them.
from ge2.backend import elementwise, reduction, gemm  # noqa: F401,E402
from ge2.backend import norm, dropout, embedding, optim  # noqa: F401,E402
from ge2.backend import softmax, losses  # noqa: F401,E402
from ge2.backend import conv, pool  # noqa: F401,E402
from ge2.backend import attention  # noqa: F401,E402
from ge2.backend import sampling  # noqa: F401,E402
from ge2.backend import scan, sort  # noqa: F401,E402
from ge2.backend import rnn  # noqa: F401,E402
from ge2.backend import indexing, scatter  # noqa: F401,E402
from ge2.backend import layout, resample  # noqa: F401,E402
from ge2.backend import torch_backend  # noqa: F401,E402
