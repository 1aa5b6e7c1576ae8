"""Simic over the zoo: seed sets, family exclusion, the FLOPs term, and one tiny real training."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from esper_core._capabilities import resolve_device
from esper_core.contracts import SeedStage
from esper_core.contracts.enums import SlotKind
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.pipeline import find_published
from esper_core.run import kernels as run_kernels
from esper_core.run.plan import plan_compile_jobs
from esper_core.settings import EsperSettings
from esper_core.simic.dataset import build_samples, network_flops, run_rewards
from esper_core.simic.learn import SimicConfig
from esper_core.simic.record_types import BITS_WORTH
from esper_core.simic.records import DecisionRecord, SimicStore
from esper_core.studies.episodes import EpisodeResult
from esper_core.studies.policy_files import publish_policy_file, save_policy_version
from esper_core.studies.simic_train import TrainingPlan
from esper_core.studies.yardstick import GOAL_BITS, GOAL_POINTS
from esper_core.studies.zoo_train import (
    ZooSeeds,
    ZooTraining,
    ZooTrainingResult,
    episode_quality,
    publish_zoo_kernels,
    score_episodes,
    selection_score,
    train_zoo_policy,
    zoo_members,
)
from esper_core.tamiyo.config import PolicyCompileConfig, TamiyoConfig
from esper_core.tamiyo.model import TamiyoGNNConfig
from esper_core.tamiyo.service import TamiyoService
from esper_core.tamiyo.synthetic import synthetic_candidates, synthetic_history
from esper_core.urza.service import Urza
from esper_core.zoo import ZooSpec, draw_member

SMALL = TamiyoGNNConfig(hidden_dim=16, num_layers=2)


def tiny_plan(*, ppo_lr: float | None = 3e-2) -> TrainingPlan:
    """One demonstration and one PPO iteration of one rollout per member, a small GNN, the FLOPs
    term on; ``ppo_lr`` None: Simic's own rate."""
    rate = {} if ppo_lr is None else {"ppo_lr": ppo_lr}
    simic = SimicConfig(flops_penalty=0.01, imitation_epochs=2, ppo_epochs=2, batch_size=8, **rate)
    return TrainingPlan(demonstrations=1, iterations=1, rollouts=1, gnn=SMALL, simic=simic)


def test_overlapping_seed_sets_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"selection and evaluation seeds overlap on \[7\].*move those seeds"):
        ZooSeeds(train=(1000,), selection=(7, 20), evaluation=tuple(range(10)))
    with pytest.raises(ValueError, match="train and selection seeds overlap on"):
        ZooSeeds(train=(1, 2), selection=(2,), evaluation=())
    with pytest.raises(ValueError, match="repeat a seed"):
        ZooSeeds(train=(1, 1), selection=(2,), evaluation=())


def test_an_excluded_family_is_never_drawn() -> None:
    config = ZooTraining(members=40, exclude_families=("mlp", "decoder"))
    members = zoo_members(config)
    assert len(members) == 40 and not {"mlp", "decoder"} & {m.family for m in members}
    # The other five families share the members evenly.
    assert {m.family for m in members} == {"cnn1d", "cnn2d", "resnet", "encoder", "gru"}
    with pytest.raises(ValueError, match="leaves no family"):
        ZooTraining(zoo=ZooSpec(families=("mlp",)), exclude_families=("mlp",))
    with pytest.raises(ValueError, match="unknown families"):
        ZooTraining(exclude_families=("lstm",))  # type: ignore[arg-type]


def test_a_plan_the_zoo_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 8 training seeds"):
        ZooTraining(seeds=ZooSeeds(train=(1000, 1001)))
    with pytest.raises(ValueError, match="flops_penalty must be >= 0"):
        SimicConfig(flops_penalty=-0.01)
    with pytest.raises(ValueError, match="cannot charge FLOPs"):
        TrainingPlan(reward="counterfactual", simic=SimicConfig(flops_penalty=0.01))


def _run_records(epochs: int = 5) -> list[DecisionRecord]:
    torch.manual_seed(0)
    service = TamiyoService(TamiyoConfig(policy="heuristic", gnn=SMALL, compile=PolicyCompileConfig(enabled=False)))
    candidates = synthetic_candidates(3)
    records = []
    for epoch in range(1, epochs):
        history = synthetic_history(num_epochs=epoch + 1, num_slots=1, run_id="run0")  # slot 0: dormant
        decision = service.decide(history, candidates, run_id="run0", total_epochs=epochs)
        records.append(DecisionRecord.from_decision(decision, history, candidates, total_epochs=epochs))
    service.close()
    return records


def _scaled(record: DecisionRecord, factor: int) -> DecisionRecord:
    """``record`` with every layer's FLOPs per sample times ``factor`` (a network grown in place)."""
    *past, current = record.state.history
    layers = tuple(
        layer.model_copy(update={"flops_per_sample": (layer.flops_per_sample or 0) * factor})
        for layer in current.layers
    )
    state = dataclasses.replace(record.state, history=(*past, current.model_copy(update={"layers": layers})))
    return dataclasses.replace(record, state=state)


def test_the_flops_term_charges_a_decision_for_the_compute_it_commits_the_run_to() -> None:
    records = _run_records()
    # The network's FLOPs double after the first decision and stay doubled.
    grown = [records[0], *(_scaled(r, 2) for r in records[1:])]
    free = run_rewards(grown, param_penalty=0.01)
    charged = run_rewards(grown, param_penalty=0.01, flops_penalty=0.01)
    first = records[0]
    epochs, t = first.state.total_epochs, first.command.epoch
    assert epochs is not None
    # The decision pays one accuracy point per doubling of the run's training FLOPs, for the
    # share of the run still to train: (F1 - F0) * (E - 1 - t) / (E * F0), F1 = 2 F0.
    assert charged[0] - free[0] == pytest.approx(-0.01 * (epochs - 1 - t) / epochs)
    assert charged[1:] == pytest.approx(free[1:])
    # A network that shrinks back earns the same rate back.
    shrunk = [_scaled(records[0], 2), *records[1:]]
    assert run_rewards(shrunk, param_penalty=0.01, flops_penalty=0.01)[0] > run_rewards(shrunk, param_penalty=0.01)[0]
    # Forks do not measure FLOPs: a counterfactual reward refuses the term.
    with pytest.raises(ValueError, match="no FLOPs term"):
        build_samples(grown, [], param_penalty=0.01, flops_penalty=0.01, reward="counterfactual")


def test_network_flops_count_seeds_that_run_beside_their_layer() -> None:
    packet = synthetic_history(num_epochs=1, num_slots=1)[0]
    host = sum(layer.flops_per_sample or 0 for layer in packet.layers)
    training = packet.seeds[0].model_copy(
        update={"stage": SeedStage.TRAINING, "blueprint_id": "bp", "param_count": 100, "kind": SlotKind.WIDTH}
    )
    assert network_flops(packet.model_copy(update={"seeds": (training,)})) == pytest.approx(host + 2 * 100)
    # A fossilised width seed is merged into its layer, which already counts it.
    merged = training.model_copy(update={"stage": SeedStage.FOSSILIZED})
    assert network_flops(packet.model_copy(update={"seeds": (merged,)})) == host
    unmeasured = packet.layers[0].model_copy(update={"flops_per_sample": None})
    assert network_flops(packet.model_copy(update={"layers": (unmeasured, *packet.layers[1:])})) is None


def test_selection_scores_charge_training_flops_over_the_static_run() -> None:
    def result(val: float, flops: int) -> EpisodeResult:
        return EpisodeResult(
            run_id="r", recipe="m", policy="gnn", seed=2000, test_accuracy=val, val_accuracy=val,
            host_params=1, total_params=1, forward_flops=1, train_flops=flops, wall_s=0.0, commands={},
            policy_version=None,
        )  # fmt: skip

    static = result(0.80, 1000)
    assert selection_score(result(0.80, 1000), static, flops_penalty=0.01, language_model=False) == pytest.approx(0.80)
    # Twice the static run's compute costs one point.
    assert selection_score(result(0.80, 2000), static, flops_penalty=0.01, language_model=False) == pytest.approx(0.79)
    # A halted episode is scored at its last commit (its values here) and counted.
    member = draw_member(ZooSpec(), 0)
    halted = dataclasses.replace(result(0.40, 500), recipe=member.name, halted="diverged")
    fine = dataclasses.replace(result(0.80, 1000), recipe=member.name, seed=2001)
    statics = {(member.name, 2000): dataclasses.replace(static, recipe=member.name), (member.name, 2001): fine}
    score = score_episodes("v1", [halted, fine], statics, 0.01, {member.name: member})
    assert score.halted == 1 and score.val_accuracy == pytest.approx(0.60)


def test_a_language_model_is_selected_on_its_validation_bits_and_a_classifier_on_its_accuracy() -> None:
    def result(recipe: str, *, accuracy: float, bits: float, flops: int) -> EpisodeResult:
        return EpisodeResult(
            run_id="r", recipe=recipe, policy="gnn", seed=2000, test_accuracy=accuracy, val_accuracy=accuracy,
            val_loss=bits * math.log(2), host_params=1, total_params=1, forward_flops=1, train_flops=flops,
            wall_s=0.0, commands={}, policy_version=None,
        )  # fmt: skip

    members = [draw_member(ZooSpec(), i) for i in range(60)]
    decoder = next(m for m in members if m.family == "decoder")
    mlp = next(m for m in members if m.family == "mlp")
    assert decoder.language_model and not mlp.language_model
    static = result(decoder.name, accuracy=0.0, bits=2.0, flops=1000)
    # 0.1 bit lower is worth 5 accuracy points (0.5 per bit); doubling the compute costs one.
    assert selection_score(static, static, flops_penalty=0.01, language_model=True) == pytest.approx(-1.0)
    better = result(decoder.name, accuracy=0.0, bits=1.9, flops=2000)
    assert selection_score(better, static, flops_penalty=0.01, language_model=True) == pytest.approx(-0.95 - 0.01)
    # A classifier's loss is not read; each member is scored by its own kind.
    clf_static = result(mlp.name, accuracy=0.8, bits=9.0, flops=1000)
    clf = result(mlp.name, accuracy=0.8, bits=0.1, flops=1000)
    by_name = {decoder.name: decoder, mlp.name: mlp}
    score = score_episodes("v1", [better, clf], {(r.recipe, r.seed): r for r in (static, clf_static)}, 0.01, by_name)
    assert score.by_family == pytest.approx({"decoder": -0.96, "mlp": 0.8})
    assert episode_quality(clf, language_model=False) == 0.8
    # The exchange rate is the transfer goal's: half a point (GOAL_POINTS) per 0.01 bit (GOAL_BITS).
    assert pytest.approx(GOAL_POINTS / 100 / GOAL_BITS) == BITS_WORTH


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[ZooTrainingResult, EsperSettings, ZooTraining]:
    home = tmp_path_factory.mktemp("zoo-simic")
    settings = EsperSettings(home=Path(home))
    # Two families, one member each, four epochs: a few seconds on one thread.
    config = ZooTraining(
        zoo=ZooSpec(seed=0, families=("mlp", "cnn1d"), epochs=(4,), train_samples=(1000,), widths=(8,)),
        members=2,
        seeds=ZooSeeds(train=(1000, 1001), selection=(2000,), evaluation=(0, 1, 2)),
        plan=tiny_plan(),
    )
    return train_zoo_policy(settings, config), settings, config


def test_zoo_episodes_of_two_families_become_samples_simic_trains_on(
    trained: tuple[ZooTrainingResult, EsperSettings, ZooTraining],
) -> None:
    result, settings, config = trained
    assert set(result.members.values()) == {"mlp", "cnn1d"}
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        ids = [r.run_id for r in result.episodes["demonstrations"]]
        samples, _ = build_samples(store.decisions(ids), store.field_reports(ids), param_penalty=0.01)
        assert {s.run_id for s in samples} == set(ids)  # every member's episode became samples
        first, second = (store.load_weights(store.get_policy(v)) for v in result.versions)
        provenance = store.get_policy(result.versions[-1]).provenance
    finally:
        store.close()
    # One PPO iteration on the zoo's rollouts moved the imitation policy.
    assert len(result.versions) == 2 and any(not torch.equal(first[k], second[k]) for k in first)
    assert result.chosen in result.versions
    # A version says which members and seed sets it was trained and chosen on.
    assert provenance["members"] == result.members and provenance["seeds"]["evaluation"] == [0, 1, 2]


def test_a_zoo_training_never_runs_an_evaluation_seed(
    trained: tuple[ZooTrainingResult, EsperSettings, ZooTraining],
) -> None:
    result, _, config = trained
    ran = {r.seed for episodes in result.episodes.values() for r in episodes}
    assert ran == set(config.seeds.train) | set(config.seeds.selection)
    assert not ran & set(config.seeds.evaluation)
    selection = {r.seed for phase in ("yardsticks", "scoring") for r in result.episodes[phase]}
    assert selection == set(config.seeds.selection)
    # Every version and both yardsticks were scored on the selection seeds.
    assert [s.label for s in result.scores] == ["none", "heuristic", *(f"v{v}" for v in result.versions)]


def test_a_zoo_with_branch_slots_publishes_their_kernels_once_and_grows_on_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = EsperSettings(home=tmp_path)
    # The smallest zoo: one MLP member whose only growth sites are branch slots, so every
    # germination is a blueprint seed and needs a kernel of the member's slot shape.
    config = ZooTraining(
        zoo=ZooSpec(seed=0, families=("mlp",), depths=(1,), epochs=(4,), widths=(8,), kinds=("branch",)),
        members=1,
        seeds=ZooSeeds(train=(1000, 1001), selection=(2000,), evaluation=(0,)),
        plan=tiny_plan(ppo_lr=None),
    )
    (member,) = zoo_members(config)
    recipe = member.recipe()
    jobs = plan_compile_jobs(
        recipe, feature_shape=load_dataset(recipe.data).feature_shape, catalog=default_catalog(), approved=()
    )
    assert jobs and member.widen == () and member.slots == ("act1",)
    result = train_zoo_policy(settings, config)
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        published = {job.blueprint_id: find_published(urza, job, resolve_device("cpu")) for job in jobs}
        assert all(k is not None for k in published.values()), published
    finally:
        urza.close()

    # A second zoo over the same members compiles nothing: the kernels are found.
    def no_compile(*args: object, **kwargs: object) -> None:
        raise AssertionError("a published kernel was compiled again")

    monkeypatch.setattr(run_kernels, "compile_job", no_compile)
    publish_zoo_kernels(settings, [member], device="cpu")
    # The heuristic's demonstration germinated on the branch slot (there is nothing else to grow).
    (demo,) = result.episodes["demonstrations"]
    assert demo.commands.get("germinate", 0) >= 1, demo.commands


def test_the_chosen_version_travels_as_two_files_and_a_changed_byte_is_refused(
    trained: tuple[ZooTrainingResult, EsperSettings, ZooTraining], tmp_path: Path
) -> None:
    result, settings, _ = trained
    saved = save_policy_version(settings, result.chosen, tmp_path / "policy", extra={"note": "test"})
    assert saved["source_version"] == result.chosen and saved["note"] == "test"
    elsewhere = EsperSettings(home=tmp_path / "elsewhere")
    version = publish_policy_file(elsewhere, tmp_path / "policy")
    stores = [SimicStore.open(s.home, s.registry_db_url) for s in (settings, elsewhere)]
    try:
        original, copied = (
            store.load_weights(store.get_policy(v)) for store, v in zip(stores, (result.chosen, version), strict=True)
        )
        stores[1].get_policy(version).require_current_inputs()
    finally:
        for store in stores:
            store.close()
    assert original.keys() == copied.keys() and all(torch.equal(original[k], copied[k]) for k in original)
    weights = tmp_path / "policy" / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="changed after they were saved"):
        publish_policy_file(elsewhere, tmp_path / "policy")


def test_a_zoo_of_stacks_and_streams_teaches_the_policy_to_deepen_and_double(tmp_path: Path) -> None:
    # Issue 36 item 6: depth and stream seeds are actions like any other. A zoo offering them
    # (a resnet's stack, a GPT's stack and stream) runs episodes that germinate them, Simic learns
    # from those decisions, and every state Tamiyo saw let her choose either kind.
    settings = EsperSettings(home=tmp_path)
    config = ZooTraining(
        zoo=ZooSpec(
            seed=0,
            families=("resnet", "decoder"),
            depths=(1,),
            epochs=(4,),
            widths=(8,),
            train_samples=(1000,),
            kinds=("stream", "depth"),
        ),
        members=2,
        seeds=ZooSeeds(train=(1000, 1001), selection=(2000,), evaluation=(0,)),
        plan=tiny_plan(),
    )
    members = {m.family: m for m in zoo_members(config)}
    assert members["resnet"].deepen == members["decoder"].deepen == ("blocks",)
    assert members["decoder"].widen_stream and not members["resnet"].widen_stream
    result = train_zoo_policy(settings, config)
    store = SimicStore.open(settings.home, settings.registry_db_url)
    try:
        ids = [r.run_id for phase in ("demonstrations", "rollouts") for r in result.episodes[phase]]
        decisions = store.decisions(ids)
        samples, _ = build_samples(decisions, store.field_reports(ids), param_penalty=0.01)
    finally:
        store.close()
    assert {s.run_id for s in samples} == set(ids)
    kinds_offered: set[SlotKind] = set()
    germinated: dict[str, set[str]] = {"heuristic": set(), "gnn": set()}
    for record in decisions:
        kinds_offered |= {s.kind for s in record.state.history[-1].seeds}
        if record.command.blueprint_id is not None:
            germinated[record.policy].add(record.command.blueprint_id)
    # The depth slots are depth slots to the policy; the stream slot reads as a width slot.
    assert kinds_offered == {SlotKind.DEPTH, SlotKind.WIDTH}
    # The heuristic's demonstrations doubled the GPT's stream and deepened the resnet's stack;
    # the learned policy's rollouts grew by those actions too.
    assert germinated["heuristic"] == {"depth-stack", "stream-2x"}, germinated
    assert germinated["gnn"] and germinated["gnn"] <= {"depth-stack", "depth-stack-all", "depth-fresh", "stream-2x"}
    assert len(result.versions) == 2 and result.chosen in result.versions
