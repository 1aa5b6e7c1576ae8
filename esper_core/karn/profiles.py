"""Shape profiles: the activation shape (apart from the batch) that a seed slot feeds a seed.

A profile names one compile target. Its ``name`` is the key Urza stores artifacts under and the
value ``SeedState.shape_profile`` carries, so it must be deterministic and parseable:
``f128-b512`` is ``(128,)`` float32 with batches up to 512; ``f16x8x8-b64-bfloat16`` is
``(16, 8, 8)`` bfloat16 with batches up to 64 (float32, the default, is left out of the name);
``f64x32-b512-tok`` is 64 tokens of 32 features, channels last, and ``f64x32-b512-causal`` the
same in a causal model (a seed at position t may read only positions <= t).

The rank of ``feature_shape`` decides the activation kind (``ShapeProfile.kind``), which a
blueprint must list in its ``host_kinds`` to fit the slot:

- ``mlp``: (F,) feature vectors, e.g. a linear layer's output;
- ``seq``: (C, L) sequences, channels first, e.g. an ``nn.Conv1d`` output of C channels over L
  positions (``f25x20`` is 25 channels of length 20);
- ``cnn``: (C, H, W) feature maps, channels first, e.g. an ``nn.Conv2d`` output;
- ``tok``: (L, D) token features, channels last, e.g. a transformer block's, an embedding's or a
  batch-first LSTM's output (``tokens=True``; the slot's layout decides it, not the rank). L is
  the longest sequence: a compiled token seed accepts any length from 1 to L;
- ``tensor``: any other rank; no shipped blueprint takes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Self

import torch

SUPPORTED_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
KIND_RANKS: dict[str, int] = {"mlp": 1, "seq": 2, "cnn": 3, "tok": 2}
"""The activation kinds blueprints are written for, and the rank of ``feature_shape`` of each."""
HOST_KINDS: tuple[str, ...] = tuple(KIND_RANKS)
"""Activation kinds a blueprint can list in ``host_kinds`` (``tensor`` has no blueprints)."""
_KIND_OF_RANK = {1: "mlp", 2: "seq", 3: "cnn"}
"""The kind of a channels-first profile of each rank (a token profile is ``tok``)."""
_DEFAULT_DTYPE = "float32"
_LAYOUTS = ("tok", "causal")
_NAME_RE = re.compile(
    r"^f(?P<dims>[1-9][0-9]*(?:x[1-9][0-9]*)*)-b(?P<batch>[1-9][0-9]*)"
    r"(?:-(?P<dtype>(?!tok$|causal$)[a-z0-9]+))?(?:-(?P<layout>tok|causal))?$"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapeProfile:
    """The per-sample activation shape, maximum batch and dtype a compiled seed accepts.

    Attributes:
        feature_shape: Shape of one sample, e.g. ``(128,)`` for an MLP layer.
        batch_max: Largest batch the compiled kernel accepts; the batch dimension is dynamic in
            ``[1, batch_max]``.
        dtype: Activation dtype name: one of ``float32``, ``float16``, ``bfloat16``.
        tokens: An (L, D) profile is channels-last token features (kind ``tok``), not a (C, L)
            channels-first sequence (kind ``seq``).
        causal: The tokens are a causal sequence: a seed's output at position t must not depend
            on positions after t (a language model's). Only with ``tokens``.
    """

    feature_shape: tuple[int, ...]
    batch_max: int = 512
    dtype: str = _DEFAULT_DTYPE
    tokens: bool = False
    causal: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.feature_shape, tuple) or not self.feature_shape:
            raise ValueError(
                f"feature_shape must be a non-empty tuple of ints, got {self.feature_shape!r}: "
                "pass e.g. feature_shape=(128,)"
            )
        if any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in self.feature_shape):
            raise ValueError(
                f"feature_shape {self.feature_shape!r} must hold positive ints: "
                "give the per-sample shape without the batch dimension, e.g. (16, 8, 8)"
            )
        if isinstance(self.batch_max, bool) or not isinstance(self.batch_max, int) or self.batch_max < 2:
            raise ValueError(
                f"batch_max must be an int >= 2, got {self.batch_max!r}: torch.export specialises "
                "a batch dimension whose range is a single value, so declare at least 2"
            )
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported: use one of {list(SUPPORTED_DTYPES)}")
        if self.tokens and len(self.feature_shape) != 2:
            raise ValueError(
                f"a token profile is (L, D) per sample, got {self.feature_shape!r}: pass tokens=False for other shapes"
            )
        if self.causal and not self.tokens:
            raise ValueError("causal applies to token profiles only: pass tokens=True with causal=True")

    @property
    def name(self) -> str:
        """Deterministic profile name, e.g. ``f128-b512`` or ``f16x8x8-b64-bfloat16``."""
        dims = "x".join(str(d) for d in self.feature_shape)
        suffix = "" if self.dtype == _DEFAULT_DTYPE else f"-{self.dtype}"
        layout = "-causal" if self.causal else "-tok" if self.tokens else ""
        return f"f{dims}-b{self.batch_max}{suffix}{layout}"

    @property
    def kind(self) -> str:
        """Activation kind a blueprint must list in ``host_kinds`` to fit: ``mlp`` for feature
        vectors (F,), ``seq`` for sequences (C, L), ``cnn`` for feature maps (C, H, W), ``tok``
        for token features (L, D), ``tensor`` for any other rank."""
        if self.tokens:
            return "tok"
        return _KIND_OF_RANK.get(len(self.feature_shape), "tensor")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The ``torch.dtype`` of ``dtype``."""
        dtype = getattr(torch, self.dtype)
        assert isinstance(dtype, torch.dtype)
        return dtype

    @property
    def numel(self) -> int:
        """Number of elements in one sample."""
        total = 1
        for d in self.feature_shape:
            total *= d
        return total

    @classmethod
    def parse(cls, name: str) -> Self:
        """Inverse of ``name``.

        Args:
            name: A profile name such as ``f128-b512``.

        Returns:
            The profile whose ``name`` equals ``name``.

        Raises:
            ValueError: ``name`` is not a profile name.
        """
        match = _NAME_RE.match(name)
        if match is None:
            raise ValueError(
                f"{name!r} is not a shape profile name: expected 'f<dims>-b<batch_max>[-<dtype>][-tok|-causal]' "
                "with dims joined by 'x', e.g. 'f128-b512', 'f16x8x8-b64-bfloat16' or 'f64x32-b512-causal'"
            )
        dtype = match.group("dtype") or _DEFAULT_DTYPE
        if match.group("dtype") == _DEFAULT_DTYPE:
            raise ValueError(f"{name!r} spells out the default dtype: write {name.replace('-float32', '')!r}")
        layout = match.group("layout")
        return cls(
            feature_shape=tuple(int(d) for d in match.group("dims").split("x")),
            batch_max=int(match.group("batch")),
            dtype=dtype,
            tokens=layout in _LAYOUTS,
            causal=layout == "causal",
        )
