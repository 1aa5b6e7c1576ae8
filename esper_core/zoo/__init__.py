"""A host zoo for learning: procedurally drawn hosts and tasks, each an ordinary Esper recipe.

Simic trains one controller over many architectures by iterating the zoo::

    spec = ZooSpec(seed=0)
    for member in draw_members(spec, 12):
        config = member.recipe()  # a RunConfig: ModelSpec (widen=..., slots=...) + DataSpec

- ``spec``: what a zoo draws from (``ZooSpec``) and one drawn host (``ZooMember``).
- ``tasks``: the data sets (MNIST-1D draws, digits, chars, synthetic tasks of set difficulty).
- ``models``: the families' modules.
- ``recipe``: a member as a ``RunConfig``, with the layers each family may grow.
"""

from esper_core.zoo.recipe import build_model, member_recipe
from esper_core.zoo.spec import FAMILIES, FAMILY_FACTS, Family, ZooMember, ZooSpec, draw_member, draw_members
from esper_core.zoo.tasks import TASKS, TaskName, ZooTask

__all__ = [
    "FAMILIES",
    "FAMILY_FACTS",
    "TASKS",
    "Family",
    "TaskName",
    "ZooMember",
    "ZooSpec",
    "ZooTask",
    "build_model",
    "draw_member",
    "draw_members",
    "member_recipe",
]
