"""The example Grafana dashboard and Prometheus alert rules in deploy/ hold together.

Both files are loaded by their structure (Grafana's dashboard JSON model: panels on the 24-column
grid, each with targets; Prometheus' rule-file YAML: groups of rules with alert, expr, for,
labels, annotations), every PromQL expression is parsed by a real PromQL parser
(``promql-parser``), and every metric it selects must be one that a live daemon's /metrics
exports (or ``up``, which Prometheus itself writes for each scrape), with label names that
metric has. ``promtool`` is not used: it is not available here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.daemon import Daemon, Launch, http_get, make_repository, sample
from tests.support.paths import REPO
from vkserve.client import Client, NotFound
from vkserve.daemon.metrics import FAMILIES, MetricType

DASHBOARD = REPO / "deploy" / "grafana" / "vkserve.json"
ALERTS = REPO / "deploy" / "prometheus" / "vkserve-alerts.yml"
PROMETHEUS = REPO / "deploy" / "prometheus" / "prometheus.yml"
#: Labels Prometheus adds to every scraped series, and the one series it writes itself.
TARGET_LABELS = {"instance", "job"}
PROMETHEUS_SERIES = {"up": set()}
#: Grafana's built-in interval variables, as a PromQL duration for parsing.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "state-timeline"}
GRID_COLUMNS = 24
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class Exported:
    """What a live daemon's /metrics offers: sample name -> its label names."""

    series: dict[str, set[str]]

    def check(self, expr: str, where: str) -> set[str]:
        """Parse ``expr`` and check every selector in it; returns the metric names."""
        try:
            ast = promql_parser.parse(expr)
        except ValueError as exc:
            raise AssertionError(f"{where}: not valid PromQL: {exc}\n{expr}") from None
        names = set()
        for selector in _selectors(ast):
            assert selector.name, f"{where}: a selector without a metric name: {expr}"
            assert selector.name in self.series, (
                f"{where}: {selector.name} is not exported by the daemon (nor written by Prometheus)")
            labels = {m.name for m in selector.matchers.matchers}
            unknown = labels - self.series[selector.name] - TARGET_LABELS
            assert not unknown, f"{where}: {selector.name} has no label(s) {sorted(unknown)}"
            names.add(selector.name)
        for grouping in _groupings(ast):
            unknown = grouping - set().union(*(self.series[n] for n in names)) - TARGET_LABELS
            assert not unknown, f"{where}: grouping by label(s) {sorted(unknown)} that {sorted(names)} lack"
        return names


def _children(node: object) -> Iterator[object]:
    if isinstance(node, promql_parser.BinaryExpr):
        yield from (node.lhs, node.rhs)
    elif isinstance(node, promql_parser.AggregateExpr):
        yield node.expr
        if node.param is not None:
            yield node.param
    elif isinstance(node, promql_parser.Call):
        yield from node.args
    elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr,
                           promql_parser.SubqueryExpr)):
        yield node.expr
    elif isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector


def _walk(node: object) -> Iterator[object]:
    yield node
    for child in _children(node):
        yield from _walk(child)


def _selectors(ast: object) -> Iterator[promql_parser.VectorSelector]:
    return (n for n in _walk(ast) if isinstance(n, promql_parser.VectorSelector))


def _groupings(ast: object) -> Iterator[set[str]]:
    """The label lists of ``by (...)`` clauses."""
    for node in _walk(ast):
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            modifier = node.modifier
            if isinstance(modifier, promql_parser.AggModifier) and \
                    modifier.type == promql_parser.AggModifierType.By:
                yield set(modifier.labels)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, launch_module_daemon: Launch) -> Exported:
    """The families of a live daemon that served requests (one ok, one for a model it lacks)."""
    work = tmp_path_factory.mktemp("monitoring")
    repo = make_repository(work / "repo", slow=False)
    daemon: Daemon = launch_module_daemon(work, f"""
[server]
socket = "{work}/d.sock"
[models]
repository = "{repo}"
""")
    with Client.connect(f"unix:{daemon.socket}") as c:
        assert int(np.argmax(c.infer("digits", {"data": sample(3)})["prob"])) == 3
        with pytest.raises(NotFound):
            c.infer("no-such-model", {"data": sample(3)})
    assert daemon.metrics_port is not None
    status, text = http_get(daemon.metrics_port, "/metrics")
    assert status == 200
    series: dict[str, set[str]] = dict(PROMETHEUS_SERIES)
    for family in text_string_to_metric_families(text):
        names = {"counter": [f"{family.name}_total"],
                 "histogram": [f"{family.name}_{s}" for s in ("bucket", "sum", "count")]
                 }.get(family.type, [family.name])
        labels = {k for s in family.samples for k in s.labels}
        for name in names:
            series[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    # a family without samples now (no GPU problem here) still has its defined labels
    for f in FAMILIES:
        for name in (f"{f.name}_bucket", f"{f.name}_sum", f"{f.name}_count") \
                if f.type is MetricType.HISTOGRAM else (f.name,):
            assert name in series, f"the live daemon does not export {name}"
            series[name] |= set(f.labels)
    return Exported(series)


# ------------------------------------------------------------------------------ Grafana


def _grafana_expr(expr: str) -> str:
    """A panel's query with Grafana's interval variables as durations (``$instance`` and the
    like only appear inside label-matcher strings, where PromQL takes them as text)."""
    for variable, duration in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, duration)
    return expr


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_is_a_grafana_dashboard(dashboard: dict) -> None:
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list),
                      ("templating", dict), ("time", dict), ("tags", list)):
        assert isinstance(dashboard.get(key), kind), f"dashboard: '{key}' must be a {kind.__name__}"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["schemaVersion"] >= 36  # the datasource-object form of panels
    assert {"from", "to"} <= dashboard["time"].keys()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(type(i) is int for i in ids), "panel ids must be unique ints"
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard["panels"]:
        where = f"panel {p['id']} ({p.get('title')!r})"
        assert p["type"] in PANEL_TYPES, f"{where}: unknown type {p['type']!r}"
        assert isinstance(p.get("title"), str) and p["title"], f"{where}: needs a title"
        grid = p["gridPos"]
        assert all(type(grid[k]) is int for k in "xywh"), f"{where}: gridPos needs x, y, w, h"
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= GRID_COLUMNS and grid["h"] > 0 and grid["y"] >= 0
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{where} overlaps {cells[(x, y)]}"
                cells[(x, y)] = where
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert p["targets"], f"{where}: no targets"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{where}: refIds repeat"
        assert isinstance(p["fieldConfig"]["defaults"], dict) and isinstance(p["options"], dict)


def test_dashboard_variables_are_defined_and_query_exported_metrics(dashboard: dict,
                                                                    exported: Exported) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, var in variables.items():
        if var["type"] != "query":
            continue
        query = var["query"]["query"]
        match = re.fullmatch(r"label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)", query)
        assert match, f"variable {name}: expected label_values(SELECTOR, LABEL), got {query!r}"
        (metric,) = exported.check(match[1], f"variable {name}")
        assert match[2] in exported.series[metric] | TARGET_LABELS, f"variable {name}: {metric} has no {match[2]}"
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", json.dumps(dashboard["panels"])))
    assert used - {"__rate_interval", "__interval", "__range"} <= variables.keys()


def test_dashboard_queries_use_only_exported_metrics(dashboard: dict, exported: Exported) -> None:
    used: set[str] = set()
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            where = f"panel {p['title']!r} target {t['refId']}"
            used |= exported.check(_grafana_expr(t["expr"]), where)
            legend = set(re.findall(r"\{\{\s*([A-Za-z_]+)\s*\}\}", t.get("legendFormat", "")))
            labels = set().union(*(exported.series[n] for n in used)) | TARGET_LABELS
            assert legend <= labels, f"{where}: legend names labels {sorted(legend - labels)}"
    # what the dashboard is for: each of these is on it
    for metric in ("vkserve_requests_total", "vkserve_request_duration_seconds_bucket",
                   "vkserve_queued_requests", "vkserve_rejected_requests_total",
                   "vkserve_model_ready", "vkserve_device_healthy", "vkserve_request_batch_size_bucket",
                   "vkserve_in_flight_requests"):
        assert metric in used, f"the dashboard shows nothing of {metric}"
    quantiles = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])
                 if "histogram_quantile" in t["expr"] and "vkserve_request_duration_seconds" in t["expr"]]
    assert {re.search(r"histogram_quantile\(([0-9.]+)", e)[1] for e in quantiles} >= {"0.5", "0.99"}


# ------------------------------------------------------------------------------ Prometheus


@pytest.fixture(scope="module")
def rules() -> dict:
    return yaml.safe_load(ALERTS.read_text())


def test_alert_rules_are_a_prometheus_rule_file(rules: dict) -> None:
    assert set(rules) == {"groups"} and isinstance(rules["groups"], list) and rules["groups"]
    names = [g["name"] for g in rules["groups"]]
    assert len(names) == len(set(names)), "group names must be unique"
    alerts = []
    for group in rules["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["rules"], group["name"]
        for rule in group["rules"]:
            where = f"group {group['name']} rule {rule.get('alert')!r}"
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, where
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]), where
            assert isinstance(rule["expr"], str) and rule["expr"].strip(), where
            assert DURATION.match(rule["for"]), f"{where}: 'for' is not a duration"
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in rule["labels"].items()), where
            assert rule["labels"]["severity"] in ("critical", "warning"), where
            assert {"summary", "description"} <= rule["annotations"].keys(), where
            alerts.append(rule["alert"])
    assert len(alerts) == len(set(alerts)), "alert names must be unique"


def test_alert_rules_use_only_exported_metrics(rules: dict, exported: Exported) -> None:
    by_alert: dict[str, set[str]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            names = exported.check(rule["expr"], f"alert {rule['alert']}")
            by_alert[rule["alert"]] = names
            labels = set().union(*(exported.series[n] for n in names)) | TARGET_LABELS
            templated = set(re.findall(r"\$labels\.([A-Za-z_]+)", json.dumps(rule["annotations"])))
            assert templated <= labels, f"alert {rule['alert']}: annotations name {sorted(templated - labels)}"
    # the alerts an operator needs: daemon down, model not ready, errors, saturation, p99
    assert by_alert["VkserveDown"] == {"up"}
    assert "vkserve_model_ready" in by_alert["VkserveModelNotReady"]
    assert "vkserve_requests_total" in by_alert["VkserveHighErrorRate"]
    assert {"vkserve_queued_requests", "vkserve_queue_limit_requests"} <= by_alert["VkserveQueueSaturated"]
    assert "vkserve_request_duration_seconds_bucket" in by_alert["VkserveHighLatencyP99"]


def test_example_prometheus_config_scrapes_the_job_the_alerts_name() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    for rule_file in config["rule_files"]:
        assert (PROMETHEUS.parent / rule_file).is_file(), rule_file
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["vkserve"]["static_configs"][0]["targets"] == ["127.0.0.1:9464"]  # the default listen
    assert 'job="vkserve"' in ALERTS.read_text()

