"""End-of-run outputs: ``summary.json``, ``baseline.json`` and ``report.md`` in the run folder."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from esper_core.contracts import SeedStage, TelemetryPacket
from esper_core.kasmina.graft import GrowableModel
from esper_core.run.config import RunConfig
from esper_core.run.frontier import FRONTIERS, SHAPE_YARDSTICKS
from esper_core.run.ranks import launches
from esper_core.run.scores import bits, token_targets
from esper_core.run.session import Run
from esper_core.tamiyo.config import policy_record
from esper_core.telemetry import read_jsonl, write_baseline
from esper_core.tolaria.loop import count_parameters


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    """The headline numbers of a finished run."""

    run_id: str
    recipe: str
    epochs: int
    device: str
    val_accuracy: float
    test_accuracy: float
    test_loss: float
    val_loss: float
    host_params: int
    total_params: int
    seeds: dict[str, str]
    """Slot id -> final stage (and blueprint)."""
    commands: dict[str, int]
    """Action name -> how many times Tamiyo issued it."""
    field_reports: dict[str, int]
    run_dir: str
    checkpoints: dict[str, int]
    """What the run keeps on disk: ``files`` (committed checkpoints) and their ``bytes``."""
    tamiyo_decision_max_ms: float = 0.0
    """Worst Tamiyo decision latency of the run (timed-out ones included)."""
    tamiyo_timeouts: int = 0
    """Decisions that missed ``SafetyConfig.tamiyo_deadline_ms`` and became a WAIT."""
    processes: int = 1
    """Data-parallel processes of the run's last launch (``esper run --nproc``)."""
    batch_size: int = 0
    """The effective (global) batch: the recipe's, however many processes share it."""
    batch_per_process: tuple[int, ...] = ()
    """Each process's share of every global batch."""
    learning_rate: float = 0.0
    """The recipe's learning rate, which the global batch keeps (no rescaling for processes)."""
    yardstick: dict[str, Any] | None = None
    """The grown network beside the static network of its own shape, plain and tuned
    (``ShapeYardstick.compare``), for a recipe that has one and a run of its length."""
    frontier: dict[str, Any] | None = None
    """The grown network beside the committed uniformly scaled static frontier of its recipe
    (``StaticFrontier.compare``), for a recipe that has one and a run of its length: context."""
    deadline_overruns: int = 0
    """Tamiyo decisions and Kasmina commands past their deadline that were observed only."""
    reproducible: bool = True
    """Whether the run's numbers depend on its recipe and seed only. False when it acted on the
    wall clock (``load_dependence`` says how): the same seed may then give other numbers on a
    busier machine."""
    load_dependence: tuple[str, ...] = ()
    """The wall-clock inputs the run acted on (an opt-in setting each)."""
    step_path: str = ""
    """How the step engine ran the training step, and why (its ``tolaria.compile_*`` event);
    empty if it never decided (``compile="off"`` decides nothing)."""
    compile_trial_ms: float = 0.0
    """What compiling the step cost (the trial of ``compile="auto"``, or ``"on"``'s compile)."""
    compile_trial_share: float = 0.0
    """``compile_trial_ms`` as a share of the run's training time (``StepEngineConfig.compile_budget``
    bounds the trial's expected share before it starts)."""
    growth_blocked: int = 0
    """Growth commands rejected because the registry could not give a kernel."""
    token_targets: bool = False
    """Each sample's target is a sequence of token ids (a language model): the run is scored by
    its loss in bits per token, and its accuracies (0, meaningless) are not reported
    (``esper_core.run.scores``)."""
    degraded: tuple[str, ...] = ()
    """Why the run did less than it was asked to (growth the registry blocked, decisions that an
    enforced deadline turned into a WAIT); empty for a healthy run. The morphogenesis flow then
    ends in the state ``Degraded`` (a kind of Completed) with these as its message."""
    policy: dict[str, Any] | None = None
    """Who decided (``policy_record``): the configured policy and, for a shipped one, its name,
    pinned SHA-256 and the registry version it was served as."""
    policy_fallbacks: int = 0
    """Decisions the heuristic made because the shipped policy could not serve."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def finish_run(session: Run) -> RunSummary:
    """Evaluate on the test split and write the run's summary, baseline and report."""
    test = session.trainer.evaluate(session.trainer.data.test)
    last = session.history[-1]
    seeds = {s.slot_id: s.stage.value + (f" ({s.blueprint_id})" if s.blueprint_id else "") for s in last.seeds}
    # From the run's telemetry: its epochs may have run in other processes.
    path = Path(session.run_dir) / "telemetry.jsonl"
    telemetry = read_jsonl(path) if path.exists() else []
    decisions = _decision_latency(telemetry)
    blocked, first_blocked = _blocked(telemetry)
    fallbacks, first_fallback = _fallbacks(telemetry)
    summary = RunSummary(
        run_id=session.run_id,
        recipe=session.config.recipe,
        epochs=len(session.history),
        device=str(session.device),
        val_accuracy=last.val_accuracy,
        test_accuracy=test.accuracy,
        test_loss=test.loss,
        val_loss=last.val_loss,
        host_params=last.host_params,
        total_params=count_parameters(session.trainer.model),
        seeds=seeds,
        commands=dict(Counter(c.action for c in session.commands)),
        field_reports=dict(Counter(r.outcome.value for r in session.reports)),
        run_dir=str(session.run_dir),
        checkpoints={"files": len(session.checkpoints.tags()), "bytes": session.checkpoints.size_bytes()},
        **decisions,
        growth_blocked=blocked,
        degraded=degradation(
            growth_blocked=blocked,
            first_blocked=first_blocked,
            tamiyo_timeouts=decisions["tamiyo_timeouts"],
            policy_fallbacks=fallbacks,
            first_fallback=first_fallback,
        ),
        policy=policy_record(session.config.tamiyo, served=session.tamiyo.policy_version),
        policy_fallbacks=fallbacks,
        **_sharing(session),
        **_step_path(telemetry),
        reproducible=not load_dependence(session.config),
        load_dependence=load_dependence(session.config),
        yardstick=_yardstick(session, test.accuracy),
        frontier=_frontier(session, test.accuracy),
        token_targets=token_targets(session.trainer.data),
    )
    run_dir = Path(session.run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
    write_baseline(
        run_dir / "baseline.json",
        name=session.config.recipe,
        workload={
            "recipe": session.config.recipe,
            "epochs": len(session.history),
            "batch_size": session.config.data.batch_size,
            "train_samples": len(session.trainer.data.train),
            "host": list(session.trainer.model.layer_widths),
        },
        # A series with no sample is left out: a run whose every decision missed an enforced
        # deadline has no GNN latency to summarise, and is still a run with a baseline.
        latency_ms={
            name: series
            for name, series in (
                ("train_epoch", session.timings["train_ms"]),
                ("full_epoch", session.timings["epoch_ms"]),
                ("tamiyo_decide", session.timings["decide_ms"]),
                ("tamiyo_gnn", session.timings["gnn_ms"]),
            )
            if series
        },
        device=session.device,
        extra={"summary": summary.to_dict()},
    )
    (run_dir / "report.md").write_text(render_report(session, summary))
    return summary


def _yardstick(session: Run, test_accuracy: float) -> dict[str, Any] | None:
    yardstick = SHAPE_YARDSTICKS.get(session.config.recipe)
    model = session.trainer.model
    if yardstick is None or len(session.history) != yardstick.epochs or not isinstance(model, GrowableModel):
        return None
    return yardstick.compare(widths=model.grown_widths, test_accuracy=test_accuracy)


def _frontier(session: Run, test_accuracy: float) -> dict[str, Any] | None:
    frontier = FRONTIERS.get(session.config.recipe)
    if frontier is None or len(session.history) != frontier.epochs:
        return None
    return frontier.compare(params=count_parameters(session.trainer.model), test_accuracy=test_accuracy)


def _sharing(session: Run) -> dict[str, Any]:
    """How the last launch shared the run among processes (one process when never launched parallel)."""
    batch = session.config.data.batch_size
    last = (launches(Path(session.run_dir)) or [{"nproc": 1, "rank_batch": [batch]}])[-1]
    return {
        "processes": last["nproc"],
        "batch_size": batch,
        "batch_per_process": tuple(last["rank_batch"]),
        "learning_rate": session.config.trainer.lr,
    }


def load_dependence(config: RunConfig) -> tuple[str, ...]:
    """The settings of ``config`` that let the wall clock change the run's numbers (all off by default)."""
    acting = []
    if config.trainer.safety.enforce_deadlines:
        acting.append("trainer.safety.enforce_deadlines: Tamiyo's and Kasmina's deadlines")
    if config.tamiyo.risk.max_latency_ratio is not None:
        acting.append("tamiyo.risk.max_latency_ratio: the risk engine's epoch-latency veto")
    return tuple(acting)


def _decision_latency(packets: list[TelemetryPacket]) -> dict[str, Any]:
    """The worst decision latency, the timeout count and the observed deadline overruns."""
    metrics = [m for p in packets for m in p.metrics]
    latencies = [m.value for m in metrics if m.name == "tamiyo.decision.latency_ms"]
    timeouts = sum(m.value for m in metrics if m.name == "tolaria.timeout.tamiyo_total")
    overruns = sum(
        m.value
        for m in metrics
        if m.name in ("tolaria.deadline.tamiyo_overrun_total", "tolaria.deadline.kasmina_overrun_total")
    )
    return {
        "tamiyo_decision_max_ms": max(latencies, default=0.0),
        "tamiyo_timeouts": int(timeouts),
        "deadline_overruns": int(overruns),
    }


def _step_path(packets: list[TelemetryPacket]) -> dict[str, Any]:
    """The step engine's choice and what its compile cost, in all and as a share of training."""
    choice = [
        e
        for p in packets
        for e in p.events
        if e.name in ("tolaria.compile_enabled", "tolaria.compile_disabled", "tolaria.compile_fallback")
    ]
    if not choice:
        return {}
    trial_ms = float(choice[-1].attributes.get("warmup_ms", 0.0))
    training_ms = sum(m.value for p in packets for m in p.metrics if m.name == "tolaria.training.latency_ms")
    return {
        "step_path": choice[-1].message,
        "compile_trial_ms": trial_ms,
        "compile_trial_share": trial_ms / training_ms if training_ms > 0 else 0.0,
    }


def _blocked(packets: list[TelemetryPacket]) -> tuple[int, str | None]:
    """How many growth commands the registry blocked, and the first one's reason."""
    count = sum(m.value for p in packets for m in p.metrics if m.name == "kasmina.growth.blocked_total")
    rejected = (e for p in packets for e in p.events if e.name == "kasmina.command.rejected")
    return int(count), next((e.message for e in rejected if e.attributes.get("blocked")), None)


def _fallbacks(packets: list[TelemetryPacket]) -> tuple[int, str | None]:
    """How many decisions the heuristic made for a shipped policy that could not serve, and why."""
    events = [e for p in packets for e in p.events if e.name == "tamiyo.policy.fallback"]
    return len(events), events[0].message if events else None


def degradation(
    *,
    growth_blocked: int,
    first_blocked: str | None,
    tamiyo_timeouts: int,
    policy_fallbacks: int = 0,
    first_fallback: str | None = None,
) -> tuple[str, ...]:
    """Why a run is degraded, in words (``RunSummary.degraded``); empty when it is not."""
    reasons = []
    if policy_fallbacks:
        reasons.append(f"{policy_fallbacks} decision(s) made by the heuristic because {first_fallback}")
    if growth_blocked:
        reasons.append(
            f"{growth_blocked} growth command(s) rejected because the registry could not give a kernel "
            f"(first: {first_blocked}); check it with `esper registry verify`"
        )
    if tamiyo_timeouts:
        reasons.append(f"{tamiyo_timeouts} decision(s) past Tamiyo's enforced deadline became a WAIT")
    return tuple(reasons)


def _shape(widths: dict[str, int]) -> str:
    return ", ".join(f"{layer} {units}" for layer, units in widths.items())


def yardstick_lines(y: dict[str, Any]) -> list[str]:
    """What growth bought, in words: the grown network against the static network of its shape."""
    if not y["same_shape"]:
        return [
            f"- grew to {_shape(y['grown_widths'])}, not the shape measured ({_shape(y['widths'])}): "
            "no shape-matched yardstick for this run",
            f"- (measured by `python -m bench.main_job`: `{y['source']}`)",
        ]
    return [
        f"- grown: {y['grown_test_accuracy']:.2f} % test accuracy, shape {_shape(y['widths'])}",
        f"- the static network of that shape trained from scratch reaches {y['static_test_accuracy']:.2f} %, "
        f"{y['tuned_test_accuracy']:.2f} % with its weight decay tuned on validation (means of {y['seeds']} seeds; "
        f"one grown run's spread is about {y['grown_test_accuracy_sd']:.1f} points)",
        f"- over those seeds, paired: grown minus static {y['grown_minus_static']} points, "
        f"minus tuned {y['grown_minus_tuned']} (95 % intervals)",
        f"- (measured by `python -m bench.main_job`: `{y['source']}`)",
    ]


def frontier_lines(f: dict[str, Any]) -> list[str]:
    """The uniformly scaled static frontier at the grown network's size, as context: not its shape,
    not tuned (``yardstick_lines`` is the comparison that says what growth bought)."""
    spread = f"mean of {f['seeds']} seeds; one run's spread is about {f['start_test_accuracy_sd']:.1f} points"
    if f["static_same_params"] is None:
        same = f"beyond the committed frontier (widest static host: {f['widest_params']} parameters)"
    else:
        same = (
            f"the host scaled uniformly to the same size reaches {f['static_same_params']:.2f} % "
            f"({spread}): {f['grown_minus_static']:+.2f} points"
        )
    return [
        f"- context, not the grown shape: {f['grown_params']} parameters grown; {same}",
        f"- its starting size, {f['start_params']} parameters, reaches {f['start_test_accuracy']:.2f} % static",
        f"- (frontier: `{f['source']}`)",
    ]


def _policy_lines(summary: RunSummary) -> list[str]:
    p = summary.policy
    if p is None:
        return []
    if p["policy"] == "shipped":
        served = f"served as `{p['served']}`" if p["served"] else "not served (the heuristic decided)"
        return [f"Decided by the shipped policy `{p['name']}` (SHA-256 `{p['sha256']}`), {served}.", ""]
    return [f"Decided by `{p['policy']}`" + (f" (`{p['served']}`)" if p.get("served") else "") + ".", ""]


def _degraded_lines(summary: RunSummary) -> list[str]:
    if not summary.degraded:
        return []
    return ["**Degraded:** " + "; ".join(summary.degraded) + ".", ""]


def _reproducibility_lines(summary: RunSummary) -> list[str]:
    if not summary.reproducible:
        return [
            "**Not reproducible:** the run acted on the wall clock ("
            + "; ".join(summary.load_dependence)
            + "), so the same seed may give other numbers on a busier machine.",
            "",
        ]
    if summary.deadline_overruns:
        return [
            f"{summary.deadline_overruns} deadline overrun(s) observed and not acted on: the numbers depend on "
            "the recipe and seed only.",
            "",
        ]
    return []


def _step_lines(summary: RunSummary) -> list[str]:
    if not summary.step_path:
        return []
    cost = ""
    if summary.compile_trial_ms:
        cost = (
            f"; compiling it cost {summary.compile_trial_ms / 1e3:.1f} s, {summary.compile_trial_share:.1%} of training"
        )
    return [f"Training step: {summary.step_path}{cost}.", ""]


def render_report(session: Run, summary: RunSummary) -> str:
    """Markdown report: headline, per-epoch table, commands and seeds."""
    tokens = summary.token_targets
    score = (
        f"Test loss **{bits(summary.test_loss):.4f} bits per token** ({summary.test_loss:.4f} nats)"
        if tokens
        else f"Test accuracy **{summary.test_accuracy:.4f}** (loss {summary.test_loss:.4f})"
    )
    lines = [
        f"# Run {summary.run_id} ({summary.recipe})",
        "",
        f"{score} after {summary.epochs} epochs on {summary.device}; parameters {summary.host_params} host, "
        f"{summary.total_params} total.",
        "",
        f"Trained by {summary.processes} process{'es' if summary.processes > 1 else ''}: global batch "
        f"{summary.batch_size} ({' + '.join(map(str, summary.batch_per_process))} per process), learning rate "
        f"{summary.learning_rate:g}.",
        "",
        *_degraded_lines(summary),
        *_reproducibility_lines(summary),
        *_step_lines(summary),
        *_policy_lines(summary),
        f"| epoch | train loss | val loss | {'val bits/token' if tokens else 'val acc'} | train ms | seeds |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for p in session.history:
        active = ", ".join(f"{s.slot_id}:{s.stage.value}" for s in p.seeds if s.stage is not SeedStage.DORMANT)
        lines.append(
            f"| {p.epoch} | {p.train_loss:.4f} | {p.val_loss:.4f} | "
            f"{bits(p.val_loss) if tokens else p.val_accuracy:.4f} | {p.epoch_latency_ms:.1f} | {active or '-'} |"
        )
    lines += [
        "",
        "## Commands",
        "",
        "| epoch | action | slot | blueprint | by | reason |",
        "|---:|---|---|---|---|---|",
    ]
    for c in session.commands:
        if c.action == "wait":
            continue
        lines.append(
            f"| {c.epoch} | {c.action} | {c.slot_id or '-'} | {c.blueprint_id or '-'} | {c.issued_by} | {c.reason} |"
        )
    lines += ["", "## Seeds", ""] + [f"- {slot}: {stage}" for slot, stage in summary.seeds.items()]
    if summary.yardstick is not None:
        lines += ["", "## Against the static network of its shape", "", *yardstick_lines(summary.yardstick)]
    if summary.frontier is not None:
        lines += [
            "",
            "## Against the uniformly scaled static frontier (context)",
            "",
            *frontier_lines(summary.frontier),
        ]
    return "\n".join(lines) + "\n"
