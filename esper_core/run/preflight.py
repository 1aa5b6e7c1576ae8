"""Checks before any work starts: the home is writable, the registry answers, and one batch of the
run's own data goes forward and backward through its model and loss on its device.

Common mistakes used to fail late and in floods: a registry on a closed port, an unreadable
``ESPER_HOME`` or targets the loss cannot take each ended a run with up to 478 lines and 9
tracebacks, after a Prefect flow run (and for wrong targets a compile and a run folder) existed.
``esper run`` calls ``preflight`` before Prefect starts and the morphogenesis flow's first task
calls it again (a deployment has no CLI in front of it). Each failure is a ``PreflightError``:
one line naming the problem and the fix, and nothing created.

The batch check restores every random state it touches, so the run's numbers do not change, and
takes no optimiser step: the model it builds is thrown away.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

from esper_core._capabilities import resolve_device
from esper_core.data import Dataset
from esper_core.determinism import capture_rng, restore_rng, seed_everything
from esper_core.run.build import build_host
from esper_core.run.config import RunConfig
from esper_core.settings import EsperSettings
from esper_core.simic.records import SimicStore
from esper_core.urza.service import Urza


class PreflightError(ValueError):
    """A check before any work failed; the message names the problem and the fix."""


def preflight(config: RunConfig, data: Dataset, *, settings: EsperSettings) -> None:
    """Run every check, cheapest first.

    Raises:
        PreflightError: The first check that fails.
    """
    check_home(settings.home)
    check_registry(settings)
    check_pinned_policy(config, settings)
    check_one_batch(config, data)


def check_pinned_policy(config: RunConfig, settings: EsperSettings) -> None:
    """A run pinned to Simic version N (``esper run --policy gnn:N``) finds N in this registry,
    trained for this Tamiyo: otherwise the first decision would fail after an epoch of work, or,
    with no SQL store to read versions from, untrained weights would decide."""
    tamiyo = config.tamiyo
    version = tamiyo.policy_version
    if tamiyo.policy != "gnn" or version is None:
        return
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        store = SimicStore.for_urza(urza)
        if store is None:
            raise PreflightError(
                f"policy gnn:{version} needs a registry that stores Simic versions (SQL), and this one has none: "
                "unset ESPER_REGISTRY_URL for the SQLite registry in ESPER_HOME, or pin a shipped policy"
            )
        try:
            policy = store.get_policy(version)
        except ValueError as e:
            raise PreflightError(f"policy gnn:{version}: {e}: pin one of them, or train one (esper policy tune)") from e
    finally:
        urza.close()
    if policy.gnn != tamiyo.gnn:
        raise PreflightError(
            f"policy gnn:{version} was trained with {policy.gnn}, but this run's Tamiyo is {tamiyo.gnn}: "
            "set the recipe's TamiyoConfig.gnn to the stored size, or pin another version"
        )


def check_home(home: Path) -> None:
    """``home`` exists (or can be made) and a file can be written in it."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=home, prefix=".esper-preflight-"):
            pass
    except OSError as e:
        raise PreflightError(
            f"ESPER_HOME {home} is not writable ({e.strerror or e}): set ESPER_HOME to a folder you can write, "
            "or fix its permissions"
        ) from e


def check_registry(settings: EsperSettings) -> None:
    """The registry database opens and answers a read."""
    url = settings.registry_db_url
    try:
        urza = Urza.open(settings.home, url)
        try:
            urza.store.list_artifacts()
        finally:
            urza.close()
    # A database that cannot be reached fails in the driver's own exception types.
    except Exception as e:  # noqa: BLE001
        where = url or f"sqlite under {settings.home}"
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise PreflightError(
            f"the registry at {where} does not answer ({reason}): start its database, or set ESPER_REGISTRY_URL "
            "to one that runs (unset, Esper uses SQLite in ESPER_HOME)"
        ) from e


def check_one_batch(config: RunConfig, data: Dataset) -> None:
    """One batch of the training split forward and backward through the model and the loss, on the
    run's device, with no optimiser step; every random state is as it was afterwards."""
    device = resolve_device(config.trainer.device)
    state = capture_rng()
    outputs: torch.Tensor | None = None
    y: torch.Tensor | None = None
    try:
        # What the user's code warns here it warns again at the run's first step: a failed check
        # is one line, not a line and a warning.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seed_everything(config.seed)
            model = build_host(config, feature_shape=data.feature_shape, num_classes=data.num_classes).to(device)
            x, y = data.train.head(min(config.data.batch_size, len(data.train)))
            outputs = model(x.to(device))
            if config.loss is F.cross_entropy and _token_logits(outputs, y):
                # F.cross_entropy reads dim 1 as the classes: of (B, T, V) logits that is T, so it
                # fails, or when T == V silently scores the wrong axis.
                raise PreflightError(
                    _token_loss_fix(outputs, "the default loss F.cross_entropy reads dim 1 as the classes")
                )
            loss = config.loss(outputs, y.to(device))
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise PreflightError(
                    f"the loss returned {shape}, not a scalar: make it return the batch's mean loss "
                    "(e.g. reduction='mean')"
                )
            loss.backward()
    except PreflightError:
        raise
    # The user's model, data and loss can fail in any exception type; the point is to say so now.
    except Exception as e:  # noqa: BLE001
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        if outputs is not None and y is not None and _token_logits(outputs, y):
            raise PreflightError(_token_loss_fix(outputs, f"RunConfig.loss failed on them ({reason})")) from e
        raise PreflightError(
            f"one training batch failed on {device} ({reason}); {_shapes(data, outputs)}: make the model's "
            "output and the targets fit the recipe's loss (RunConfig.loss)"
        ) from e
    finally:
        restore_rng(state)


def _token_logits(outputs: torch.Tensor, y: torch.Tensor) -> bool:
    """(B, T, V) logits against (B, T) integer targets: a language model's next-token outputs."""
    return (
        isinstance(outputs, torch.Tensor)
        and outputs.dim() == 3
        and outputs.dtype.is_floating_point
        and not y.dtype.is_floating_point
        and tuple(y.shape) == tuple(outputs.shape[:2])
    )


def _token_loss_fix(outputs: torch.Tensor, what: str) -> str:
    _, length, vocab = outputs.shape
    return (
        f"the model returns next-token logits ({length}, {vocab}) per sample for ({length},) token targets, and "
        f"{what}: set RunConfig.loss to a loss over every position, e.g. "
        "loss=lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())"
    )


def _shapes(data: Dataset, outputs: torch.Tensor | None) -> str:
    """The shapes of a sample's input, target and (when the model got that far) output."""
    try:
        x, y = data.train.head(1)
    except Exception:  # noqa: BLE001 - only for the message
        return "the data's shapes are unknown"
    said = f"inputs {tuple(x.shape[1:])} {x.dtype}, targets {tuple(y.shape[1:])} {y.dtype}"
    if isinstance(outputs, torch.Tensor):
        said += f", model outputs {tuple(outputs.shape[1:])} {outputs.dtype}"
    return said + " per sample"
