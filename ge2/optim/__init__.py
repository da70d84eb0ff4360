"""Optimizers (fused multi-tensor Triton updates) and learning-rate schedules."""
from ge2.optim.optimizer import Optimizer  # noqa: F401
from ge2.optim.sgd import SGD  # noqa: F401
from ge2.optim.adam import Adam, AdamW  # noqa: F401
from ge2.optim import lr_scheduler  # noqa: F401
from ge2.optim.others import Adagrad, Lion, RMSprop  # noqa: F401,E402
