"""Tezzeret: ahead-of-time compilation of Karn blueprints into kernel artifacts."""

from esper_core.tezzeret.compiler import (
    COMPILER_NAME,
    CompiledKernel,
    ModeDependentModuleError,
    NumericsMismatchError,
    TezzeretConfig,
    compile_blueprint,
    environment_key,
)
from esper_core.tezzeret.formats import EAGER_FORMAT, EagerPayload, decode_eager, encode_eager

__all__ = [
    "COMPILER_NAME",
    "EAGER_FORMAT",
    "CompiledKernel",
    "EagerPayload",
    "ModeDependentModuleError",
    "NumericsMismatchError",
    "TezzeretConfig",
    "compile_blueprint",
    "decode_eager",
    "encode_eager",
    "environment_key",
]
