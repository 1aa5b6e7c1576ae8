"""``esper export RUN_ID``: a grown network as a ``torch.export`` program and a state dict."""

from __future__ import annotations

import argparse
from pathlib import Path


def _cmd_export(args: argparse.Namespace) -> int:
    from esper_core.run.export import export_run
    from esper_core.settings import EsperSettings

    done = export_run(settings=EsperSettings(), run_id=args.run_id, out=args.out)
    widths = ", ".join(f"{name} {units}" for name, units in done.widths.items())
    print(f"exported   {done.directory}/ (model.pt2, state_dict.pt, export.json)")
    print(f"network    {done.parameters} parameters; widths: {widths}")
    print(f"checked    max |program - model| = {done.max_abs_diff:.3g} on validation samples")
    print(f"load       torch.export.load('{done.directory / 'model.pt2'}').module()(x)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``export`` to the top-level subcommands."""
    export = sub.add_parser("export", help="write a run's grown network as a torch.export program and a state dict")
    export.add_argument("run_id", metavar="RUN_ID", help="a run under $ESPER_HOME/runs (its last commit is exported)")
    export.add_argument(
        "--out", type=Path, default=None, help="folder to write to (default: $ESPER_HOME/runs/RUN_ID/export)"
    )
    export.set_defaults(func=_cmd_export)
