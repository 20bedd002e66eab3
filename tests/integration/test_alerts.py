"""config/monitoring: the alerts fire on trouble, stay silent when healthy, read real metrics.

The PrometheusRule's rule groups are taken from the file as shipped (its `spec`) at test time, so
promtool checks and unit-tests exactly what `kubectl apply` would install. The prometheus-operator
CRDs are not installed in the test control plane, so these objects are checked here instead of by
the API server's dry run in test_manifests.py.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.service import running
from tests.markdown import anchors

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
MONITORING = CONFIG / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
UNIT_TESTS = REPO / "tests" / "alerts" / "slo-api.test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"

# Metrics the alerts read that slo-api does not export, and who does.
EXTERNAL = {
    "up": "Prometheus, for every scrape target",
    "kube_deployment_spec_replicas": "kube-state-metrics",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "kube_pod_container_resource_limits": "kube-state-metrics",
    "container_memory_working_set_bytes": "the kubelet (cAdvisor)",
}
# The runbook_url base as shipped: absolute, and a reserved name (RFC 2606) until an overlay
# says where docs/runbook.md is browsable.
PLACEHOLDER = "https://slo-api-runbooks.invalid/docs/runbook.md"
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
}

Obj = dict[str, Any]


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make test-tools` installs Debian's prometheus package")
    return found


def _rule_groups() -> Obj:
    docs = [d for d in yaml.safe_load_all(RULES.read_text()) if d]
    assert [d["kind"] for d in docs] == ["PrometheusRule"]
    spec: Obj = docs[0]["spec"]
    return spec


def _alerts() -> dict[str, Obj]:
    rules = [r for group in _rule_groups()["groups"] for r in group["rules"]]
    assert all("alert" in r for r in rules), "recording rules need tests of their own"
    return {r["alert"]: r for r in rules}


def _write_rules(directory: Path, groups: Obj) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


# -- promtool -----------------------------------------------------------------------------------


def test_promtool_accepts_the_rule_groups_as_shipped(tmp_path: Path) -> None:
    rules = _write_rules(tmp_path, _rule_groups())
    checked = _run([_promtool(), "check", "rules", str(rules)], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


_LABEL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def _render(template: str, labels: dict[str, str]) -> str:
    """The annotation as Prometheus renders it, for templates that only read $labels."""
    rendered = _LABEL.sub(lambda m: labels[m[1]], template)
    assert "{{" not in rendered, f"a template the test cannot render: {template!r}"
    return rendered


def _unit_tests(alerts: dict[str, Obj]) -> Obj:
    """The promtool test file, each expected alert's annotations filled from its rule."""
    tests: Obj = yaml.safe_load(UNIT_TESTS.read_text())
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            rule = alerts[check["alertname"]]
            for expected in check["exp_alerts"]:
                labels = {str(k): str(v) for k, v in expected["exp_labels"].items()}
                assert labels.get("severity") == rule["labels"]["severity"]
                expected["exp_annotations"] = {
                    k: _render(v, labels) for k, v in rule["annotations"].items()
                }
    return tests


def _promtool_test(directory: Path, groups: Obj, tests: Obj) -> subprocess.CompletedProcess[str]:
    _write_rules(directory, groups)
    (directory / UNIT_TESTS.name).write_text(yaml.safe_dump(tests, sort_keys=False))
    return _run([_promtool(), "test", "rules", UNIT_TESTS.name], directory)


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, set[str]] = {name: set() for name in _alerts()}
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            cases[check["alertname"]].add("fires" if check["exp_alerts"] else "silent")
    assert {name: found for name, found in cases.items() if found != {"fires", "silent"}} == {}


def test_each_alert_fires_on_trouble_and_stays_silent_when_healthy(tmp_path: Path) -> None:
    alerts = _alerts()
    result = _promtool_test(tmp_path, _rule_groups(), _unit_tests(alerts))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("alert", sorted(_alerts()))
def test_the_unit_tests_catch_an_alert_that_never_fires(tmp_path: Path, alert: str) -> None:
    """The harness can fail: with one alert's expression never true, its firing case fails."""
    groups = copy.deepcopy(_rule_groups())
    for group in groups["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["expr"] = "vector(1) == 0"
    result = _promtool_test(tmp_path, groups, _unit_tests(_alerts()))
    assert result.returncode != 0
    assert f"alertname: {alert}," in result.stdout + result.stderr


# -- what an operator reads ---------------------------------------------------------------------


def test_each_alert_has_a_summary_a_description_and_a_runbook_section() -> None:
    sections = anchors(RUNBOOK.read_text())
    for name, rule in _alerts().items():
        annotations = rule["annotations"]
        assert annotations.get("summary"), name
        assert annotations.get("description"), name
        assert annotations.get("runbook_url") == f"{PLACEHOLDER}#{name.lower()}", name
        assert name.lower() in sections, f"docs/runbook.md has no section {name}"
        assert rule["labels"]["severity"] in ("warning", "critical"), name


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (enough PromQL for these rules)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        if not match[2] and match[1].lower() not in PROMQL_WORDS:
            names.add(match[1])
    return names


def test_the_metric_name_reader_sees_through_promql() -> None:
    expr = (
        'sum by (namespace) (rate(a_total{job="x", code=~"5..|b_c"}[5m])) / on (pod) '
        'group_left max(b_bucket) > 0.05 and (c == 1) or absent(up{job="y"} == 1) offset 5m'
    )
    assert _metric_names(expr) == {"a_total", "b_bucket", "c", "up"}


def _exported(exposition: str) -> set[str]:
    """Every series name the exposition declares, including metrics with no sample yet."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names |= {sample.name for sample in family.samples}
        base = family.name
        names |= {base + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


async def test_every_metric_an_alert_reads_is_one_slo_api_exports(
    slo_api_kubeconfig: Path, tmp_path: Path
) -> None:
    # With every optional source of metrics on: the tokens file's gauges exist only with one.
    tokens = tmp_path / "tokens"
    tokens.write_text("a-read-token-of-16 read\n")
    async with running(slo_api_kubeconfig, slo_api_tokens_file=tokens) as service:
        response = await service.get("/metrics")
    assert response.status_code == 200
    exported = _exported(response.text)
    # A labelled metric with no sample yet still declares itself; the per-kind gauges have one.
    assert "slo_api_http_request_duration_seconds_bucket" in exported
    assert "slo_api_kind_synced" in exported

    read = set().union(*(_metric_names(rule["expr"]) for rule in _alerts().values()))
    assert {"slo_api_kind_synced", "slo_api_http_requests_total"} <= read
    unknown = {name for name in read - exported if name not in EXTERNAL}
    assert unknown == set(), f"alerts read metrics nobody exports: {sorted(unknown)}"


# -- the component ------------------------------------------------------------------------------


def _load(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_monitoring_is_an_optional_component_left_out_of_apply_k() -> None:
    component = _load(MONITORING / "kustomization.yaml")[0]
    assert component["kind"] == "Component"
    assert component["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
    top = _load(CONFIG / "kustomization.yaml")[0]
    assert "monitoring" not in top.get("resources", [])
    assert "monitoring" not in top.get("components", [])


def test_the_servicemonitor_scrapes_the_service_pods_metrics() -> None:
    monitor = _load(MONITORING / "servicemonitor.yaml")[0]
    service = next(d for d in _load(CONFIG / "manager" / "service.yaml") if d["kind"] == "Service")
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
    # Prometheus names the job after the Service; the alerts select on it.
    jobs = {m for r in _alerts().values() for m in re.findall(r'job="([^"]+)"', r["expr"])}
    assert jobs == {service["metadata"]["name"]}
    rule = _load(RULES)[0]
    assert rule["metadata"]["namespace"] == service["metadata"]["namespace"]


RUNBOOKS = "https://git.example.com/platform/slo-api/blob/v0.1.0/docs/runbook.md"


def _render_overlay(tmp_path: Path, runbooks: str | None) -> subprocess.CompletedProcess[str]:
    """An operator's overlay as the component's header shows it, with `runbooks` as the url."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    kustomization: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG, overlay)],
        "components": [os.path.relpath(MONITORING, overlay)],
    }
    if runbooks is not None:
        kustomization["configMapGenerator"] = [
            {
                "name": "slo-api-runbooks",
                "literals": [f"url={runbooks}"],
                "options": {
                    "disableNameSuffixHash": True,
                    "annotations": {"config.kubernetes.io/local-config": "true"},
                },
            }
        ]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return subprocess.run(
        ["kubectl", "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_an_overlay_with_the_component_renders_the_alerts_beside_the_service(
    tmp_path: Path,
) -> None:
    rendered = _render_overlay(tmp_path, RUNBOOKS)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"PrometheusRule", "ServiceMonitor", "Deployment", "Service"} <= kinds
    # The ConfigMap only carries the url into the build; nothing applies it.
    assert "ConfigMap" not in kinds
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    urls = {
        r["alert"]: r["annotations"]["runbook_url"]
        for group in rule["spec"]["groups"]
        for r in group["rules"]
    }
    assert urls == {name: f"{RUNBOOKS}#{name.lower()}" for name in _alerts()}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_an_overlay_that_does_not_say_where_the_runbook_is_does_not_build(
    tmp_path: Path,
) -> None:
    rendered = _render_overlay(tmp_path, None)
    assert rendered.returncode != 0
    assert "slo-api-runbooks" in rendered.stderr
