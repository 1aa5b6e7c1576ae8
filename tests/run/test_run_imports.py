"""A run imports torch-geometric only where graphs are batched for training (issue 38).

torch-geometric costs seconds of CPU to import. A run's policies read the state as plain tensor
dicts (the GNN's shadow scoring under the heuristic included); only Simic's training batches
graphs with torch-geometric. Each case runs a real run in a fresh interpreter, since this test
process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from esper_core.settings import EsperSettings

_CHILD = textwrap.dedent(
    """
    import dataclasses, json, sys
    from esper_core.run import Run, grow_epoch
    from esper_core.run.recipes import get_recipe
    from esper_core.settings import EsperSettings
    from esper_core.tamiyo.config import ScheduledGermination

    policy = sys.argv[1]
    config = get_recipe("seed-reference", epochs=2, device="cpu")
    if policy == "scheduled":
        germination = ScheduledGermination(epoch=0, slot="slot0", blueprint="lowrank_adapter")
        config.tamiyo = dataclasses.replace(config.tamiyo, policy="scheduled", schedule=(germination,))
    elif policy != "default":
        config.tamiyo = dataclasses.replace(config.tamiyo, policy=policy)
    run = Run.start(config, settings=EsperSettings(), run_id=policy)
    try:
        actions = [grow_epoch(run, epoch).action for epoch in range(2)]
    finally:
        run.close()
    print(json.dumps({"policy": config.tamiyo.policy, "actions": actions, "pyg": "torch_geometric" in sys.modules}))
    """
)


@pytest.mark.parametrize(
    ("policy", "decides", "first_action"),
    [("default", "heuristic", "wait"), ("none", "none", "wait"), ("scheduled", "scheduled", "germinate")],
)
def test_a_run_whose_policy_trains_no_graph_network_imports_no_torch_geometric(
    compiled_home: EsperSettings, policy: str, decides: str, first_action: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, policy], capture_output=True, text=True, check=False, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["policy"], result["actions"][0]) == (decides, first_action)
    assert not result["pyg"], (
        f"a run under policy {decides!r} imported torch-geometric: import it where graphs are batched "
        "(TamiyoGraph.hetero_data, Simic's dataset), not where a run builds or scores its graph"
    )
