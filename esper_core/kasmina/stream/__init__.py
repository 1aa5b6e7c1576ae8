"""Stream growth: double a transformer's model width (d_model, heads, MLP hidden widths) in
place, keeping the function it computes.

- ``plan``: which modules and parameters meet the residual stream, and how each changes; refuse
  what cannot be followed, by name.
- ``widen``: carry the plan out on the weights and the optimizer's state, and check the output
  on a real batch.
"""

from esper_core.kasmina.stream.plan import StreamPart, StreamPlan, plan_stream, stream_width
from esper_core.kasmina.stream.widen import StreamWidening, widen_stream

__all__ = ["StreamPart", "StreamPlan", "StreamWidening", "plan_stream", "stream_width", "widen_stream"]
