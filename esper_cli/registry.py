"""``esper registry``: Urza's artifacts."""

from __future__ import annotations

import argparse
import json


def _cmd_registry_list(args: argparse.Namespace) -> int:
    from esper_core.settings import EsperSettings
    from esper_core.urza.service import Urza

    settings = EsperSettings()
    urza = Urza.open(settings.home, settings.registry_db_url)
    try:
        artifacts = urza.store.list_artifacts(blueprint_id=args.blueprint)
    finally:
        urza.close()
    if args.json:
        print(json.dumps([a.model_dump(mode="json") for a in artifacts], indent=2))
        return 0
    if not artifacts:
        print(f"no artifacts in {settings.home}; publish some with `esper catalog compile`")
        return 0
    print(f"{'id':>4} {'blueprint':<18} {'profile':<12} {'ver':>3} {'status':<12} {'kind':<9} {'env':<26} sha256")
    for a in artifacts:
        env = f"{a.environment.torch_version}/{a.environment.device_kind}/{a.environment.compiler}"
        print(
            f"{a.artifact_id:>4} {a.blueprint_id:<18} {a.shape_profile:<12} {a.version:>3} "
            f"{a.status.value:<12} {a.kind.value:<9} {env:<26} {a.sha256[:12]}"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``registry list``."""
    registry = sub.add_parser("registry", help="Urza's artifact registry").add_subparsers(
        dest="registry_command", required=True, metavar="ACTION"
    )
    r_list = registry.add_parser("list", help="list published kernel artifacts")
    r_list.add_argument("--blueprint", default=None, help="only this blueprint")
    r_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r_list.set_defaults(func=_cmd_registry_list)
