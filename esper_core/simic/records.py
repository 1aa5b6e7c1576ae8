"""Durable records Simic learns from: field reports, decisions, and trained policy versions.

``SimicStore`` writes into the registry database (Urza's engine: WAL, ``BEGIN IMMEDIATE`` on
SQLite) and keeps policy weights in Urza's content-addressed blob store. Every write is one
transaction and an upsert on the record's key (a report's ``report_id``; a decision's run and
epoch), so a retried or replayed step rewrites its rows instead of duplicating them; a run that
dies loses nothing that reached a commit (``Run.commit`` records before it checkpoints).

The record types and their JSON forms are ``esper_core.simic.record_types``; they are re-exported
here, so ``from esper_core.simic.records import DecisionRecord, SimicStore`` keeps working.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Connection, Engine, func, select

from esper_core.contracts import AdaptationCommand, FieldReport
from esper_core.settings import EsperSettings
from esper_core.simic.models import DecisionRow, FieldReportRow, PolicyRow
from esper_core.simic.policy_signing import sign_policy, verify_policy
from esper_core.simic.record_types import (
    CounterfactualOutcome,
    DecisionRecord,
    DecisionState,
    IncompatiblePolicyError,
    PolicyVersion,
    report_id_for,
)
from esper_core.tamiyo.graph import FEATURE_DIMS, FEATURE_NAMES
from esper_core.tamiyo.model import POLICY_FORMAT, TamiyoGNNConfig
from esper_core.urza import schema
from esper_core.urza.blobs import BlobStore
from esper_core.urza.errors import RegistryConflictError, RegistryError
from esper_core.urza.service import BLOB_DIR_NAME, REGISTRY_DB_NAME, Urza
from esper_core.urza.signing import ArtifactSigner
from esper_core.urza.sql import SqlRegistry
from esper_core.urza.sql_engine import WRITE_OPTION, translate_errors, upsert

_PUBLISH_ATTEMPTS = 3


class SimicStore:
    """Field reports, decisions and policy versions in the registry database.

    The tables are part of Urza's schema (revision ``0003``): Urza creates or upgrades the
    database when it opens it, so build the store from an opened registry (``for_urza``) or let
    ``open`` open it.

    Args:
        engine: Engine of a registry database Urza has opened (Urza's engine settings).
        blobs: Where policy weights go (Urza's blob store).
        url: The database URL for messages (password hidden).
        owns_engine: Dispose of ``engine`` on ``close``.

    Raises:
        RegistryError: The database is not at the schema revision this code needs (it was not
            opened by Urza, or another Esper version changed it), or cannot be read.
    """

    def __init__(
        self,
        engine: Engine,
        blobs: BlobStore,
        *,
        url: str,
        owns_engine: bool = False,
        signer: ArtifactSigner | None = None,
    ) -> None:
        self.engine = engine
        self.blobs = blobs
        self.url = url
        self._owns_engine = owns_engine
        self._signer = signer
        # One SELECT: writing into a registry Urza never prepared would otherwise fail later with
        # "no such table" in the middle of a training run.
        with self._read("check the registry's schema revision") as conn:
            found = schema.read_revision(conn)
        if found != schema.head_revision():
            raise RegistryError(
                f"registry {url} is at schema revision {found or 'none (empty or pre-Alembic)'}, Simic "
                f"needs {schema.head_revision()}: open it with Urza.open (or SimicStore.open), which "
                "creates or upgrades the schema, before building a SimicStore on its engine"
            )

    @classmethod
    def for_urza(cls, urza: Urza) -> SimicStore | None:
        """The store in ``urza``'s database and blob store; None for a registry without SQL."""
        engine = getattr(urza.store, "engine", None)
        if not isinstance(engine, Engine):
            return None
        return cls(engine, urza.blobs, url=getattr(urza.store, "url", str(engine.url)), signer=urza.signer)

    @classmethod
    def open(cls, home: Path, url: str | None = None) -> SimicStore:
        """Open the store of the registry rooted at ``home`` (own engine; close it when done).

        The database is opened the way ``Urza.open`` opens it, so a fresh one gets the whole
        schema and an older SQLite one is upgraded (an older PostgreSQL one is refused with
        ``SchemaOutdatedError`` until ``esper registry upgrade``).
        """
        home = Path(home).resolve()
        home.mkdir(parents=True, exist_ok=True)
        registry = SqlRegistry(url or f"sqlite:///{home / REGISTRY_DB_NAME}")
        try:
            return cls(registry.engine, BlobStore(home / BLOB_DIR_NAME), url=registry.url, owns_engine=True)
        except BaseException:
            registry.close()
            raise

    @property
    def signer(self) -> ArtifactSigner:
        """Signs and verifies policy versions (default: the keys of ``EsperSettings``, as Urza's)."""
        if self._signer is None:
            self._signer = ArtifactSigner.from_settings(EsperSettings(), home=self.blobs.root.parent)
        return self._signer

    def close(self) -> None:
        """Release the engine if this store created it."""
        if self._owns_engine:
            self.engine.dispose()

    # ------------------------------------------------------------------ writes

    def record(self, *, reports: Sequence[FieldReport] = (), decisions: Sequence[DecisionRecord] = ()) -> None:
        """Store reports and decisions in one transaction; rows with a known id are overwritten.

        Raises:
            RegistryError: The database cannot be written (nothing was stored).
        """
        if not reports and not decisions:
            return
        dialect = self.engine.dialect.name
        with self._write("record field reports and decisions") as conn:
            for r in reports:
                values = _report_values(r)
                conn.execute(
                    upsert(
                        FieldReportRow.__table__,
                        values,
                        keys=["report_id"],
                        update=_updatable(values, "report_id"),
                        dialect=dialect,
                    )
                )
            for d in decisions:
                values = _decision_values(d)
                conn.execute(
                    upsert(
                        DecisionRow.__table__,
                        values,
                        keys=["run_id", "epoch"],
                        update=_updatable(values, "run_id", "epoch"),
                        dialect=dialect,
                    )
                )

    def publish_policy(
        self,
        state_dict: dict[str, torch.Tensor],
        *,
        gnn: TamiyoGNNConfig,
        method: str,
        provenance: dict[str, Any],
        parent_version: int | None = None,
    ) -> PolicyVersion:
        """Store trained weights as the next version: blob first, then the row.

        Idempotent: the same weights published again by the same method from the same parent
        (a retried task) return the existing version.

        Returns:
            The new (or existing) version.
        """
        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
        data = buffer.getvalue()
        sha = self.blobs.put(data)
        values = {
            "parent_version": parent_version,
            "method": method,
            "sha256": sha,
            "size_bytes": len(data),
            "gnn_config_json": json.dumps(dataclasses.asdict(gnn)),
            "feature_dims_json": json.dumps(FEATURE_DIMS),
            # The format and feature names let a later builder refuse these weights even at equal widths.
            "provenance_json": json.dumps(
                {
                    **provenance,
                    "policy_format": POLICY_FORMAT,
                    "graph_features": {nt: list(names) for nt, names in FEATURE_NAMES.items()},
                },
                default=str,
            ),
            "status": "active",
        }
        signature = sign_policy(self.signer, values, data)
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                with self._write("publish a policy version") as conn:
                    # Training is seeded, so a retried task produces the same weights: same version.
                    parent_match = (
                        PolicyRow.parent_version.is_(None)
                        if parent_version is None
                        else PolicyRow.parent_version == parent_version
                    )
                    same = select(PolicyRow.version).where(
                        PolicyRow.sha256 == sha, PolicyRow.method == method, parent_match
                    )
                    found = conn.execute(same).scalar()
                    if found is None:
                        version = (conn.execute(select(func.max(PolicyRow.version))).scalar() or 0) + 1
                        conn.execute(PolicyRow.__table__.insert().values(version=version, **values, **signature))
                    else:
                        version = found
                        # Re-publishing signs a version left unsigned or signed with an older key.
                        conn.execute(
                            PolicyRow.__table__.update().where(PolicyRow.version == version).values(**signature)
                        )
                break
            except RegistryConflictError:
                # Only without BEGIN IMMEDIATE (PostgreSQL): two publishers took the same number.
                if attempt == _PUBLISH_ATTEMPTS:
                    raise
        return self.get_policy(version)

    # ------------------------------------------------------------------ reads

    def field_reports(self, run_ids: Sequence[str] | None = None) -> list[FieldReport]:
        """Stored reports (of ``run_ids`` when given), by run and epoch."""
        stmt = select(FieldReportRow.report_json).order_by(FieldReportRow.run_id, FieldReportRow.epoch)
        if run_ids is not None:
            stmt = stmt.where(FieldReportRow.run_id.in_(list(run_ids)))
        with self._read("read field reports") as conn:
            return [FieldReport.from_json(t) for t in conn.execute(stmt).scalars()]

    def decisions(self, run_ids: Sequence[str] | None = None) -> list[DecisionRecord]:
        """Stored decisions (of ``run_ids`` when given), by run and epoch."""
        stmt = select(DecisionRow.__table__).order_by(DecisionRow.run_id, DecisionRow.epoch)
        if run_ids is not None:
            stmt = stmt.where(DecisionRow.run_id.in_(list(run_ids)))
        with self._read("read decisions") as conn:
            rows = conn.execute(stmt).all()
        return [
            DecisionRecord(
                command=AdaptationCommand.from_json(row.command_json),
                proposal=AdaptationCommand.from_json(row.proposal_json),
                policy=row.policy,
                policy_version=row.policy_version,
                state=DecisionState.from_json(row.state_json),
                log_prob=row.log_prob,
                value=row.value,
                counterfactual=None
                if row.counterfactual_json is None
                else CounterfactualOutcome.from_json(row.counterfactual_json),
            )
            for row in rows
        ]

    def policies(self) -> list[PolicyVersion]:
        """Every stored version, oldest first."""
        with self._read("list policy versions") as conn:
            rows = conn.execute(select(PolicyRow.__table__).order_by(PolicyRow.version)).all()
        return [_to_policy(row) for row in rows]

    def latest_policy(self) -> PolicyVersion | None:
        """The newest active version, or None when none was trained yet."""
        stmt = (
            select(PolicyRow.__table__).where(PolicyRow.status == "active").order_by(PolicyRow.version.desc()).limit(1)
        )
        with self._read("find the latest policy") as conn:
            row = conn.execute(stmt).first()
        return None if row is None else _to_policy(row)

    def get_policy(self, version: int) -> PolicyVersion:
        """Version ``version``.

        Raises:
            ValueError: No such version (the message lists the stored ones).
        """
        with self._read("read a policy version") as conn:
            row = conn.execute(select(PolicyRow.__table__).where(PolicyRow.version == version)).first()
        if row is None:
            known = [p.version for p in self.policies()]
            raise ValueError(
                f"no policy version {version} in {self.url}; stored versions: {known or 'none (run the train_policy flow)'}"
            )
        return _to_policy(row)

    def load_weights(self, policy: PolicyVersion) -> dict[str, torch.Tensor]:
        """The ``state_dict`` of ``policy``, its SHA-256 and signature verified before unpickling.

        Raises:
            UnsignedArtifactError: The version predates signing (``esper registry resign``).
            ArtifactSignatureError: Its weights or descriptor changed after signing, or its key is unknown.
        """
        blob = self.blobs.get(policy.sha256)
        verify_policy(self.signer, policy, blob)
        return torch.load(io.BytesIO(blob), weights_only=True)

    def set_policy_signature(self, version: int, *, signature: str, key_id: str) -> None:
        """Store a version's signature (``esper registry resign``)."""
        with self._write("store a policy's signature") as conn:
            conn.execute(
                PolicyRow.__table__.update()
                .where(PolicyRow.version == version)
                .values(signature=signature, signature_key_id=key_id)
            )

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self, operation: str) -> Iterator[Connection]:
        with translate_errors(self.url, operation), self.engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self, operation: str) -> Iterator[Connection]:
        with translate_errors(self.url, operation), self.engine.connect() as conn:
            yield conn


def _updatable(values: dict[str, Any], *keys: str) -> list[str]:
    return [c for c in values if c not in (*keys, "created_at")]


def _report_values(r: FieldReport) -> dict[str, Any]:
    c = r.command
    return {
        "report_id": r.report_id,
        "run_id": r.run_id,
        "command_id": c.command_id,
        "epoch": c.epoch,
        "action": c.action,
        "issued_by": c.issued_by,
        "slot_id": c.slot_id,
        "blueprint_id": c.blueprint_id,
        "outcome": r.outcome.value,
        "observation_epochs": r.observation_epochs,
        "metric_deltas_json": json.dumps(r.metric_deltas, sort_keys=True),
        "report_json": r.to_json(),
        "created_at": dt.datetime.now(dt.UTC),
    }


def _decision_values(d: DecisionRecord) -> dict[str, Any]:
    current = d.state.current
    return {
        "command_id": d.command.command_id,
        "run_id": d.command.run_id,
        "epoch": d.command.epoch,
        "policy": d.policy,
        "policy_version": d.policy_version,
        "action": d.command.action,
        "proposal_json": d.proposal.to_json(),
        "command_json": d.command.to_json(),
        "state_json": d.state.to_json(),
        "val_accuracy": current.val_accuracy,
        "val_loss": current.val_loss,
        "host_params": current.host_params,
        "seed_params": sum(s.param_count for s in current.seeds if s.stage.is_active),
        "log_prob": d.log_prob,
        "value": d.value,
        "counterfactual_json": None if d.counterfactual is None else d.counterfactual.to_json(),
        "created_at": dt.datetime.now(dt.UTC),
    }


def _to_policy(row: Any) -> PolicyVersion:  # noqa: ANN401  (a Core row of simic_policies)
    created = row.created_at
    if created.tzinfo is None:  # SQLite returns naive datetimes; they were written in UTC
        created = created.replace(tzinfo=dt.UTC)
    return PolicyVersion(
        version=row.version,
        parent_version=row.parent_version,
        method=row.method,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        gnn=TamiyoGNNConfig(**json.loads(row.gnn_config_json)),
        feature_dims=json.loads(row.feature_dims_json),
        provenance=json.loads(row.provenance_json),
        created_at=created,
        signature=row.signature,
        signature_key_id=row.signature_key_id,
    )


__all__ = [
    "CounterfactualOutcome",
    "DecisionRecord",
    "IncompatiblePolicyError",
    "DecisionState",
    "PolicyVersion",
    "RegistryError",
    "SimicStore",
    "report_id_for",
]
