"""Stream growth: double a transformer's model width (d_model, heads, MLP hidden widths) in
place, keeping the function it computes.

- ``plan``: which modules and parameters meet the residual stream, and how each changes; refuse
  what cannot be followed, by name.
- ``widen``: carry the plan out on the weights and the optimizer's state, and check the output
  on a real batch; give a restored host a recorded width.
- ``kind``: the stream kind (``kinds.SeedKind``): applied at germination, kept at once.
- ``slot``: the slot that owns the stream's width.
"""

from esper_core.kasmina.stream.plan import StreamPart, StreamPlan, output_layer, plan_stream, stream_width
from esper_core.kasmina.stream.slot import STREAM_SLOT, StreamSlot, graft_stream_slot
from esper_core.kasmina.stream.widen import StreamWidening, resize_stream, stream_growth, widen_stream

__all__ = [
    "STREAM_SLOT",
    "StreamPart",
    "StreamPlan",
    "StreamSlot",
    "StreamWidening",
    "graft_stream_slot",
    "output_layer",
    "plan_stream",
    "resize_stream",
    "stream_growth",
    "stream_width",
    "widen_stream",
]
