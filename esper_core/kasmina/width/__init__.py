"""Width growth: seeds that add units to a host layer and, once kept, merge into it.

- ``trace``: find a layer's consumer and the ops in between by a dry forward; refuse what cannot
  take new units.
- ``seed``: the k new units as a side module (``WidthSeed``) while they are young.
- ``init``: random, GradMax and TINY initialisations from the host's own signals.
- ``merge``: fold a blended seed into physically wider layers, optimizer state included.
- ``kind``: the width kind (``kinds.SeedKind``) the seed manager asks at the steps kinds differ.
"""

from esper_core.kasmina.width.init import WIDTH_INITS, init_width_seed_, width_batches
from esper_core.kasmina.width.merge import merge_width_seed, resize_width
from esper_core.kasmina.width.seed import WidthSeed
from esper_core.kasmina.width.slot import WIDTH_SLOT_SUFFIX, WidthSlot, graft_width_slot
from esper_core.kasmina.width.trace import Step, WidthSite, trace_width_site

__all__ = [
    "WIDTH_INITS",
    "WIDTH_SLOT_SUFFIX",
    "Step",
    "WidthSeed",
    "WidthSite",
    "WidthSlot",
    "graft_width_slot",
    "init_width_seed_",
    "merge_width_seed",
    "resize_width",
    "trace_width_site",
    "width_batches",
]
