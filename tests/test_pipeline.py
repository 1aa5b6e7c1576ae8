"""Compile planning and the registry as compile cache."""

from __future__ import annotations

import hashlib

import pytest

from esper_core.contracts import ArtifactKind
from esper_core.data import load_dataset
from esper_core.karn.catalog import default_catalog
from esper_core.karn.profiles import ShapeProfile
from esper_core.pipeline import CompileJob, find_published, plan_compile_jobs, publish_kernel, publish_staged
from esper_core.recipes import get_recipe
from esper_core.settings import EsperSettings
from esper_core.tezzeret.compiler import CompiledKernel, compile_blueprint
from esper_core.tezzeret.formats import encode_eager
from esper_core.urza.errors import MissingBlobError
from esper_core.urza.service import Urza


def test_plan_covers_every_blueprint_and_distinct_slot_profile() -> None:
    config = get_recipe("digits-mlp")
    jobs = plan_compile_jobs(config, feature_shape=load_dataset(config.data).feature_shape, catalog=default_catalog())
    # Both slots of the 64-64 host read 64-wide activations: one profile, one job per blueprint.
    assert jobs == [CompileJob(blueprint_id=b, profile="f64-b512") for b in config.blueprints]


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
