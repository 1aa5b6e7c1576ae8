"""Plain ``nn.Module`` reference models, with no Esper machinery: the kind of model a user brings.

Their submodules have stable, meaningful names (``fc1``, ``conv2``, ``out``, ...) so that seed
slots can be attached to them by name from outside.
"""

from esper_core.models.mnist1d import MNIST1DCNN, MNIST1DMLP, MNIST1DLogistic

__all__ = ["MNIST1DCNN", "MNIST1DMLP", "MNIST1DLogistic"]
