"""promtool on infra/prometheus: the config and rules load, and the rules' unit tests pass.

CI installs promtool (Debian's ``prometheus`` package, see ``.ci/run``) and fails here if it is
missing; elsewhere the test is skipped with the install command.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.infra.tools import require_tool

PROMETHEUS = Path(__file__).resolve().parents[2] / "infra" / "prometheus"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))


def _promtool(*args: str) -> str:
    promtool = require_tool("promtool", apt_package="prometheus")
    done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed:\n{output}"
    return output


def test_promtool_checks_the_config_and_its_rule_files() -> None:
    out = _promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert "SUCCESS" in out and "rule files found" in out


def test_promtool_checks_the_rules() -> None:
    out = _promtool("check", "rules", *map(str, sorted((PROMETHEUS / "rules").glob("*.yml"))))
    assert "SUCCESS" in out


def test_there_are_rule_unit_tests_for_every_alert() -> None:
    import yaml

    tested = {
        case["alertname"]
        for path in RULE_TESTS
        for group in yaml.safe_load(path.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    rules = yaml.safe_load((PROMETHEUS / "rules" / "esper.rules.yml").read_text())["groups"]
    alerts = {rule["alert"] for group in rules for rule in group["rules"] if "alert" in rule}
    assert alerts - tested == set(), "alerts without a promtool test that fires them"


@pytest.mark.parametrize("rule_test", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_unit_tests_pass(rule_test: Path) -> None:
    assert "SUCCESS" in _promtool("test", "rules", str(rule_test))
