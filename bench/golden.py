"""golden: record a few runs epoch by epoch, or compare two records (a refactor changes no number).

The study is ``esper_core.studies.golden``; this entry point parses the command line and calls it.

    python -m bench.golden record before.json        # at the commit before a change
    python -m bench.golden record after.json         # at the commit after, same machine
    python -m bench.golden compare before.json after.json   # exit 1 and one line a difference
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from esper_core.settings import EsperSettings
from esper_core.studies.golden import DEFAULT_CASES, GoldenCase, compare, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="train the golden cases and write their record")
    rec.add_argument("out", type=Path)
    rec.add_argument(
        "--case",
        action="append",
        metavar="RECIPE:POLICY:SEED:EPOCHS",
        help="a case instead of the default set (repeat for more)",
    )
    cmp = sub.add_parser("compare", help="list where two records differ")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compare":
        lines = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
        print("\n".join(lines) if lines else "identical")
        return 1 if lines else 0
    cases = [_case(text, parser) for text in args.case] if args.case else list(DEFAULT_CASES)
    # A registry and runs of their own: a golden record never mixes with the user's runs.
    with tempfile.TemporaryDirectory(prefix="esper-golden-") as home:
        result = record(cases, EsperSettings(home=Path(home)))
    args.out.write_text(json.dumps(result, indent=1))
    for name, run in result.items():
        print(f"{name}: test loss {run['test_loss']}, weights {run['weights'][:12]}")
    return 0


def _case(text: str, parser: argparse.ArgumentParser) -> GoldenCase:
    parts = text.split(":")
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        parser.error(f"--case {text!r}: expected RECIPE:POLICY:SEED:EPOCHS, e.g. seed-reference:heuristic:0:4")
    return GoldenCase(recipe=parts[0], policy=parts[1], seed=int(parts[2]), epochs=int(parts[3]))


if __name__ == "__main__":
    raise SystemExit(main())
