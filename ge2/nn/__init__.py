"""Neural-network layers, losses and initialisers: ``import ge2.nn as nn`` reads like ``torch.nn``."""
from ge2.nn.parameter import Parameter  # noqa: F401
from ge2.nn.module import IncompatibleKeys, Module, StateDictError  # noqa: F401
from ge2.nn.container import ModuleDict, ModuleList, Sequential  # noqa: F401
from ge2.nn.linear import Flatten, Identity, Linear  # noqa: F401
from ge2.nn.activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh  # noqa: F401
from ge2.nn.activation import ELU, GLU, SELU, Hardswish, Hardtanh, LogSigmoid, Mish, ReLU6, Softplus  # noqa: F401
from ge2.nn.dropout import Dropout  # noqa: F401
from ge2.nn.normalization import BatchNorm1d, BatchNorm2d, LayerNorm, RMSNorm  # noqa: F401
from ge2.nn.sparse import Embedding  # noqa: F401
from ge2.nn.loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss  # noqa: F401
from ge2.nn.conv import AdaptiveAvgPool2d, AvgPool2d, Conv2d, MaxPool2d  # noqa: F401
from ge2.nn.attention import MultiheadAttention  # noqa: F401
from ge2.nn.transformer import TransformerEncoder, TransformerEncoderLayer  # noqa: F401
from ge2.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell  # noqa: F401
from ge2.nn.resample import (  # noqa: F401
    CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d, Fold, PixelShuffle,
    PixelUnshuffle, ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
    ReplicationPad3d, Unfold, Upsample, ZeroPad1d, ZeroPad2d, ZeroPad3d,
)
from ge2.nn import functional, init, utils  # noqa: F401
from ge2.nn.rnn import utils_rnn as _utils_rnn  # noqa: E402

utils.rnn = _utils_rnn  # ge2.nn.utils.rnn.pack_padded_sequence, as in torch
from ge2.nn import parallel  # noqa: F401,E402  (DistributedDataParallel)
