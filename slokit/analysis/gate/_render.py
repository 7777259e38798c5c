"""The gate's outputs: JUnit XML (one test case per class and check; a class with no
requests is a skipped case) and a Markdown summary for a CI job summary (requests a load
test cut at its end are shown beside the judged ones, when there are any)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from slokit.analysis.gate._checks import GateResult
from slokit.analysis.gate._format import fmt_metric, pct
from slokit.analysis.slo import GroupReport

#: Characters XML 1.0 does not allow at all (escaping cannot help): most C0 controls,
#: surrogates, U+FFFE and U+FFFF.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_text(text: str) -> str:
    """``text`` with every character XML 1.0 forbids replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def junit_xml(result: GateResult) -> str:
    """JUnit XML: one testsuite per gate run, one testcase per class and check. Names and
    messages may hold anything (a class name, a baseline's text): characters XML cannot carry
    are replaced, so the file always parses."""
    root = _junit_tree(result)
    for el in root.iter():
        el.attrib = {k: _xml_text(v) for k, v in el.attrib.items()}
        if el.text:
            el.text = _xml_text(el.text)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _junit_tree(result: GateResult) -> ET.Element:
    checks = result.checks
    failures = sum(c.failed for c in checks)
    skipped = sum(c.passed is None for c in checks)
    root = ET.Element(
        "testsuites",
        name="slokit gate",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
    )
    suite = ET.SubElement(
        root,
        "testsuite",
        name=f"slo.{result.service}",
        tests=str(len(checks)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    for c in checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"slo.{result.service}.{c.cls}", name=c.name, time="0"
        )
        if c.passed is None:
            ET.SubElement(case, "skipped", message=c.message)
        elif not c.passed:
            # Why a bound was missed (a missing class's volume is no engine's doing).
            roots = result.root_causes if c.kind != "volume" else []
            message = c.message + "".join(f"; root cause {r.label}" for r in roots)
            el = ET.SubElement(case, "failure", message=message, type=f"{c.kind}_breach")
            el.text = "\n".join([c.message, *(_root_cause_lines(result) if roots else [])])
        else:
            out = ET.SubElement(case, "system-out")
            out.text = c.message
    return root


def _ms(group: GroupReport, metric: str, q: float) -> str:
    p = group.percentile(metric, q)
    return "-" if p is None else f"{p.value_s * 1000:.0f} ms"


def _regression_table(result: GateResult) -> list[str]:
    lines = [
        "",
        "### Compared with the baseline",
        "",
        "| class | metric | baseline | current | difference CI | regression |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in result.regressions:
        ci = (
            "-"
            if r.diff_ci is None
            else f"[{fmt_metric(r.metric, r.diff_ci[0])}, {fmt_metric(r.metric, r.diff_ci[1])}]"
        )
        flag = {True: "**yes**", False: "no (within noise)", None: "n/a"}[r.regressed]
        lines.append(
            f"| {r.cls} | {r.metric} | {fmt_metric(r.metric, r.baseline)} "
            f"| {fmt_metric(r.metric, r.current)} | {ci} | {flag} |"
        )
    return lines


def markdown_summary(result: GateResult) -> str:
    """A Markdown summary for a CI job summary ($GITHUB_STEP_SUMMARY)."""
    rep = result.report
    failed = [c for c in result.checks if c.failed]
    verdict = "PASS" if result.passed else "FAIL"
    head = f"## slokit gate: {verdict}" + (
        f" ({len(failed)} of {len(result.checks)} checks breached)"
        if failed
        else f" ({len(result.checks)} checks)"
    )
    dur = rep.window.duration_s
    lines = [
        head,
        "",
        f"Service `{result.service}`: {rep.overall.requests} requests"
        + (f" over {dur:.1f} s" if dur else "")
        + (f", {rep.unclassified} matched no class" if rep.unclassified else "")
        + (
            f", {rep.overall.incomplete} incomplete (cut at the load test's end, not judged)"
            if rep.overall.incomplete
            else ""
        )
        + ".",
        "",
        "| class | requests | good | attainment | objective | burn rate | good req/s "
        "| TTFT p95 | TPOT p95 | E2E p95 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in rep.classes:
        br = "-" if g.burn_rate is None else f"{g.burn_rate:.2f}"
        gr = "-" if g.good_rps is None else f"{g.good_rps:.3f}"
        n = f"{g.requests}" + (f" (+{g.incomplete} incomplete)" if g.incomplete else "")
        lines.append(
            f"| {g.name} | {n} | {g.good} | {pct(g.attainment)} | {pct(g.objective)} "
            f"| {br} | {gr} | {_ms(g, 'ttft', 0.95)} | {_ms(g, 'tpot', 0.95)} "
            f"| {_ms(g, 'e2e', 0.95)} |"
        )
    lines += ["", "### Checks", "", "| result | class | check | detail |", "|---|---|---|---|"]
    icon = {True: "pass", False: "**FAIL**", None: "skipped"}
    for c in result.checks:
        lines.append(f"| {icon[c.passed]} | {c.cls} | {c.name} | {c.message} |")
    if result.regressions:
        lines += _regression_table(result)
    if result.root_causes and failed:
        lines += ["", "### Root cause", ""]
        lines += [f"- {ln}" for ln in _root_cause_lines(result)]
    return "\n".join(lines) + "\n"


def _root_cause_lines(result: GateResult) -> list[str]:
    """``root cause queue_saturation on pod-a: <summary> (runbooks/...)`` per root cause,
    then the causal chain."""
    lines = [f"root cause {r.label}: {r.summary} ({r.runbook})" for r in result.root_causes]
    chains = [r.chain for r in result.root_causes if r.chain]
    return lines + [f"causal chain: {c}" for c in dict.fromkeys(chains)]
