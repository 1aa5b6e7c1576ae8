import json, sys, dataclasses
from pathlib import Path
from esper_core.settings import EsperSettings
from esper_core.simic.learn import SimicConfig
import esper_core.studies.policy_tune as pt
lr, epochs = float(sys.argv[1]), int(sys.argv[2])
orig = pt.TuneConfig.plan
def plan(self, gnn):
    p = orig(self, gnn)
    return dataclasses.replace(p, simic=SimicConfig(flops_penalty=self.flops_penalty, ppo_lr=lr, ppo_epochs=epochs))
pt.TuneConfig.plan = plan
s = EsperSettings(home=Path(sys.argv[3]))
c = pt.TuneConfig(recipe="mnist1d-cnn-width", episodes=48, iterations=4, eval_seeds=8, proxy_epochs=int(sys.argv[4]))
r = pt.tune_policy(s, c)
print(pt.format_result(r)); json.dump(r.as_dict(), open(sys.argv[3] + ".json", "w"), indent=1)
