"""Language models are first-class (issue 36, item 5): a nanoGPT-style GPT written outside the
project (``tests/helpers/user_gpt.py``) as a new user brings it.

A misfit loss is one line naming ``RunConfig.loss`` before any work; the run reports bits per
token, never an accuracy; ``esper export`` of a grown GPT (a fossilised branch seed included)
takes any sequence length up to the context and loads with torch alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from esper_core.run.commits import epoch_tag
from esper_core.run.preflight import PreflightError, check_one_batch
from esper_core.run.reports import finish_run
from esper_core.run.scores import describe, token_targets
from esper_core.run.session import Run
from esper_core.run.spec import RunSpec, plan_spec
from esper_core.settings import EsperSettings
from esper_core.studies.growth import compile_kernels
from tests.helpers import user_gpt
from tests.helpers.exported import run_with_torch_alone

REPO = Path(__file__).resolve().parents[2]
GPT = "tests.helpers.user_gpt:recipe"
GROWN = "tests.helpers.user_gpt:grown"


def _esper(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "ESPER_HOME": str(home), "PREFECT_HOME": str(home.parent / "prefect")}
    environ.pop("PREFECT_API_URL", None)
    esper = str(Path(sys.executable).with_name("esper"))
    return subprocess.run([esper, *args], cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def _run_to_the_end(session: Run) -> None:
    while session.epoch < session.config.epochs:
        epoch = session.epoch
        session.train_epoch()
        session.commit(epoch_tag(epoch, "trained"))
        session.apply(session.decide())
        session.commit(epoch_tag(epoch, "applied"))


def test_the_default_loss_on_token_logits_is_refused_naming_the_fix(esper_home: EsperSettings) -> None:
    planned = plan_spec("tests.helpers.user_gpt:default_loss", device="cpu")
    with pytest.raises(PreflightError, match=r"next-token logits \(12, 16\) per sample for \(12,\) token targets") as e:
        check_one_batch(planned.config, planned.data)
    assert "RunConfig.loss" in str(e.value) and "logits.flatten(0, 1)" in str(e.value)
    # A loss of the user's own that fails on token logits gets the same fix.
    planned.config.loss = lambda logits, y: F.nll_loss(logits, y)
    with pytest.raises(PreflightError, match=r"RunConfig.loss failed on them \(RuntimeError.*logits.flatten"):
        check_one_batch(planned.config, planned.data)
    # When the context equals the vocabulary F.cross_entropy does not fail: it scores the wrong
    # axis. Refused all the same.
    user_gpt.CONTEXT, context = user_gpt.VOCAB, user_gpt.CONTEXT
    try:
        planned = plan_spec("tests.helpers.user_gpt:default_loss", device="cpu")
        with pytest.raises(PreflightError, match="reads dim 1 as the classes"):
            check_one_batch(planned.config, planned.data)
    finally:
        user_gpt.CONTEXT = context
    check_one_batch(plan_spec(GPT, device="cpu").config, plan_spec(GPT, device="cpu").data)  # the fixed loss passes


@pytest.mark.slow
def test_esper_run_refuses_it_in_one_line_before_any_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _esper(home, "run", "--recipe", "tests.helpers.user_gpt:default_loss", "--device", "cpu")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert "RunConfig.loss" in line and "F.cross_entropy(logits.flatten(0, 1), y.flatten())" in line
    assert not (home / "runs").exists()  # nothing stored, no flow run to retry


def test_a_language_model_is_scored_in_bits_per_token_never_by_accuracy(esper_home: EsperSettings) -> None:
    session = Run.start(RunSpec(recipe=GPT, device="cpu", run_id="lm"), settings=esper_home)
    try:
        assert token_targets(session.trainer.data)
        _run_to_the_end(session)
        summary = finish_run(session)
    finally:
        session.close()
    assert summary.token_targets and summary.val_loss == session.history[-1].val_loss
    # Its packets say that their accuracy means nothing: Simic's rewards read the loss instead.
    assert all(not p.classifies and p.val_accuracy == 0.0 for p in session.history)
    report = (esper_home.runs_dir / "lm" / "report.md").read_text()
    assert f"Test loss **{summary.test_loss / 0.6931471805599453:.4f} bits per token**" in report
    assert "accuracy" not in report.lower() and "val bits/token" in report
    assert describe("val", loss=2.0, accuracy=0.0, tokens=True) == "val loss 2.0000 (2.885 bits per token)"
    assert "accuracy 0.5000" in describe("val", loss=2.0, accuracy=0.5, tokens=False)
    assert not token_targets(plan_spec("digits-mlp", device="cpu").data)  # class targets keep accuracy


@pytest.mark.slow
def test_esper_run_of_a_language_model_prints_bits_not_accuracy(tmp_path: Path) -> None:
    done = _esper(tmp_path / "home", "run", "--recipe", GPT, "--epochs", "1", "--device", "cpu", "--run-id", "lm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bits/token test" in done.stdout and "accuracy" not in done.stdout
    # The epoch lines and the flow's last line (Prefect's log) say bits too.
    assert "bits per token" in done.stderr + done.stdout and "accuracy 0.0000" not in done.stderr + done.stdout


@pytest.mark.slow
def test_a_grown_gpt_exports_with_its_fossil_and_any_length_up_to_the_context(
    esper_home: EsperSettings, tmp_path: Path
) -> None:
    from esper_core.run.export import export_run

    compile_kernels(esper_home, (GROWN,), "cpu")
    session = Run.start(RunSpec(recipe=GROWN, device="cpu", run_id="grown"), settings=esper_home)
    try:
        _run_to_the_end(session)
        assert session.manager.slots["transformer.h.0"].stage.value == "fossilized"
        x, _ = session.trainer.data.test.head(4)
        session.trainer.model.eval()
        with torch.inference_mode():
            live = session.trainer.model(x)
            host_alone = session.trainer.model.plain_copy().eval()(x)
    finally:
        session.close()
    assert not torch.allclose(live, host_alone, atol=1e-4)  # the fossil is part of the network
    done = export_run(settings=esper_home, run_id="grown", out=tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert manifest["dynamic"]["length"] == "1..12" and manifest["check"]["lengths"] == [1, 6, 12]
    assert done.max_abs_diff < 1e-4
    # A fresh interpreter with torch and nothing of Esper's, at lengths 1, T/2 and T.
    outputs = run_with_torch_alone(tmp_path / "out" / "model.pt2", [x[:, :n] for n in (1, 6, 12)], tmp_path)
    for n, got in zip((1, 6, 12), outputs, strict=True):
        # Causal: the first n positions of the full-length output are the output of the prefix.
        torch.testing.assert_close(got, live[:, :n], rtol=1e-4, atol=1e-5)
