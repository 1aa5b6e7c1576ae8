"""infra/: alert rules and the Grafana dashboard name only series Esper emits; the compose file holds together."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from esper_core.telemetry.catalog import EVENTS_SERIES, SOURCES, alerting, event_names, exposed_series
from esper_core.telemetry.push import DEFAULT_LINGER_S

INFRA = Path(__file__).resolve().parents[2] / "infra"
SERIES_RE = re.compile(r"\besper_[a-z0-9_]+")
# A PromQL matcher on one label: name="x", name=~"a|b", source="kasmina".
MATCHER_RE = re.compile(r'\b(name|source)\s*(=~|=)\s*"([^"]*)"')


def _rules() -> list[dict]:
    groups = yaml.safe_load((INFRA / "prometheus" / "rules" / "esper.rules.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard() -> dict:
    return json.loads((INFRA / "grafana" / "dashboards" / "esper.json").read_text())


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def _check(expr: str) -> None:
    series = exposed_series()
    for name in SERIES_RE.findall(expr):
        assert name in series, f"{expr!r} names {name}, which Esper does not expose (esper_core/telemetry/catalog.py)"
    for label, op, value in MATCHER_RE.findall(expr):
        values = value.split("|") if op == "=~" else [value]
        known = event_names() if label == "name" else frozenset(SOURCES)
        for v in values:
            assert v in known, f"{expr!r} matches {label}={v!r}, which no Esper {label} has"
        if label == "name":
            assert EVENTS_SERIES in expr, f"{expr!r}: event names are labels of {EVENTS_SERIES}"


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_alert_rule_names_only_emitted_series(rule: dict) -> None:
    _check(rule["expr"])
    assert rule["labels"]["severity"] in {"info", "warning", "critical"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_rules_cover_the_seeds_alerts() -> None:
    exprs = " ".join(r["expr"] for r in _rules())
    for needle in (
        'esper_tolaria_training_latency_seconds_bucket{workload="seed-reference"}',
        ") > 0.018",
        "esper_telemetry_last_packet_timestamp_seconds",
        "tolaria.compile_fallback",
        "tolaria.graph_fallback",
        "esper_tamiyo_gnn_compile_fallback_total",
        "esper_tolaria_rollback_deadline_exceeded_total",
        "esper_tolaria_timeout_tamiyo_total",
        "esper_tolaria_timeout_kasmina_total",
    ):
        assert needle in exprs, needle


def test_dashboard_names_only_emitted_series_and_covers_every_subsystem() -> None:
    exprs = _dashboard_exprs()
    assert exprs
    for expr in exprs:
        _check(expr)
    rows = {p["title"].split(":")[0] for p in _dashboard()["panels"] if p["type"] == "row"}
    assert rows >= {"Tolaria", "Kasmina", "Tamiyo", "Tezzeret", "Urza"}
    joined = " ".join(exprs)
    for subsystem in ("tolaria", "kasmina", "tamiyo", "tezzeret", "urza"):
        assert f"esper_{subsystem}_" in joined, subsystem


def test_dashboard_panels_use_the_provisioned_datasource() -> None:
    datasource = yaml.safe_load((INFRA / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    for panel in _dashboard()["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid, panel["title"]
    ids = [p["id"] for p in _dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_prometheus_config_loads_the_rules_and_scrapes_esper() -> None:
    config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert (INFRA / "prometheus" / rule_file).is_file(), rule_file
    targets = {t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"127.0.0.1:9464", "127.0.0.1:9091"}


def test_compose_starts_the_stack_on_loopback_with_the_pinned_prefect() -> None:
    compose = yaml.safe_load((INFRA / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) >= {"postgres", "prefect-server", "prometheus", "grafana"}
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (INFRA / source).exists(), f"{name} mounts missing {source}"
    prefect = services["prefect-server"]
    # The server image runs the Prefect release the project was tested with: the requirement's floor.
    requirement = re.search(r'"prefect(?:==|>=)([0-9.]+)[",]', (INFRA.parent / "pyproject.toml").read_text())
    assert requirement is not None, "pyproject.toml must require prefect==X or prefect>=X,<Y"
    assert prefect["image"].startswith(f"prefecthq/prefect:{requirement.group(1)}-")
    assert prefect["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    assert prefect["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_event_and_counter_alerts_watch_series_the_sink_creates_at_zero() -> None:
    # increase(...) > 0 only sees a first occurrence on a series that existed at 0 before it.
    zero = {e.name for e in alerting()} | {e.prometheus for e in alerting()}
    for rule in _rules():
        if "increase(" not in rule["expr"]:
            continue
        matchers = MATCHER_RE.findall(rule["expr"])
        names = {v for label, _, value in matchers if label == "name" for v in value.split("|")}
        series = set(SERIES_RE.findall(rule["expr"])) - {EVENTS_SERIES}
        assert (names | series) <= zero, f"{rule['alert']}: mark {sorted((names | series) - zero)} alerting"


def test_rules_group_by_workload_and_latencies_are_histograms() -> None:
    for rule in _rules():
        expr = rule["expr"]
        assert "_ms" not in expr, f"{rule['alert']}: use the *_seconds histogram, not the ms gauge"
        if rule["alert"] != "EsperRunSilent":  # that one is about a process, whatever it runs
            assert "workload" in expr, f"{rule['alert']}: group by workload"
    exprs = _dashboard_exprs()
    assert not [e for e in exprs if re.search(r"esper_\w+_ms\b", e)], "dashboard latencies come from histograms"
    assert sum("histogram_quantile(" in e for e in exprs) >= 10
    assert all('workload=~"$workload"' in e for e in exprs)
    (variable,) = _dashboard()["templating"]["list"]
    assert variable["name"] == "workload" and variable["allValue"] == ".*"  # .* also matches workload=""


def test_pushed_groups_linger_longer_than_prometheus_scrapes_them() -> None:
    config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "pushgateway"]
    interval = job.get("scrape_interval", config["global"]["scrape_interval"])
    assert interval.endswith("s") and float(interval[:-1]) < DEFAULT_LINGER_S
