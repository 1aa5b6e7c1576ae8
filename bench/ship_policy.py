"""ship_policy: put a zoo training's chosen policy into Esper's package, with its provenance.

Reads the folder a ``python -m bench.zoo_policy ... --save DIR`` training wrote (``weights.pt``
and ``policy.json``: the version it chose on its selection seeds, digest-checked), copies the
weights byte for byte to ``esper_core/tamiyo/policies/<name>.pt`` and their provenance (commit,
zoo, members, seeds, selection results, the command) to ``<name>.json``, then prints the SHA-256
to pin in ``esper_core.tamiyo.shipped.SHIPPED``; ``--pin`` writes it there.

    python -m bench.zoo_policy --members 14 --demonstrations 2 --iterations 3 --rollouts 2 \\
        --save baselines/zoo/trainings/NAME --json baselines/zoo/trainings/NAME/training.json
    python -m bench.ship_policy --from baselines/zoo/trainings/NAME --name zoo-1 --pin
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from esper_core.studies.policy_files import read_policy_file
from esper_core.tamiyo import shipped as shipped_module

_SHIPPED_PY = Path(shipped_module.__file__)


def provenance_of(descriptor: dict[str, Any], *, name: str) -> dict[str, Any]:
    """What ``<name>.json`` records: how the weights were trained and why this version.

    Serving reads ``gnn``, ``policy_format``, ``feature_dims`` and ``graph_features`` (a policy
    trained on other graph inputs is refused); ``esper policy show`` prints the rest.
    """
    trained = descriptor["provenance"]
    scores = {s["label"]: s for s in descriptor["selection"]}
    return {
        "name": name,
        "commit": descriptor["commit"],
        "command": descriptor["command"],
        "trained_version": descriptor["source_version"],
        "method": descriptor["method"],
        "gnn": descriptor["gnn"],
        "policy_format": trained["policy_format"],
        "feature_dims": descriptor["feature_dims"],
        "graph_features": trained["graph_features"],
        "zoo": descriptor.get("zoo"),
        "plan": descriptor.get("plan"),
        "seeds": descriptor.get("seeds"),
        "flops_penalty": descriptor.get("flops_penalty"),
        "members": descriptor["members"],
        "selection": {
            "chosen": scores[descriptor["chosen_label"]],
            "heuristic": scores["heuristic"],
            "none": scores["none"],
            "versions": [v for label, v in scores.items() if label.startswith("v")],
        },
        "wall_s": descriptor["wall_s"],
    }


def ship(source: Path, *, name: str, directory: Path) -> tuple[str, Path]:
    """Write ``<name>.pt`` and ``<name>.json`` into ``directory``; returns the weights' SHA-256 and path.

    Raises:
        FileNotFoundError, ValueError: ``source`` is not a ``--save`` folder, or its weights are not
            the bytes it recorded, or were trained on other graph inputs (``read_policy_file``).
    """
    data, descriptor = read_policy_file(source)
    record = provenance_of(descriptor, name=name)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pt").write_bytes(data)
    (directory / f"{name}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return descriptor["sha256"], directory / f"{name}.pt"


def pin(name: str, digest: str) -> None:
    """Write ``name``'s digest into ``SHIPPED`` (an existing entry; a new name is added by hand)."""
    text = _SHIPPED_PY.read_text()
    entry = re.compile(rf'(\n    "{re.escape(name)}": ")[0-9a-f]{{64}}(",)')
    if not entry.search(text):
        raise SystemExit(
            f'{name!r} is not in SHIPPED in {_SHIPPED_PY}: add the line `"{name}": "{digest}",` there and the '
            "name to esper_cli/choices.py (SHIPPED_POLICIES, PINNABLE_POLICIES)"
        )
    _SHIPPED_PY.write_text(entry.sub(rf"\g<1>{digest}\g<2>", text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from", dest="source", type=Path, required=True, help="a folder written by bench.zoo_policy --save"
    )
    parser.add_argument("--name", default=shipped_module.DEFAULT_SHIPPED, help="the shipped policy's name")
    parser.add_argument("--pin", action="store_true", help="also write the digest into SHIPPED")
    parser.add_argument(
        "--dir", type=Path, default=shipped_module.POLICY_DIR, help="where to write (default: the package's)"
    )
    args = parser.parse_args()
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,31}", args.name):
        raise SystemExit(f"--name {args.name!r}: use 1-32 lower-case letters, digits, '.' or '-', e.g. zoo-2")
    try:
        digest, path = ship(args.source, name=args.name, directory=args.dir)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"ship_policy: {e}") from e
    print(f"wrote {path} and {path.with_suffix('.json')}")
    print(f'pin in {_SHIPPED_PY}:  "{args.name}": "{digest}",')
    if args.pin:
        pin(args.name, digest)
        print(f"pinned {args.name} in {_SHIPPED_PY}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
