"""Golden runs: the per-epoch record of a few recipes, to show a refactor changed no number.

A restructuring must leave every run's numbers as they were (CONTRIBUTING: identical losses under a
fixed seed). ``record`` trains each case to its end in one process, one thread, with the step and
the policy eager (``episode_config``), and keeps per epoch: the validation and training loss (as
``repr``, every digit), Tamiyo's command, its outcome and every slot's seed state; at the end the
test loss and a SHA-256 of the weights. ``compare`` lists where two records differ. Record at the
commit before a change and at the commit after, on the same machine, then compare.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from esper_core._capabilities import one_thread
from esper_core.run.commits import epoch_tag
from esper_core.run.kernels import publish_missing_kernels
from esper_core.run.session import Run
from esper_core.settings import EsperSettings
from esper_core.studies.episodes import episode_config


@dataclass(frozen=True, kw_only=True, slots=True)
class GoldenCase:
    """One run of the golden set: a recipe, the policy deciding, its seed and epochs."""

    recipe: str
    policy: str
    seed: int
    epochs: int

    @property
    def name(self) -> str:
        """The case's key in a record."""
        return f"{self.recipe}-{self.policy}-s{self.seed}"


DEFAULT_CASES: tuple[GoldenCase, ...] = (
    GoldenCase(recipe="mnist1d-cnn-width", policy="heuristic", seed=1, epochs=12),
    GoldenCase(recipe="mnist1d-mlp-width", policy="heuristic", seed=2, epochs=12),
    GoldenCase(recipe="mnist1d-mlp-width", policy="periodic", seed=3, epochs=12),
    GoldenCase(recipe="digits-mlp", policy="heuristic", seed=0, epochs=14),
    GoldenCase(recipe="seed-reference", policy="heuristic", seed=0, epochs=8),
    GoldenCase(recipe="digits-cnn", policy="periodic", seed=1, epochs=8),
)
"""Branch seeds (germinated, fossilised, culled) and width seeds (germinated, merged), under a
rule and a periodic policy: every seed kind's path through the lifecycle, in about two minutes."""


def record(cases: Sequence[GoldenCase], settings: EsperSettings) -> dict[str, Any]:
    """Train every case and keep what it did, epoch by epoch (see the module's docstring).

    Args:
        cases: The runs.
        settings: Where the registry (kernels are compiled and published first) and runs live.
    """
    configs = [episode_config(c.recipe, seed=c.seed, policy=c.policy, epochs=c.epochs) for c in cases]
    publish_missing_kernels(settings, configs, device="cpu")
    out: dict[str, Any] = {}
    with one_thread():
        for case, config in zip(cases, configs, strict=True):
            (settings.runs_dir / case.name).mkdir(parents=True, exist_ok=True)
            session = Run.start(config, settings=settings, run_id=case.name)
            try:
                epochs = []
                for epoch in range(config.epochs):
                    session.train_epoch()
                    session.commit(epoch_tag(epoch, "trained"))
                    packet = session.history[-1]
                    command = session.decide()
                    outcome = session.apply(command)
                    session.commit(epoch_tag(epoch, "applied"))
                    seeds = [
                        (s.slot_id, s.stage.value, s.blueprint_id, s.param_count)
                        for s in session.manager.export_seed_states()
                    ]
                    epochs.append(
                        {
                            "val_loss": repr(packet.val_loss),
                            "train_loss": repr(packet.train_loss),
                            "command": [command.action, command.slot_id, command.blueprint_id],
                            "outcome": outcome,
                            "seeds": [list(s) for s in seeds],
                        }
                    )
                test = session.trainer.evaluate(session.trainer.data.test)
                out[case.name] = {"epochs": epochs, "test_loss": repr(test.loss), "weights": _digest(session)}
            finally:
                session.close()
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Where two records differ, one line each (empty: identical)."""
    lines = [f"{name}: only in the first record" for name in before if name not in after]
    lines += [f"{name}: only in the second record" for name in after if name not in before]
    for name in (n for n in before if n in after):
        a, b = before[name], after[name]
        for i, (x, y) in enumerate(zip(a["epochs"], b["epochs"], strict=False)):
            lines += [f"{name} epoch {i} {key}: {x[key]} != {y[key]}" for key in x if x[key] != y.get(key)]
        if len(a["epochs"]) != len(b["epochs"]):
            lines.append(f"{name}: {len(a['epochs'])} epochs != {len(b['epochs'])}")
        lines += [f"{name} {key}: {a[key]} != {b[key]}" for key in ("test_loss", "weights") if a[key] != b[key]]
    return lines


def _digest(session: Run) -> str:
    state = session.trainer.model.state_dict()
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
