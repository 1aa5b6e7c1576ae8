"""Service settings (where things live), kept apart from training hyperparameters.

Read from ``ESPER_*`` environment variables, e.g. ``ESPER_HOME=/data/esper``,
``ESPER_REGISTRY_URL=postgresql+psycopg://...``, ``ESPER_PROMETHEUS_PORT=9464``,
``ESPER_PUSHGATEWAY_URL=http://127.0.0.1:9091``, ``ESPER_DASK_ADDRESS=tcp://127.0.0.1:8786``,
``ESPER_GROW_TASK_SECONDS=10``, ``ESPER_COMPILE_TIMEOUT_S=1800``, ``ESPER_ALERT_WEBHOOK_URL=https://...``,
``ESPER_SIGNING_KEY=<key id>:<secret>``, ``ESPER_REGISTRY_OUTAGE_LIMIT_S=600``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EsperSettings(BaseSettings):
    """Locations and service endpoints for one Esper installation."""

    model_config = SettingsConfigDict(env_prefix="ESPER_", extra="ignore")

    home: Path = Field(default=Path(".esper"), description="Root of registry, artifacts and runs.")
    registry_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL of Urza; default: SQLite file <home>/registry.db.",
    )
    prometheus_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics on this port while flows run; unset: no server.",
    )
    pushgateway_url: str | None = Field(
        default=None,
        description="Also push Prometheus metrics to this Pushgateway (e.g. http://127.0.0.1:9091), "
        "for workers too short-lived or too far away to be scraped; unset: no pushing.",
    )
    dask_address: str | None = Field(
        default=None,
        description="Dask scheduler (tcp://host:8786) the distributed deployments fan out on; "
        "unset: each such flow run starts a temporary local Dask cluster.",
    )

    grow_task_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How long one `grow` task of a morphogenesis flow trains before handing back to "
        "the flow (it finishes the epoch it is in); 0: a task per epoch. Groups epochs into Prefect "
        "task runs without changing the run: every epoch is committed either way.",
    )

    # Time limits of the Prefect tasks that can run long: a hung compile, benchmark or epoch fails
    # its flow run with a message naming the setting instead of holding a worker forever.
    compile_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="Limit of one compile task (one kernel: ~1 s with export, 5-25 s with aot_inductor on 2 CPU "
        "cores); a task over it fails.",
    )
    bench_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Limit of one benchmark case of a sweep (the nightly cases take minutes); a case over it fails.",
    )
    train_timeout_s: float = Field(
        default=7200.0,
        gt=0,
        description="Limit of one training task: a morphogenesis `grow` task (about ESPER_GROW_TASK_SECONDS of "
        "epochs, but at least one whole epoch) or a Simic collect / imitate / improve task.",
    )
    alert_webhook_url: SecretStr | None = Field(
        default=None,
        description="POST a JSON message here when a benchmark sweep fails or crashes (e.g. a Slack or Teams "
        "incoming webhook); unset: no notification.",
    )

    signing_key: SecretStr | None = Field(
        default=None,
        description="Key that signs every artifact Urza publishes, as '<key id>:<secret>' (a secret of at least "
        "32 characters, e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`); unset: a key generated "
        "in <home>/signing.key on first use (fine for one machine; set one key everywhere when several workers "
        "share a registry).",
    )
    signing_key_fallbacks: SecretStr | None = Field(
        default=None,
        description="Older keys that still verify (never sign), comma-separated '<key id>:<secret>' entries: "
        "list the previous ESPER_SIGNING_KEY here when rotating, run `esper registry resign`, then drop it.",
    )
    registry_outage_limit_s: float = Field(
        default=600.0,
        gt=0,
        description="How long a training run rides out an unreachable registry database (deciding WAIT, keeping "
        "its records queued and retrying with backoff) before it fails.",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="Level of Esper's own loggers (esper_core.*) in flow runs, whose lines Prefect sends to the "
        "run's logs (PREFECT_LOGGING_EXTRA_LOGGERS=esper_core, set for deployments in prefect.yaml).",
    )

    @field_validator("home")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Resolve once so Prefect tasks in other working directories see the same place.
        return value.expanduser().resolve()

    @property
    def registry_db_url(self) -> str:
        """The registry URL to connect to (secret revealed only here)."""
        if self.registry_url is not None:
            return self.registry_url.get_secret_value()
        return f"sqlite:///{self.home / 'registry.db'}"

    @property
    def artifacts_dir(self) -> Path:
        """Content-addressed blob store of compiled kernels."""
        return self.home / "artifacts"

    @property
    def runs_dir(self) -> Path:
        """One sub-directory per training run."""
        return self.home / "runs"
