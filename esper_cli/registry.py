"""``esper registry``: Urza's artifacts (list, show, quarantine, retire, tag, gc, upgrade, resign, verify)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from esper_cli.args import positive

_STATUSES = ("active", "quarantined", "retired")


def _actor() -> str:
    return f"cli:{os.environ.get('USER') or os.environ.get('LOGNAME') or 'unknown'}"


def _registry_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Print a registry error's message (it names the fix) and exit 2, without a traceback."""

    def run(args: argparse.Namespace) -> int:
        from esper_core.urza.errors import RegistryError

        try:
            return command(args)
        except (RegistryError, LookupError) as e:
            print(f"esper: error: {e}", file=sys.stderr)
            return 2

    return run


def _open():  # noqa: ANN202 - (settings, Urza); imported lazily so `esper --help` stays fast
    from esper_core.settings import EsperSettings
    from esper_core.urza.service import Urza

    settings = EsperSettings()
    return settings, Urza.open(settings.home, settings.registry_db_url)


def _env(a) -> str:  # noqa: ANN001 - a KernelArtifact
    return f"{a.environment.torch_version}/{a.environment.device_kind}/{a.environment.compiler}"


@_registry_errors
def _cmd_list(args: argparse.Namespace) -> int:
    from esper_core.contracts import ArtifactStatus

    settings, urza = _open()
    try:
        status = None if args.status is None else ArtifactStatus(args.status)
        artifacts = urza.store.list_artifacts(blueprint_id=args.blueprint, status=status, tag=args.tag)
    finally:
        urza.close()
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in artifacts], indent=2))
        return 0
    if not artifacts:
        print(f"no artifacts match in {settings.home}; publish some with `esper catalog compile`")
        return 0
    print(f"{'id':>4} {'blueprint':<20} {'profile':<14} {'ver':>3} {'status':<12} {'kind':<9} {'env':<26} sha256")
    for a in artifacts:
        print(
            f"{a.artifact_id:>4} {a.blueprint_id:<20} {a.shape_profile:<14} {a.version:>3} "
            f"{a.status.value:<12} {a.kind.value:<9} {_env(a):<26} {a.sha256[:12]}"
        )
    return 0


@_registry_errors
def _cmd_show(args: argparse.Namespace) -> int:
    _, urza = _open()
    try:
        record = urza.store.record(args.id)
        blob_present = urza.blobs.exists(record.artifact.sha256)
    finally:
        urza.close()
    if args.json:
        print(json.dumps({**record.to_dict(), "blob_present": blob_present}, indent=2))
        return 0
    a = record.artifact
    print(f"artifact #{a.artifact_id}: {a.blueprint_id} {a.shape_profile} v{a.version}")
    print(f"  status       {a.status.value}" + (f" ({a.status_reason})" if a.status_reason else ""))
    print(f"  kind         {a.kind.value}" + (f" FALLBACK: {a.fallback_reason}" if a.fallback else ""))
    print(f"  environment  {_env(a)}")
    print(f"  params       {json.dumps(a.params)}")
    print(f"  guard        {a.guard.describe()}")
    print(f"  blob         {a.sha256} ({a.size_bytes} bytes{'' if blob_present else ', MISSING'})")
    print(f"  compile      {a.compile_ms:.0f} ms")
    print(
        "  signature    " + (f"key {a.signature_key_id}" if a.signature else "NONE (refused: `esper registry resign`)")
    )
    for key, s in sorted(a.latency.items(), key=lambda kv: (kv[0].rpartition("b")[0], int(kv[0].rpartition("b")[2]))):
        print(f"  latency      {key:<9} p50 {s.p50_ms:.3f} ms  p95 {s.p95_ms:.3f} ms  ({s.samples} calls)")
    print(f"  tags         {', '.join(record.tags) or '-'}")
    run = record.compile_run
    if run is None:
        print("  lineage      - (published outside a compile run)")
    else:
        print(
            f"  lineage      compile run {run.run_id} ({run.state}, {run.compiler}, {run.hostname}, {run.started_at})"
        )
    for change in record.history:
        print(
            f"  history      {change.changed_at:%Y-%m-%d %H:%M:%S} {change.status.value:<12} {change.actor}: {change.reason}"
        )
    return 0


def _set_status(status_name: str) -> Callable[[argparse.Namespace], int]:
    @_registry_errors
    def run(args: argparse.Namespace) -> int:
        from esper_core.contracts import ArtifactStatus

        _, urza = _open()
        try:
            artifact = urza.store.set_status(args.id, ArtifactStatus(status_name), args.reason, actor=_actor())
        finally:
            urza.close()
        print(
            f"artifact #{artifact.artifact_id} ({artifact.blueprint_id} {artifact.shape_profile}) is now {status_name}"
        )
        return 0

    return run


@_registry_errors
def _cmd_tag(args: argparse.Namespace) -> int:
    _, urza = _open()
    try:
        tags = urza.store.add_tags(args.id, args.tags)
    finally:
        urza.close()
    print(f"artifact #{args.id} tags: {', '.join(tags)}")
    return 0


@_registry_errors
def _cmd_gc(args: argparse.Namespace) -> int:
    _, urza = _open()
    try:
        report = urza.gc(dry_run=args.dry_run, min_age_s=args.min_age_s)
    finally:
        urza.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    verb = "would remove" if report.dry_run else "removed"
    for f in report.removed:
        print(f"{verb} {f.path} ({f.size_bytes} bytes{'' if f.sha256 else ', interrupted write'})")
    print(
        f"{verb} {len(report.removed)} file(s), {report.removed_bytes} bytes; kept {report.referenced} referenced "
        f"blob(s) and {report.too_young} younger than {args.min_age_s:g} s"
    )
    return 0


@_registry_errors
def _cmd_upgrade(args: argparse.Namespace) -> int:
    del args
    from esper_core.settings import EsperSettings
    from esper_core.urza.sql import upgrade_schema

    settings = EsperSettings()
    settings.home.mkdir(parents=True, exist_ok=True)
    before, after = upgrade_schema(settings.registry_db_url)
    if before == after:
        print(f"registry schema is at {after}, the newest this Esper knows: nothing to do")
    else:
        print(f"registry schema upgraded from {before or 'empty'} to {after}")
    return 0


@_registry_errors
def _cmd_resign(args: argparse.Namespace) -> int:
    from esper_core.simic.policy_signing import resign_policies
    from esper_core.simic.records import SimicStore

    _, urza = _open()
    try:
        report = urza.resign(dry_run=args.dry_run)
        simic = SimicStore.for_urza(urza)
        policies, refused_policies = (
            ([], []) if simic is None else resign_policies(simic, urza.signer, dry_run=args.dry_run)
        )
    finally:
        urza.close()
    if args.json:
        out = {**report.to_dict(), "policies_resigned": policies}
        out["policies_refused"] = [{"version": v, "why": why} for v, why in refused_policies]
        print(json.dumps(out, indent=2))
    else:
        verb = "would sign" if report.dry_run else "signed"
        print(
            f"{verb} {len(report.resigned)} artifact(s) with key {report.key_id}; "
            f"{len(report.current)} already signed with it"
        )
        print(f"{verb} {len(policies)} Simic policy version(s)")
        for artifact_id, why in report.refused:
            print(f"refused artifact {artifact_id}: {why}", file=sys.stderr)
        for version, why in refused_policies:
            print(f"refused policy v{version}: {why}", file=sys.stderr)
    # Refused ones do not verify: an operator must look at them (quarantine, re-publish, retrain).
    return 1 if report.refused or refused_policies else 0


@_registry_errors
def _cmd_verify(args: argparse.Namespace) -> int:
    _, urza = _open()
    try:
        report = urza.verify_all()
    finally:
        urza.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(f"{len(report.verified)} artifact(s) verified, {len(report.refused)} refused")
        for artifact_id, why in report.refused:
            print(f"refused artifact {artifact_id}: {why}", file=sys.stderr)
    return 1 if report.refused else 0


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``registry list|show|quarantine|retire|tag|gc|upgrade|resign|verify``."""
    registry = sub.add_parser("registry", help="Urza's artifact registry").add_subparsers(
        dest="registry_command", required=True, metavar="ACTION"
    )
    r_list = registry.add_parser("list", help="list published kernel artifacts")
    r_list.add_argument("--blueprint", default=None, help="only this blueprint")
    r_list.add_argument("--status", choices=_STATUSES, help="only artifacts with this status")
    r_list.add_argument("--tag", default=None, help="only artifacts with this tag")
    r_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r_list.set_defaults(func=_cmd_list)
    r_show = registry.add_parser("show", help="one artifact: guards, latency, tags, lineage, status history")
    r_show.add_argument("id", type=positive, metavar="ID", help="artifact id (see `esper registry list`)")
    r_show.add_argument("--json", action="store_true", help="print JSON")
    r_show.set_defaults(func=_cmd_show)
    for name, status, what in (
        ("quarantine", "quarantined", "stop an artifact from being germinated (reversible)"),
        ("retire", "retired", "retire an artifact for good"),
    ):
        r_status = registry.add_parser(name, help=what)
        r_status.add_argument("id", type=positive, metavar="ID", help="artifact id")
        r_status.add_argument("--reason", required=True, help="why (kept in the artifact's history)")
        r_status.set_defaults(func=_set_status(status))
    r_tag = registry.add_parser("tag", help="add tags to an artifact")
    r_tag.add_argument("id", type=positive, metavar="ID", help="artifact id")
    r_tag.add_argument("tags", nargs="+", metavar="TAG", help="tags: a-z, 0-9, '_', '.', ':', '-'")
    r_tag.set_defaults(func=_cmd_tag)
    r_gc = registry.add_parser("gc", help="delete blobs no artifact references (and interrupted writes)")
    r_gc.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    r_gc.add_argument(
        "--min-age-s",
        type=_non_negative,
        default=3600.0,
        help="keep files younger than this: they may belong to a publish in progress (default: %(default)s)",
    )
    r_gc.add_argument("--json", action="store_true", help="print JSON")
    r_gc.set_defaults(func=_cmd_gc)
    r_upgrade = registry.add_parser("upgrade", help="upgrade the registry's schema to this Esper's (back up first)")
    r_upgrade.set_defaults(func=_cmd_upgrade)
    r_resign = registry.add_parser(
        "resign",
        help="sign every unsigned artifact, and those of an older key, with ESPER_SIGNING_KEY (after a key "
        "rotation or an upgrade from an Esper without signatures)",
    )
    r_resign.add_argument("--dry-run", action="store_true", help="only report what would be signed")
    r_resign.add_argument("--json", action="store_true", help="print JSON")
    r_resign.set_defaults(func=_cmd_resign)
    r_verify = registry.add_parser(
        "verify", help="check every artifact's blob digest and signature; exit 1 listing those refused"
    )
    r_verify.add_argument("--json", action="store_true", help="print JSON")
    r_verify.set_defaults(func=_cmd_verify)
