"""``slokit sim``: a vLLM-compatible simulator with GPU telemetry and fault injection.

Modules: :mod:`.engine` (iteration-level scheduler on an injectable clock), :mod:`.kv`
(paged KV blocks, prefix cache), :mod:`.roofline` (model/GPU profiles, step time),
:mod:`.metrics` (vLLM exposition), :mod:`.dcgm` (dcgm-exporter exposition),
:mod:`.tracing` (OTLP ``llm_request`` spans), :mod:`.faults` (fault knobs and scenario
presets), :mod:`.server` (aiohttp frontends, one process for N replicas), :mod:`.vtime`
(an event loop on virtual time, for deterministic runs as fast as the CPU allows).
"""
