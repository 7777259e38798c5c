"""Dashboards and alert rules generated from the SLO spec and slokit's metric names.

- :mod:`slokit.generate.dashboards`: Grafana JSON (grafanalib) for ``dashboards/``;
- :mod:`slokit.generate.alerts`: Prometheus rule files and an Alertmanager example for ``alerts/``;
- :mod:`slokit.generate.burnrate`: the multi-window burn-rate windows, as data;
- :mod:`slokit.generate.promql`: label conventions and PromQL helpers shared by both.
"""
