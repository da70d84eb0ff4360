"""The torch backend: every ge2 op written with torch. It is the oracle the tests compare with.

This is the one place in ``ge2/`` where torch does arithmetic; the product path never reaches it
unless the user asks for ``ge2.use_backend("torch")``.
"""
from ge2.backend.torch_backend import elementwise, reduction, gemm  # noqa: F401
from ge2.backend.torch_backend import softmax, losses  # noqa: F401
from ge2.backend.torch_backend import norm, dropout, embedding, optim  # noqa: F401,E402
from ge2.backend.torch_backend import conv, pool  # noqa: F401,E402
from ge2.backend.torch_backend import attention  # noqa: F401,E402
from ge2.backend.torch_backend import sampling  # noqa: F401,E402
from ge2.backend.torch_backend import scan, sort  # noqa: F401,E402
from ge2.backend.torch_backend import layout, resample  # noqa: F401,E402
from ge2.backend.torch_backend import rnn  # noqa: F401,E402
from ge2.backend.torch_backend import indexing, scatter  # noqa: F401,E402
