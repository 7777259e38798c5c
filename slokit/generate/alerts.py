"""Prometheus rule files generated from the SLO spec: SLO burn-rate alerts and symptom alerts.

Two files, built as Python objects and serialized once:

- ``<service>-slo.rules.yaml``: recording rules for each class's error ratio over every
  burn-rate window (sloth-style names, ``slokit:sli_error:ratio_rate5m``) on the SLI
  ``slokit_requests_total{class,replica,model,outcome}``, and for each class one
  multi-window multi-burn-rate alert per window pair (:mod:`slokit.generate.burnrate`).
- ``symptoms.rules.yaml``: alerts that mirror diagnostic rules (``kv_pressure``,
  ``queue_saturation``, ``telemetry_gap``, ``gpu_xid``, ``gpu_throttle``) on vLLM's,
  dcgm-exporter's and the sidecar's own series.

Every alert carries ``severity`` (``page`` or ``ticket``: the Alertmanager routing key),
``slokit_rule`` (the runbook id), and annotations ``summary`` (naming the numbers via
``$value``), ``description`` and ``runbook_url`` (``<base>/<rule>.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from slokit.analysis.slo_spec import SERVICE_NAME, SloClass, SloSpec
from slokit.errors import BadInput
from slokit.generate.burnrate import (
    BurnRatePlan,
    WindowPair,
    check_scale,
    parse_prom_duration,
    prom_duration,
)
from slokit.generate.promql import Labels, selector

SLI_METRIC = "slokit_requests_total"
GOOD_OUTCOME = "good"
#: Runbook of the SLO burn alerts (the diagnostic rules have one each, named by rule id).
SLO_BURN_RUNBOOK = "slo_burn"
DEFAULT_RUNBOOK_BASE_URL = "runbooks"
SYMPTOMS_FILE = "symptoms.rules.yaml"

#: XIDs that mean the GPU or its memory is unusable until reset: page, not ticket.
#: 48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC.
CRITICAL_XIDS: tuple[int, ...] = (48, 63, 64, 74, 79, 92, 94, 95)


@dataclass(frozen=True)
class SymptomThresholds:
    kv_usage_ratio: float = 0.9  # KV cache fuller than this ...
    preemptions_window_s: float = 300.0  # ... with preemptions in this window
    queue_waiting: int = 10  # at least this many waiting requests ...
    queue_window_s: float = 300.0  # ... throughout this window
    sm_clock_ratio: float = 0.8  # SM clock below this share of its recent maximum ...
    sm_clock_max_window_s: float = 86400.0  # ... the maximum over this window ...
    busy_util_percent: float = 50.0  # ... while the GPU is this busy
    for_s: float = 300.0  # how long a symptom must hold before it fires
    scrape_down_for_s: float = 120.0


@dataclass(frozen=True)
class AlertOptions:
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    scale: float = 1.0  # divide every window and `for` by this (tests)
    labels: Labels = field(default_factory=Labels)
    thresholds: SymptomThresholds = field(default_factory=SymptomThresholds)
    evaluation_interval: str | None = None  # group `interval`; None: Prometheus' global

    def __post_init__(self) -> None:
        check_scale(self.scale)
        if self.evaluation_interval is not None:
            parse_prom_duration(self.evaluation_interval, "evaluation interval")

    def runbook_url(self, rule: str) -> str:
        return f"{self.runbook_base_url.rstrip('/')}/{rule}.md"

    def duration(self, seconds: float) -> str:
        return prom_duration(seconds / self.scale)


def _num(x: float) -> str:
    """A number as PromQL/human text: 14.4, 0.01, 6 (no float noise such as 0.010000000000000009)."""
    return f"{round(x, 10):.10g}"


def _percent(ratio: float) -> str:
    return f"{_num(ratio * 100)}%"


def ratio_record(window: str) -> str:
    return f"slokit:sli_error:ratio_rate{window}"


# ---- SLO: recording rules and burn-rate alerts ----------------------------------------


def error_ratio_rules(plan: BurnRatePlan) -> list[dict[str, Any]]:
    """One recording rule per window: each class's share of requests that were not good.

    A class without a single bad request has no bad series at all; ``or 0 * total`` makes
    its ratio 0 instead of absent.
    """
    rules = []
    bad = selector({"outcome": f"!={GOOD_OUTCOME}"})
    for window in plan.rate_windows():
        total = f"sum by (class) (rate({SLI_METRIC}[{window}]))"
        rules.append(
            {
                "record": ratio_record(window),
                "expr": (
                    f"(\n  sum by (class) (rate({SLI_METRIC}{bad}[{window}]))\n  or\n  0 * {total}\n)\n"
                    f"/\n"
                    f"{total}"
                ),
            }
        )
    return rules


def burn_alert(
    spec: SloSpec, cls: SloClass, w: WindowPair, plan: BurnRatePlan, opts: AlertOptions
) -> dict[str, Any]:
    budget = 1.0 - cls.objective
    factor = w.factor(spec.period_s)
    long_w, short_w = plan.duration(w.long_s), plan.duration(w.short_s)
    sel = selector({"class": "=" + cls.name})  # "=": a name is never read as an operator
    cond = f"> {_num(factor)}"
    expr = (
        f"(\n  {ratio_record(long_w)}{sel} / {_num(budget)} {cond}\n)\n"
        f"and\n"
        f"(\n  {ratio_record(short_w)}{sel} / {_num(budget)} {cond}\n)"
    )
    name = "SloErrorBudgetBurnPage" if w.severity == "page" else "SloErrorBudgetBurnTicket"
    return {
        "alert": name,
        "expr": expr,
        "labels": {
            "severity": w.severity,
            "slokit_rule": SLO_BURN_RUNBOOK,
            "service": spec.service,
            "class": cls.name,
            "long_window": long_w,
            "short_window": short_w,
        },
        "annotations": {
            "summary": (
                f"SLO class {cls.name} is burning its error budget at "
                f'{{{{ $value | printf "%.1f" }}}}x over {long_w} '
                f"({w.severity} above {_num(factor)}x, objective {_percent(cls.objective)})"
            ),
            "description": (
                f"{spec.service}/{cls.name}: more than {_num(factor)} times the allowed error "
                f"ratio ({_percent(budget)} of requests not good) over both {long_w} and "
                f"{short_w}. At this rate {_percent(w.budget_spent)} of the {spec.period} "
                f"error budget is gone in {long_w}. Not good = error, slow (missed a "
                f"good_when bound) or failed quality."
            ),
            "runbook_url": opts.runbook_url(SLO_BURN_RUNBOOK),
        },
    }


def slo_rule_file(
    spec: SloSpec, opts: AlertOptions, plan: BurnRatePlan | None = None
) -> dict[str, Any]:
    plan = plan or BurnRatePlan(period_s=spec.period_s, scale=opts.scale)
    # One group: Prometheus evaluates a group's rules in order, so every alert reads the
    # ratios recorded in the same evaluation (across groups it could read the previous one).
    alerts = [burn_alert(spec, c, w, plan, opts) for c in spec.classes for w in plan.windows]
    group: dict[str, Any] = {
        "name": f"slokit-slo-{spec.service}",
        "rules": error_ratio_rules(plan) + alerts,
    }
    if opts.evaluation_interval:
        group["interval"] = opts.evaluation_interval
    return {"groups": [group]}


# ---- symptoms: mirrors of the diagnostic rules ----------------------------------------


def _symptom(
    name: str,
    rule: str,
    severity: str,
    expr: str,
    for_: str,
    summary: str,
    description: str,
    opts: AlertOptions,
) -> dict[str, Any]:
    out: dict[str, Any] = {"alert": name, "expr": expr}
    if for_ != "0s":
        out["for"] = for_
    out["labels"] = {"severity": severity, "slokit_rule": rule}
    out["annotations"] = {
        "summary": summary,
        "description": description,
        "runbook_url": opts.runbook_url(rule),
    }
    return out


def symptom_alerts(opts: AlertOptions) -> list[dict[str, Any]]:
    t = opts.thresholds
    r, g = opts.labels.replica, opts.labels.gpu_replica
    by = f"by ({r}, model_name)"
    for_ = opts.duration(t.for_s) if t.for_s else "0s"
    pre_w = opts.duration(t.preemptions_window_s)
    q_w = opts.duration(t.queue_window_s)
    clock_w = opts.duration(t.sm_clock_max_window_s)
    host = "{{ with $labels.Hostname }}{{ . }}{{ else }}{{ $labels.hostname }}{{ end }}"
    gpu = f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on {host}, {g} {{{{ $labels.{g} }}}}"
    critical = "\nor ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in CRITICAL_XIDS)
    return [
        _symptom(
            "VllmKvCachePressure",
            "kv_pressure",
            "ticket",
            f"sum {by} (rate(vllm:num_preemptions_total[{pre_w}])) > 0\n"
            f"and on ({r}, model_name)\n"
            f"max {by} (vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc) > {_num(t.kv_usage_ratio)}",
            for_,
            f"KV cache above {_percent(t.kv_usage_ratio)} on {{{{ $labels.{r} }}}} "
            f'({{{{ $labels.model_name }}}}) with {{{{ $value | printf "%.2f" }}}} preemptions/s',
            "Running sequences are evicted and recomputed because the KV cache is full: "
            "TPOT and E2E rise and throughput falls. Fewer concurrent sequences "
            "(--max-num-seqs), shorter max_tokens, more KV memory, or another replica.",
            opts,
        ),
        _symptom(
            "VllmQueueSaturated",
            "queue_saturation",
            "ticket",
            f"min {by} (min_over_time(vllm:num_requests_waiting[{q_w}])) >= {t.queue_waiting}",
            for_,
            f"At least {{{{ $value }}}} requests have been waiting on {{{{ $labels.{r} }}}} "
            f"({{{{ $labels.model_name }}}}) for {q_w} without the queue draining "
            f"(threshold {t.queue_waiting})",
            "Requests arrive faster than the engine admits them: TTFT grows with queue "
            "time while TPOT stays flat. Add replicas, shed or rate-limit load, or raise "
            "the running batch if KV memory allows.",
            opts,
        ),
        _symptom(
            "PrometheusTargetDown",
            "telemetry_gap",
            "ticket",
            "up == 0",
            opts.duration(t.scrape_down_for_s),
            "Prometheus cannot scrape {{ $labels.job }} target {{ $labels.instance }} "
            f"(down for {opts.duration(t.scrape_down_for_s)})",
            "Dashboards and alerts that need this target's series are blind; a missing "
            "series does not mean a healthy one.",
            opts,
        ),
        _symptom(
            "SlokitSidecarScrapeFailing",
            "telemetry_gap",
            "ticket",
            "slokit_scrape_up == 0",
            opts.duration(t.scrape_down_for_s),
            "slokit sidecar cannot scrape {{ $labels.kind }} target {{ $labels.target }} "
            f"(replica {{{{ $labels.replica }}}}) for {opts.duration(t.scrape_down_for_s)}",
            "Diagnoses that need this source are withheld (telemetry_gap) until scrapes succeed again.",
            opts,
        ),
        _symptom(
            "GpuXidCritical",
            "gpu_xid",
            "page",
            critical,
            "0s",
            f"{gpu} reported XID {{{{ $value }}}}",
            "This XID leaves the GPU unusable or its memory untrustworthy until it is "
            "drained and reset; requests on this replica fail or hang.",
            opts,
        ),
        _symptom(
            "GpuXidError",
            "gpu_xid",
            "ticket",
            f"DCGM_FI_DEV_XID_ERRORS > 0\nunless\n(\n{critical}\n)",
            "0s",
            f"{gpu} reported XID {{{{ $value }}}}",
            "dcgm-exporter reports the last XID since it started; look it up in NVIDIA's "
            "XID catalogue and in the node's kernel log.",
            opts,
        ),
        _symptom(
            "GpuClockThrottled",
            "gpu_throttle",
            "ticket",
            f"DCGM_FI_DEV_SM_CLOCK / max_over_time(DCGM_FI_DEV_SM_CLOCK[{clock_w}]) < {_num(t.sm_clock_ratio)}\n"
            f"and\n"
            f"DCGM_FI_DEV_GPU_UTIL > {_num(t.busy_util_percent)}",
            for_,
            f"{gpu} runs its SM clock at {{{{ $value | humanizePercentage }}}} of its {clock_w} "
            f"maximum while busy (threshold {_percent(t.sm_clock_ratio)})",
            "A throttled GPU slows every step: power cap, thermal slowdown or a clock "
            "policy. Check DCGM power and temperature, cooling, and the application clocks.",
            opts,
        ),
    ]


def symptom_rule_file(opts: AlertOptions) -> dict[str, Any]:
    group: dict[str, Any] = {"name": "slokit-symptoms", "rules": symptom_alerts(opts)}
    if opts.evaluation_interval:
        group["interval"] = opts.evaluation_interval
    return {"groups": [group]}


# ---- Alertmanager ---------------------------------------------------------------------


def alertmanager_example() -> dict[str, Any]:
    """Routing by ``severity``: pages to the pager, tickets to the queue.

    A page mutes the ticket of the same rule, class and GPU (absent labels compare equal, so a
    burn-rate page mutes its class's burn-rate tickets).
    """
    return {
        "route": {
            "receiver": "ticket",
            "group_by": ["alertname", "service", "class", "slokit_rule"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {"matchers": ['severity="page"'], "receiver": "pager", "repeat_interval": "1h"},
                {"matchers": ['severity="ticket"'], "receiver": "ticket", "repeat_interval": "24h"},
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": ['severity="page"'],
                "target_matchers": ['severity="ticket"'],
                "equal": ["slokit_rule", "service", "class", "UUID"],
            }
        ],
        "receivers": [
            {
                "name": "pager",
                "pagerduty_configs": [{"routing_key": "<your PagerDuty integration key>"}],
            },
            {
                "name": "ticket",
                "webhook_configs": [
                    {
                        "url": "http://ticket-bridge.example.internal/alertmanager",
                        "send_resolved": True,
                    }
                ],
            },
        ],
    }


# ---- serialization --------------------------------------------------------------------


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (PromQL) as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_representer)


def dump_yaml(doc: dict[str, Any], header: str) -> str:
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + yaml.dump(
        doc, Dumper=_BlockDumper, sort_keys=False, width=4096, allow_unicode=True
    )


def header(what: str, source: str) -> str:
    return (
        f"{what}\n"
        f"Generated by slokit from {source}; do not edit. Regenerate with:\n"
        f"  slokit alerts build --slo {source}"
    )


def build_alert_files(spec: SloSpec, opts: AlertOptions) -> dict[str, str]:
    """File name -> YAML text, for every file ``slokit alerts build`` writes."""
    source = spec.source
    check_scale(opts.scale)
    # The loader allows only such names; a spec built in code must not escape --out either.
    if not SERVICE_NAME.fullmatch(spec.service):
        raise BadInput(f"service name {spec.service[:64]!r} cannot name a file")
    plan = BurnRatePlan(period_s=spec.period_s, scale=opts.scale)
    return {
        f"{spec.service}-slo.rules.yaml": dump_yaml(
            slo_rule_file(spec, opts, plan),
            header(
                f"SLO recording rules and burn-rate alerts for service {spec.service!r}.", source
            ),
        ),
        SYMPTOMS_FILE: dump_yaml(
            symptom_rule_file(opts),
            header("Symptom alerts mirroring slokit's diagnostic rules.", source),
        ),
        "alertmanager.example.yaml": dump_yaml(
            alertmanager_example(),
            "Example Alertmanager routing for slokit's alerts: severity=page -> pager,\n"
            "severity=ticket -> ticket queue. Generated by slokit; copy and adapt.",
        ),
    }


def write_alert_files(spec: SloSpec, out_dir: Path, opts: AlertOptions) -> list[Path]:
    files = build_alert_files(spec, opts)  # first: a bad option leaves --out untouched
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
