"""Depth growth: seeds that insert a block into a stack of identical blocks and, once kept,
merge into it.

- ``stack``: check by a dry forward that a stack's blocks are identical, shape-preserving and
  run as a chain; refuse anything else.
- ``seed``: the new block as a side module (``DepthSeed``: ``block(h) - h``) while it is young.
- ``merge``: append a blended seed's block to the stack, optimizer state included; restore a
  recorded depth.
- ``slot``: the hook after the stack's last block.
- ``kind``: the depth kind (``kinds.SeedKind``) the seed manager asks at the steps kinds differ.
"""

from esper_core.kasmina.depth.merge import merge_depth_seed, resize_depth
from esper_core.kasmina.depth.seed import DepthSeed
from esper_core.kasmina.depth.slot import DEPTH_SLOT_SUFFIX, DepthSlot, graft_depth_slot
from esper_core.kasmina.depth.stack import DepthSite, find_depth_site

__all__ = [
    "DEPTH_SLOT_SUFFIX",
    "DepthSeed",
    "DepthSite",
    "DepthSlot",
    "find_depth_site",
    "graft_depth_slot",
    "merge_depth_seed",
    "resize_depth",
]
