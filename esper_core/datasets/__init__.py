"""Real data sets that are generated or loaded locally and cached under ``$ESPER_HOME/cache/datasets/``.

``esper_core.data`` keeps the tiny bundled workloads and the batcher; the data sets here cost
seconds to build, so each is built once per configuration and cached as an ``.npz`` file
(``cache.py``). They return plain tensors and import nothing else of ``esper_core`` but the
settings, so ``esper_core.data`` can wrap them into its ``Dataset`` without an import cycle.
"""

from esper_core.datasets.mnist1d import (
    PUBLISHED_NUM_TEST,
    PUBLISHED_NUM_TRAIN,
    PUBLISHED_SEED,
    MNIST1DConfig,
    MNIST1DData,
    generate_mnist1d,
    load_mnist1d,
    mnist1d_cache_path,
)

__all__ = [
    "PUBLISHED_NUM_TEST",
    "PUBLISHED_NUM_TRAIN",
    "PUBLISHED_SEED",
    "MNIST1DConfig",
    "MNIST1DData",
    "generate_mnist1d",
    "load_mnist1d",
    "mnist1d_cache_path",
]
