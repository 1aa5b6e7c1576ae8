"""The training benchmark's bare twin computes what the host computes (numbers are not asserted:
timings belong to the benchmark run, not to tests)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from esper_core.benchmarks.common import BareLoop, BenchConfig, bare_twin, germinate_one, unmerged_twin
from esper_core.benchmarks.training import _timed_epochs, _trainer, run, score_line
from esper_core.contracts import SeedStage
from esper_core.kasmina.width import WidthSeed
from tests.helpers.runif import requires_cuda


def test_bare_twin_matches_the_host_and_trains_the_same_without_seeds() -> None:
    result = run("digits-mlp", BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0))
    assert result["metric"] == "accuracy" and score_line(result).startswith("test accuracy esper eager 0.")
    assert result["accuracy_esper"] == result["accuracy_bare"]
    # PyTorch's default optimizer computes the same update in another order: close, not equal.
    assert result["accuracy_bare_default"] == pytest.approx(result["accuracy_bare"], abs=0.02)
    assert {"esper_p95_ms", "bare_p95_ms", "ratio_p95", "ratio_default_optimizer_p50", "chosen_path"} <= result.keys()
    assert result["fallbacks"] == []


def test_cuda_graphs_asked_for_on_cpu_are_skipped_and_every_path_stays_fp32() -> None:
    result = run("digits-mlp", BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0, cuda_graphs=True))
    assert result["chosen_path"] == "eager" and result["precision"] == "fp32 (amp off on cpu)"
    assert result["fallbacks"] == [
        "tolaria.graph_fallback: CUDA graphs need a CUDA device; training on cpu runs the eager step"
    ]
    assert result["accuracy_chosen"] == result["accuracy_esper"] == result["accuracy_bare"]


def test_bench_options_are_checked_before_any_work() -> None:
    with pytest.raises(ValueError, match=r"amp \(--amp\) must be one of"):
        BenchConfig(amp="fp8")


@requires_cuda("the training step captured as a CUDA graph, against eager and bare bf16 loops")
def test_a_graphed_step_trains_as_the_eager_one_on_cuda() -> None:
    """The first GPU run found replays after an eager step (each epoch's short last batch)
    training nothing: the optimizer read gradients the graph no longer wrote."""
    result = run(
        "digits-mlp", BenchConfig(epochs=6, warmup_batches=0, compile="off", seeds=0, device="cuda", cuda_graphs=True)
    )
    assert result["chosen_path"] == "eager + CUDA graph" and result["precision"] == "bf16 autocast"
    assert result["fallbacks"] == []
    # Six timed epochs after the warm-up: a path that stopped learning after one sits lower.
    assert result["accuracy_chosen"] == pytest.approx(result["accuracy_esper"], abs=0.02)
    assert result["accuracy_bare"] == pytest.approx(result["accuracy_esper"], abs=0.02)


def test_bare_twin_carries_an_active_seed_as_a_residual_block() -> None:
    trainer, run_config = _trainer("seed-reference", BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer, run_config)
    slot = trainer.manager.slots[slot_id]
    with torch.no_grad():
        for p in slot.seed.parameters():  # type: ignore[union-attr]
            p.normal_()  # a fresh seed is neutral; make it matter
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY  # blended in at alpha 1, as the twin's block is
    twin = bare_twin(trainer)
    x = trainer.data.val.x[:8]
    with torch.inference_mode():
        assert torch.allclose(twin(x), trainer.model(x), atol=1e-6)


USER_RECIPE = "tests.helpers.user_model:recipe"


def test_a_users_recipe_benches_against_its_own_model_rebuilt_bare() -> None:
    # Streamed data (a map-style Dataset), a nested slot, SGD: the bare loop reads the same
    # batches through a DataLoader and trains to the same weights.
    result = run(USER_RECIPE, BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0))
    assert result["accuracy_esper"] == result["accuracy_bare"]
    assert result["epoch_ratio_p50"] > 0 and len(result["samples_ms"]["epoch_bare"]) == 5


def test_bare_twin_of_a_users_model_carries_the_seed_after_its_module() -> None:
    trainer, run_config = _trainer(USER_RECIPE, BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer, run_config)
    slot = trainer.manager.slots[slot_id]
    with torch.no_grad():
        for p in slot.seed.parameters():  # type: ignore[union-attr]
            p.normal_()
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY
    twin = bare_twin(trainer, run_config.host)  # type: ignore[arg-type]
    x = torch.randn(8, 12)
    with torch.inference_mode():
        assert torch.allclose(twin(x), trainer.model(x), atol=1e-6)


def test_bare_loop_follows_the_recipes_optimizer_and_schedule() -> None:
    trainer, run_config = _trainer("mnist1d-mlp", BenchConfig(epochs=5, seeds=0), compile="off")
    bare = BareLoop(bare_twin(trainer, run_config.host), trainer)  # type: ignore[arg-type]
    assert isinstance(bare.opt, torch.optim.Adam)
    # The yardstick's update is Tolaria's own implementation; the default twin's is PyTorch's default.
    assert bare.opt.defaults["fused"] is trainer.optimizer.defaults["fused"] is True
    default = BareLoop(bare_twin(trainer, run_config.host), trainer, fused=None)  # type: ignore[arg-type]
    assert default.opt.defaults["fused"] is None
    for _ in range(3):  # cosine: the rate falls each epoch, in step with Tolaria's
        trainer._schedule_lr()
        assert bare.opt.param_groups[0]["lr"] == pytest.approx(trainer.optimizer.param_groups[0]["lr"], rel=1e-12)
        trainer.epoch += 1
        bare.opt.step()  # no gradients: changes nothing, but orders the scheduler after it
        bare.schedule.step()
    assert bare.opt.param_groups[0]["lr"] < trainer.config.lr
    with pytest.raises(ValueError, match="ModelSpec"):
        bare_twin(trainer)


WIDTH_RECIPE = "tests.helpers.user_models:mlp_widen_long"


def test_a_width_grown_host_benches_a_width_seed_against_the_wider_static_network() -> None:
    trainer, run_config = _trainer(WIDTH_RECIPE, BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer, run_config)
    slot = trainer.manager.slots[slot_id]
    assert slot_id == "fc2+width" and isinstance(slot.seed, WidthSeed)
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY  # the new units in at alpha 1, as the twin's merged layer has them
    twin = bare_twin(trainer, run_config.host)  # type: ignore[arg-type]
    widened = twin.get_submodule("fc2")
    assert widened.out_features == slot.site.width + slot.seed.units  # doubled: BENCH_WIDTH
    x = trainer.data.val.x[:8]
    with torch.inference_mode():
        assert torch.allclose(twin(x), trainer.model(x), atol=1e-5)


def test_the_unmerged_twin_computes_what_esper_computes_while_a_width_seed_trains() -> None:
    trainer, run_config = _trainer(WIDTH_RECIPE, BenchConfig(epochs=5, seeds=0), compile="off")
    assert unmerged_twin(trainer, run_config.host) is None  # type: ignore[arg-type]  # no width seed yet
    slot = trainer.manager.slots[germinate_one(trainer, run_config)]
    assert isinstance(slot.seed, WidthSeed)
    slot.stage = SeedStage.TRAINING
    with torch.no_grad():
        slot.seed.fan_out.normal_()  # a seed that has learned something: its gradient is not zero
    twin = unmerged_twin(trainer, run_config.host)  # type: ignore[arg-type]
    assert twin is not None
    x, y = trainer.data.train.x[:16], trainer.data.train.y[:16]
    ours, theirs = trainer.model(x), twin(x)
    assert torch.equal(ours, theirs)  # isolation: the seed's delta adds nothing to the value
    torch.nn.functional.cross_entropy(ours, y).backward()
    torch.nn.functional.cross_entropy(theirs, y).backward()
    side = next(m for m in twin.modules() if isinstance(m, WidthSeed))
    assert side.fan_out.grad is not None and side.fan_out.grad.abs().sum() > 0
    for mine, twins in ((slot.seed, side), (trainer.model.model, twin)):
        for (name, p), (_, q) in zip(mine.named_parameters(), twins.named_parameters(), strict=False):
            assert torch.allclose(p.grad, q.grad, atol=1e-6), name  # host and seed: the same gradients
    result = run(WIDTH_RECIPE, BenchConfig(epochs=5, warmup_batches=0, compile="off"))
    assert result["ratio_unmerged_p50"] > 0 and len(result["samples_ms"]["bare_unmerged"]) == result["epochs"]


@requires_cuda("a width seed merged into the bare twin on the trainer's device")
def test_a_width_seed_benches_on_cuda_against_twins_built_on_cuda() -> None:
    trainer, run_config = _trainer(WIDTH_RECIPE, BenchConfig(epochs=5, seeds=0, device="cuda"), compile="off")
    germinate_one(trainer, run_config)
    for twin in (bare_twin(trainer, run_config.host), unmerged_twin(trainer, run_config.host)):  # type: ignore[arg-type]
        assert twin is not None and {p.device.type for p in twin.parameters()} == {"cuda"}


def test_a_host_with_no_fitting_blueprint_is_refused_with_the_fix() -> None:
    trainer, run_config = _trainer("digits-mlp", BenchConfig(epochs=5, seeds=0), compile="off")
    for slot in trainer.manager.slots.values():
        slot.profile = dataclasses.replace(slot.profile, feature_shape=(3, 5, 7, 11))  # fits nothing
    with pytest.raises(ValueError, match="bench with --seeds 0"):
        germinate_one(trainer, dataclasses.replace(run_config, blueprints=()))


def test_short_epochs_are_timed_for_at_least_min_timed_s_in_whole_rounds() -> None:
    config = BenchConfig(epochs=30, min_timed_s=2.0)
    assert _timed_epochs(config, bare_ms=1.5, paths=4) == 1336  # ceil(2000 / 1.5) = 1334, in rounds of 4
    assert _timed_epochs(config, bare_ms=1.5, paths=5) == 1335  # with the unmerged twin, rounds of 5
    assert _timed_epochs(config, bare_ms=100.0, paths=3) == 30  # long epochs: --epochs already fills it
    assert _timed_epochs(BenchConfig(epochs=31), bare_ms=1.5, paths=3) == 31  # 0 s: exactly --epochs
    # No warm-up asked for: one untimed round still measures the bare epoch.
    result = run("seed-reference", BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0, min_timed_s=0.01))
    assert result["epochs"] >= 6 and result["epochs"] % 4 == 0
    assert all(len(v) == result["epochs"] for v in result["samples_ms"].values())
    with pytest.raises(ValueError, match="--min-seconds"):
        BenchConfig(min_timed_s=-1.0)


DEPTH_RECIPE = "tests.helpers.user_models:gpt_deepen"


def test_a_depth_grown_host_benches_a_stacked_block_against_the_deeper_static_network() -> None:
    from esper_core.kasmina.depth import DepthSeed
    from esper_core.models.chars_gpt import next_char_loss

    trainer, run_config = _trainer(DEPTH_RECIPE, BenchConfig(epochs=5, seeds=0), compile="off")
    slot_id = germinate_one(trainer, run_config)
    slot = trainer.manager.slots[slot_id]
    assert slot_id == "blocks+depth" and isinstance(slot.seed, DepthSeed)
    x, y = trainer.data.train.x[:8], trainer.data.train.y[:8]
    slot.stage = SeedStage.TRAINING
    twin = unmerged_twin(trainer, run_config.host)  # type: ignore[arg-type]
    assert twin is not None
    ours, theirs = trainer.model(x), twin(x)
    # A depth seed does not train in isolation: it neither runs nor trains, and the twin is the
    # bare host (no side block to time).
    assert torch.equal(ours, theirs)
    assert not any(isinstance(m, DepthSeed) for m in twin.modules())
    next_char_loss(ours, y).backward()
    assert all(p.grad is None for p in slot.seed.parameters())
    slot.alpha = 1.0
    slot.stage = SeedStage.PROBATIONARY  # the block in at alpha 1, as the twin's deeper stack has it
    deeper = bare_twin(trainer, run_config.host)  # type: ignore[arg-type]
    assert len(deeper.get_submodule("blocks")) == 3
    with torch.inference_mode():
        assert torch.allclose(deeper(x), trainer.model(x), atol=1e-5)


def test_a_language_model_is_scored_in_bits_per_token_as_its_run_reports_it() -> None:
    # Accuracy (argmax hits of (B, classes) logits) reads 0 for a sequence of token targets; a
    # run reports its loss in bits per token there (esper_core.run.scores), and so does the bench.
    result = run(DEPTH_RECIPE, BenchConfig(epochs=5, warmup_batches=0, compile="off", seeds=0, min_timed_s=0))
    assert result["metric"] == "bits_per_token"
    assert not [key for key in result if key.startswith("accuracy")]
    paths = ("esper", "chosen", "bare", "bare_default")
    scores = {path: result[f"bits_per_token_{path}"] for path in paths}
    assert 0 < scores["esper"] < 4  # below the 4 bits of a uniform guess over the 16 symbols
    assert scores["chosen"] == scores["bare"] == scores["esper"]
    assert scores["bare_default"] == pytest.approx(scores["bare"], abs=0.05)
    assert score_line(result) == (
        f"test bits per token esper eager {scores['esper']:.3f}  chosen {scores['chosen']:.3f}  "
        f"bare {scores['bare']:.3f}"
    )
