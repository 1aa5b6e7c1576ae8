"""Which shape profiles a blueprint supports.

A blueprint's ``host_kinds`` says which activation kind it transforms (``mlp``: (F,) vectors,
``seq``: (C, L) sequences, ``cnn``: (C, H, W) feature maps, ``tok``: (L, D) channels-last
tokens); its ``ProfileRule`` narrows that to
the profiles it can be built and compiled for (a minimum width, a divisor, a number of
positions, dtypes). Planning, compiling
and ``esper catalog show`` all ask the same rule, so a profile is refused before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from esper_core.karn.profiles import KIND_RANKS, SUPPORTED_DTYPES, ShapeProfile

# How ``describe`` names each kind's shape, its feature (first) axis and its positions.
_SHAPE_WORDS = {"mlp": "(F,) vectors", "seq": "(C, L) sequences", "cnn": "(C, H, W) maps", "tok": "(L, D) tokens"}
_FEATURE_AXIS = {"mlp": "F", "seq": "C", "cnn": "C", "tok": "D"}
_POSITIONS = {"seq": "L", "cnn": "H*W", "tok": "L"}


class UnsupportedProfileError(ValueError):
    """A blueprint cannot be built for a shape profile."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileRule:
    """The shape profiles a blueprint supports.

    Attributes:
        kind: Activation kind: ``mlp`` for (F,) vectors, ``seq`` for (C, L) sequences, ``cnn``
            for (C, H, W) maps, ``tok`` for (L, D) tokens.
        min_features: Smallest F (``mlp``), C (``seq``, ``cnn``) or D (``tok``).
        multiple_of: F (``mlp``), C (``seq``, ``cnn``) or D (``tok``) must be a multiple of this.
        max_positions: Largest L (``seq``, ``tok``) or H * W (``cnn``); attention cost grows
            with its square. Not for ``mlp``.
        dtypes: Activation dtypes the blueprint is numerically sound in.
    """

    kind: str
    min_features: int = 1
    multiple_of: int = 1
    max_positions: int | None = None
    dtypes: tuple[str, ...] = SUPPORTED_DTYPES

    def __post_init__(self) -> None:
        if self.kind not in KIND_RANKS:
            raise ValueError(f"ProfileRule kind must be one of {sorted(KIND_RANKS)}, got {self.kind!r}")
        if self.min_features < 1 or self.multiple_of < 1:
            raise ValueError(
                f"min_features and multiple_of must be >= 1, got {self.min_features} and {self.multiple_of}"
            )
        if self.max_positions is not None and (self.kind not in _POSITIONS or self.max_positions < 1):
            raise ValueError("max_positions applies to seq, tok and cnn rules only and must be >= 1")
        unknown = sorted(set(self.dtypes) - set(SUPPORTED_DTYPES))
        if not self.dtypes or unknown:
            raise ValueError(f"dtypes must be a non-empty subset of {list(SUPPORTED_DTYPES)}, got {self.dtypes}")

    def describe(self) -> str:
        """Human-readable rule, e.g. ``(C, H, W) maps, C >= 4, H*W <= 1024; float32, ...``."""
        name = _FEATURE_AXIS[self.kind]
        parts = [_SHAPE_WORDS[self.kind]]
        if self.min_features > 1:
            parts.append(f"{name} >= {self.min_features}")
        if self.multiple_of > 1:
            parts.append(f"{name} % {self.multiple_of} == 0")
        if self.max_positions is not None:
            parts.append(f"{_POSITIONS[self.kind]} <= {self.max_positions}")
        return ", ".join(parts) + "; " + ", ".join(self.dtypes)

    def problems(self, profile: ShapeProfile) -> list[str]:
        """Why ``profile`` is not supported (empty when it is)."""
        if profile.kind != self.kind:
            return [f"it is a {profile.kind!r} profile of rank {len(profile.feature_shape)}, not {self.kind!r}"]
        found: list[str] = []
        # Channels first, except tokens: their features are the last axis.
        features = profile.feature_shape[-1 if self.kind == "tok" else 0]
        if features < self.min_features:
            found.append(f"{features} features < {self.min_features}")
        if features % self.multiple_of:
            found.append(f"{features} features not a multiple of {self.multiple_of}")
        if self.max_positions is not None:
            positions = profile.numel // features
            if positions > self.max_positions:
                found.append(f"{positions} positions > {self.max_positions}")
        if profile.dtype not in self.dtypes:
            found.append(f"dtype {profile.dtype} not in {list(self.dtypes)}")
        return found

    def check(self, blueprint_id: str, profile: ShapeProfile) -> None:
        """Raise unless ``profile`` is supported.

        Raises:
            UnsupportedProfileError: The message names the profile, the rule and what differs.
        """
        problems = self.problems(profile)
        if problems:
            raise UnsupportedProfileError(
                f"blueprint {blueprint_id!r} supports {self.describe()}; profile {profile.name} "
                f"{profile.feature_shape} does not fit ({'; '.join(problems)}): pick a blueprint for "
                "this slot (`esper catalog list`) or a slot of a supported shape"
            )
