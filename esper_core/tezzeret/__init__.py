"""Tezzeret: ahead-of-time compilation of Karn blueprints into kernel artifacts."""

from esper_core.tezzeret.compiler import (
    AOTI_UNAVAILABLE_TAG,
    COMPILER_NAME,
    CompiledKernel,
    ModeDependentModuleError,
    NumericsMismatchError,
    compile_blueprint,
)
from esper_core.tezzeret.config import Backend, TezzeretConfig, environment_key
from esper_core.tezzeret.formats import (
    BUNDLE_FORMAT,
    EAGER_FORMAT,
    BundlePayload,
    EagerPayload,
    decode_bundle,
    decode_eager,
    encode_bundle,
    encode_eager,
)

__all__ = [
    "AOTI_UNAVAILABLE_TAG",
    "BUNDLE_FORMAT",
    "COMPILER_NAME",
    "EAGER_FORMAT",
    "Backend",
    "BundlePayload",
    "CompiledKernel",
    "EagerPayload",
    "ModeDependentModuleError",
    "NumericsMismatchError",
    "TezzeretConfig",
    "compile_blueprint",
    "decode_bundle",
    "decode_eager",
    "encode_bundle",
    "encode_eager",
    "environment_key",
]
