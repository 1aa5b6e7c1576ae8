"""`esper policy tune` before PPO's rate and passes were options (now TuneConfig.ppo_lr/ppo_epochs).

Run from the repository root: python tune_with_ppo.py PPO_LR PPO_EPOCHS HOME PROXY_EPOCHS
(3e-3 8 HOME 15: tune-48-episodes-quarter-epochs-ppo-3e-3.json; 3e-3 8 HOME 60: tune-defaults.json).
"""

import dataclasses
import json
import sys
from pathlib import Path

import esper_core.studies.policy_tune as pt
from esper_core.settings import EsperSettings
from esper_core.simic.learn import SimicConfig

lr, epochs, home, proxy_epochs = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
orig = pt.TuneConfig.plan


def plan(self: pt.TuneConfig, gnn: object) -> object:
    p = orig(self, gnn)  # type: ignore[arg-type]
    return dataclasses.replace(p, simic=SimicConfig(flops_penalty=self.flops_penalty, ppo_lr=lr, ppo_epochs=epochs))


pt.TuneConfig.plan = plan  # type: ignore[method-assign,assignment]
config = pt.TuneConfig(recipe="mnist1d-cnn-width", episodes=48, iterations=4, eval_seeds=8, proxy_epochs=proxy_epochs)
result = pt.tune_policy(EsperSettings(home=Path(home)), config)
print(pt.format_result(result))
Path(home + ".json").write_text(json.dumps(result.as_dict(), indent=1))
