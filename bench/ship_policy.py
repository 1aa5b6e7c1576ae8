"""ship_policy: put a zoo training's chosen policy into Esper's package, with its provenance.

Reads the JSON of a ``python -m bench.zoo_policy ... --home DIR --json OUT`` training, loads the
version it chose on its selection seeds from that training's registry (signature verified with
that registry's key), and writes ``esper_core/tamiyo/policies/<name>.pt`` (the ``state_dict``)
and ``<name>.json`` (commit, zoo, members, seeds, selection results, the command), then prints
the SHA-256 to pin in ``esper_core.tamiyo.shipped.SHIPPED``; ``--pin`` writes it there.

    python -m bench.zoo_policy --members 14 --demonstrations 2 --iterations 3 --rollouts 2 \\
        --workers 2 --home /tmp/zoo-train --json /tmp/zoo-train.json
    python -m bench.ship_policy --from /tmp/zoo-train.json --name zoo-1 --commit <training commit> --pin
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from esper_core.simic.records import PolicyVersion, SimicStore
from esper_core.tamiyo import shipped as shipped_module

_SHIPPED_PY = Path(shipped_module.__file__)


def provenance_of(training: dict[str, Any], policy: PolicyVersion, *, name: str, commit: str) -> dict[str, Any]:
    """What ``<name>.json`` records: how the weights were trained and why this version."""
    scores = {s["label"]: s for s in training["selection"]}
    return {
        "name": name,
        "commit": commit,
        "command": training["command"],
        "trained_version": policy.version,
        "method": policy.method,
        "parent_version": policy.parent_version,
        "gnn": dataclasses.asdict(policy.gnn),
        "policy_format": policy.provenance["policy_format"],
        "feature_dims": policy.feature_dims,
        "graph_features": policy.provenance["graph_features"],
        "flops_penalty": training["flops_penalty"],
        "zoo": training.get("zoo"),
        "members": training["members"],
        "exclude_families": training.get("exclude_families", []),
        "plan": training.get("plan"),
        "seeds": training["seeds"],
        "selection": {
            "chosen": scores[f"v{training['chosen']}"],
            "heuristic": scores["heuristic"],
            "none": scores["none"],
            "versions": [scores[f"v{v}"] for v in training["versions"]],
        },
        "wall_s": training["wall_s"],
        "load_1m": training["load_1m"],
    }


def ship(training_json: Path, *, name: str, commit: str, directory: Path) -> tuple[str, Path]:
    """Write ``<name>.pt`` and ``<name>.json`` into ``directory``; returns the weights' SHA-256 and path.

    Raises:
        SystemExit: The training kept no registry (run it with ``--home``).
    """
    training = json.loads(training_json.read_text())
    home = training.get("home")
    if home is None:
        raise SystemExit(f"{training_json} kept no registry: train with python -m bench.zoo_policy ... --home DIR")
    # Verified with that registry's own key (its signing.key, unless ESPER_SIGNING_KEY is set).
    store = SimicStore.open(Path(home))
    try:
        policy = store.get_policy(int(training["chosen"]))
        weights = store.load_weights(policy)
    finally:
        store.close()
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in sorted(weights.items())}, buffer)
    data = buffer.getvalue()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pt").write_bytes(data)
    record = provenance_of(training, policy, name=name, commit=commit)
    (directory / f"{name}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return hashlib.sha256(data).hexdigest(), directory / f"{name}.pt"


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


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, required=True, help="a bench.zoo_policy --json output")
    parser.add_argument("--name", default=shipped_module.DEFAULT_SHIPPED, help="the shipped policy's name")
    parser.add_argument("--commit", default=None, help="the commit the training ran at (default: HEAD now)")
    parser.add_argument("--pin", action="store_true", help="also write the digest into SHIPPED")
    parser.add_argument(
        "--dir", type=Path, default=shipped_module.POLICY_DIR, help="where to write (default: the package's)"
    )
    args = parser.parse_args()
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,31}", args.name):
        raise SystemExit(f"--name {args.name!r}: use 1-32 lower-case letters, digits, '.' or '-', e.g. zoo-2")
    digest, path = ship(args.source, name=args.name, commit=args.commit or _head(), directory=args.dir)
    print(f"wrote {path} and {path.with_suffix('.json')}")
    print(f'pin in {_SHIPPED_PY}:  "{args.name}": "{digest}",')
    if args.pin:
        pin(args.name, digest)
        print(f"pinned {args.name} in {_SHIPPED_PY}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
