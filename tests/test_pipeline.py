"""Compile planning and the registry as compile cache."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from esper_core.contracts import ArtifactKind, ArtifactStatus
from esper_core.data import load_dataset
from esper_core.karn.entries import default_catalog
from esper_core.karn.policy import ApprovalRequiredError
from esper_core.karn.profiles import ShapeProfile
from esper_core.pipeline import (
    CompileJob,
    PublishPlan,
    compile_job,
    find_published,
    job_for,
    new_compile_run,
    publish_kernel,
    publish_staged,
)
from esper_core.run.plan import plan_compile_jobs
from esper_core.run.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.tezzeret.compiler import CompiledKernel, TezzeretConfig, compile_blueprint
from esper_core.tezzeret.formats import encode_eager
from esper_core.urza.errors import MissingBlobError
from esper_core.urza.service import Urza


def test_plan_covers_every_blueprint_and_distinct_slot_profile() -> None:
    config = get_recipe("digits-mlp")
    jobs = plan_compile_jobs(config, feature_shape=load_dataset(config.data).feature_shape, catalog=default_catalog())
    # Both slots of the 64-64 host read 64-wide activations: one profile, one job per blueprint,
    # with Karn's default parameters resolved (they are part of the compile cache's key).
    assert jobs == [
        CompileJob(blueprint_id=b, profile="f64-b512", params=tuple(default_catalog().resolve_params(b).items()))
        for b in config.blueprints
    ]


def test_plan_rejects_unknown_blueprints_and_bad_profiles() -> None:
    config = get_recipe("seed-reference")
    config.blueprints = ("no_such_blueprint",)
    with pytest.raises(ValueError, match="no_such_blueprint"):
        plan_compile_jobs(config, feature_shape=(16,), catalog=default_catalog())
    with pytest.raises(ValueError):
        CompileJob(blueprint_id="residual_mlp", profile="sixty-four")


def test_published_fallback_is_compiled_again_not_reused(esper_home: EsperSettings) -> None:
    catalog = default_catalog()
    job = CompileJob(blueprint_id="lowrank_adapter", profile="f16-b64")
    good = compile_blueprint(catalog, job.blueprint_id, ShapeProfile.parse(job.profile))
    blob = encode_eager(blueprint_id=job.blueprint_id, params=good.artifact.params, profile=job.profile, state_dict={})
    fallback = CompiledKernel(
        artifact=good.artifact.model_copy(
            update={
                "kind": ArtifactKind.EAGER,
                "fallback": True,
                "fallback_reason": "RuntimeError: transient",
                "sha256": hashlib.sha256(blob).hexdigest(),
                "size_bytes": len(blob),
            }
        ),
        blob=blob,
    )
    urza = Urza.open(esper_home.home)
    try:
        publish_kernel(urza, catalog, fallback)
        assert find_published(urza, job, "cpu") is None  # a fallback asks for a new attempt
        stored = publish_kernel(urza, catalog, good)
        assert stored.version == 2 and find_published(urza, job, "cpu") == stored
    finally:
        urza.close()


def test_publishing_a_row_without_its_blob_writes_nothing(esper_home: EsperSettings) -> None:
    catalog = default_catalog()
    kernel = compile_blueprint(catalog, "lowrank_adapter", ShapeProfile.parse("f16-b64"))
    urza = Urza.open(esper_home.home)
    try:
        with pytest.raises(MissingBlobError, match="is missing"):
            publish_staged(urza, catalog, kernel.artifact)
        assert urza.store.list_artifacts() == []
    finally:
        urza.close()


# --------------------------------------------------------------------------- tiers and the cache


def test_plan_needs_an_approval_for_experimental_blueprints() -> None:
    config = get_recipe("seed-reference")
    config.blueprints = ("lowrank_adapter", "glu_block")
    with pytest.raises(ApprovalRequiredError, match="--approve glu_block"):
        plan_compile_jobs(config, feature_shape=(16,), catalog=default_catalog())
    jobs = plan_compile_jobs(config, feature_shape=(16,), catalog=default_catalog(), approved=["glu_block"])
    assert [(j.blueprint_id, j.approved) for j in jobs] == [("lowrank_adapter", False), ("glu_block", True)]
    with pytest.raises(ApprovalRequiredError):
        compile_job(default_catalog(), CompileJob(blueprint_id="glu_block", profile="f16-b64"), "cpu")


def test_plan_skips_profiles_a_blueprint_does_not_support() -> None:
    config = get_recipe("digits-cnn")
    config.blueprints = ("conv_residual", "lowrank_adapter")
    jobs = plan_compile_jobs(config, feature_shape=(1, 8, 8), catalog=default_catalog())
    assert [(j.blueprint_id, j.profile) for j in jobs] == [
        ("conv_residual", "f16x8x8-b512"),
        ("lowrank_adapter", "f128-b512"),
    ]


def test_compile_job_and_config_must_agree_on_the_backend() -> None:
    job = CompileJob(blueprint_id="lowrank_adapter", profile="f16-b64", backend="aot_inductor")
    with pytest.raises(ValueError, match="backend 'aot_inductor' but the config compiles with 'export'"):
        compile_job(default_catalog(), job, "cpu", config=TezzeretConfig())
    with pytest.raises(ValueError, match="backend must be one of"):
        CompileJob(blueprint_id="lowrank_adapter", profile="f16-b64", backend="tvm")


def test_approved_and_high_risk_kernels_are_published_as_policy_says(esper_home: EsperSettings) -> None:
    catalog = default_catalog()
    urza = Urza.open(esper_home.home)
    try:
        run = urza.store.start_compile_run(new_compile_run("cpu", "export", detail={"test": True}))
        plan = PublishPlan(compile_run_id=run.run_id)
        glu = job_for(catalog, "glu_block", "f16-b64", approved=["glu_block"])
        wide = job_for(catalog, "wide_mlp", "f16-b64", params={"expansion": 1}, approved=["wide_mlp"])
        stored_glu = publish_kernel(urza, catalog, compile_job(catalog, glu, "cpu"), plan=plan)
        stored_wide = publish_kernel(urza, catalog, compile_job(catalog, wide, "cpu"), plan=plan)
        assert stored_glu.status is ArtifactStatus.ACTIVE
        assert urza.store.record(stored_glu.artifact_id or 0).tags == ("approved",)
        assert stored_wide.status is ArtifactStatus.QUARANTINED
        record = urza.store.record(stored_wide.artifact_id or 0)
        assert "quarantine-only" in record.history[0].reason and record.history[0].actor == "tezzeret"
        assert record.compile_run is not None and record.compile_run.run_id == run.run_id
        # A quarantined verdict counts as done: re-running the job must not publish over it.
        assert find_published(urza, wide, "cpu") == stored_wide
    finally:
        urza.close()


def test_a_rerun_compiles_nothing_new(esper_home: EsperSettings) -> None:
    catalog = default_catalog()
    jobs = [job_for(catalog, b, "f8-b16") for b in ("lowrank_adapter", "bottleneck_mlp")]
    urza = Urza.open(esper_home.home)
    try:
        assert _compile_missing(urza, jobs) == 2
        assert _compile_missing(urza, jobs) == 0
        other_params = job_for(catalog, "lowrank_adapter", "f8-b16", params={"rank": 2})
        assert _compile_missing(urza, [*jobs, other_params]) == 1, "parameters are part of the cache key"
        aoti = CompileJob(**{**_fields(jobs[0]), "backend": "aot_inductor"})
        assert find_published(urza, aoti, "cpu") is None, "the compiler is part of the cache key"
    finally:
        urza.close()


def _fields(job: CompileJob) -> dict:
    return {f: getattr(job, f) for f in ("blueprint_id", "profile", "params", "backend", "approved")}


def _compile_missing(urza: Urza, jobs: list[CompileJob]) -> int:
    compiled = 0
    for job in jobs:
        if find_published(urza, job, "cpu") is None:
            publish_kernel(urza, default_catalog(), compile_job(default_catalog(), job, "cpu"))
            compiled += 1
    return compiled


_INTERRUPTED = textwrap.dedent(
    """
    import sys
    from esper_core.karn.entries import default_catalog
    from esper_core.pipeline import compile_job, find_published, job_for, publish_kernel
    from esper_core.urza.service import Urza

    home = sys.argv[1]
    catalog = default_catalog()
    urza = Urza.open(home)
    for blueprint_id, profile in [tuple(arg.split("@")) for arg in sys.argv[2:]]:
        job = job_for(catalog, blueprint_id, profile)
        if find_published(urza, job, "cpu") is None:
            publish_kernel(urza, catalog, compile_job(catalog, job, "cpu"))
            print("published", blueprint_id, flush=True)
    """
)
_JOBS = [
    "lowrank_adapter@f8-b16",
    "bottleneck_mlp@f8-b16",
    "residual_mlp@f8-b16",
    "pointwise_adapter@f4x6x6-b16",
    "depthwise_separable@f4x6x6-b16",
    "conv_residual@f4x6x6-b16",
]


@pytest.mark.slow
def test_a_killed_compile_leaves_nothing_half_written_and_a_rerun_resumes(esper_home: EsperSettings) -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, str(esper_home.home), *_JOBS],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("published"), proc.stderr.read() if proc.stderr else ""
    proc.kill()  # SIGKILL mid-run: no cleanup handlers run
    proc.wait(timeout=60)
    urza = Urza.open(esper_home.home)
    try:
        done = urza.store.list_artifacts()
        assert 1 <= len(done) < len(_JOBS), "killed after the first publish, before the last"
        for artifact in done:
            assert urza.fetch_blob(artifact)  # every visible row has its complete, verified blob
            assert urza.store.record(artifact.artifact_id or 0).history
        catalog = default_catalog()
        jobs = [job_for(catalog, *spec.split("@")) for spec in _JOBS]
        assert _compile_missing(urza, jobs) == len(_JOBS) - len(done), "a re-run compiles only what is missing"
        assert len(urza.store.list_artifacts()) == len(_JOBS)
        # Whatever the kill left in the blob store (a temp file, an unpublished blob) is garbage.
        report = urza.gc(dry_run=False, min_age_s=0)
        assert all(f.sha256 not in {a.sha256 for a in urza.store.list_artifacts()} for f in report.removed)
    finally:
        urza.close()
