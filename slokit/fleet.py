"""Explain one request across the fleet: ask every pod's sidecar, answer from the one that
holds it (``slokit explain ID --fleet SPEC``; docs/fleet.md).

Each sidecar sees its own pod only, so a request's records sit on the pod that served it,
and its gateway or client fragments possibly on other pods. This module:

- resolves a fleet SPEC into sidecar base URLs (:func:`resolve_fleet`): a comma-separated
  list of URLs, a DNS name whose A/AAAA records are the sidecars (``dns://NAME:PORT`` or
  ``NAME:PORT``: a headless Service), or ``k8s://NAMESPACE/LABEL-SELECTOR[?port=9464]``
  (the pods' IPs, listed with the kubernetes client);
- asks every sidecar's ``/api/explain?id=`` concurrently, with bounded concurrency, a
  per-call time limit and the bearer token (:func:`explain_fleet`);
- merges the documents of several pods (:func:`merge_documents`) by the store's source
  precedence (slokit/store/merge.py).

Sidecars that cannot be asked (refused, timed out, answered 5xx or any other error) are
listed in :attr:`FleetExplanation.unreachable`, never skipped silently.
"""

from __future__ import annotations

import asyncio
import copy
import re
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import httpx

from slokit.errors import BadInput, NotFound, SlokitError
from slokit.ids import checked_request_id
from slokit.records import SOURCE_PRECEDENCE
from slokit.timeutil import iso, parse_time

#: The sidecar's API port (``listen: 0.0.0.0:9464``) when a SPEC names none.
DEFAULT_SIDECAR_PORT = 9464

#: Who is trusted on a request's outcome (status): the client first, since only it saw what
#: the caller got. The same order as the store's merge (slokit/store/merge.py).
OUTCOME_PRECEDENCE: tuple[str, ...] = ("client", "gateway", "vllm", "quality")

#: ``(name, port) -> addresses``: the A/AAAA records of ``name``.
DnsResolver = Callable[[str, int], list[str]]

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NO_CLIENT = "no client record"  # the start of explain's ``unknown`` line for it


class PodLister(Protocol):
    """What :func:`resolve_fleet` needs of ``kubernetes.client.CoreV1Api``."""

    def list_namespaced_pod(self, namespace: str, *, label_selector: str) -> Any: ...


class FleetNotFound(NotFound):
    """No sidecar that answered holds the request (exit 3); the unreachable ones are listed."""

    def __init__(self, message: str, unreachable: Sequence[Unreachable]) -> None:
        super().__init__(message)
        self.unreachable = tuple(unreachable)


class FleetUnreachable(SlokitError):
    """No sidecar answered at all (exit 1)."""

    def __init__(self, message: str, unreachable: Sequence[Unreachable]) -> None:
        super().__init__(message)
        self.unreachable = tuple(unreachable)


# --- resolving a SPEC ---------------------------------------------------------------------


def system_resolver(name: str, port: int) -> list[str]:
    """The addresses of ``name`` as this host resolves it (``getaddrinfo``: /etc/hosts,
    the cluster's DNS): every A/AAAA record of a headless Service, in the order given."""
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise BadInput(f"--fleet: cannot resolve {name!r}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve_fleet(
    spec: str,
    *,
    resolver: DnsResolver | None = None,
    kubernetes: PodLister | None = None,
) -> list[str]:
    """The sidecar base URLs ``spec`` names (BadInput when it names none or is malformed).

    ``resolver`` answers DNS names (default :func:`system_resolver`); ``kubernetes`` lists
    pods for ``k8s://`` (default: ``CoreV1Api`` from the in-cluster config, else the
    kubeconfig)."""
    text = spec.strip()
    if not text:
        raise BadInput("--fleet: empty SPEC")
    if text.startswith("k8s://"):
        urls = _k8s_urls(text, kubernetes)
    else:
        urls = []
        for part in text.split(","):
            urls += _resolve_part(part.strip(), resolver or system_resolver)
    urls = list(dict.fromkeys(urls))
    if not urls:
        raise BadInput(f"--fleet {spec!r}: no sidecars there")
    return urls


def _resolve_part(part: str, resolver: DnsResolver) -> list[str]:
    """One element of a comma-separated SPEC: a URL, ``dns://NAME[:PORT]`` or ``NAME:PORT``."""
    if not part:
        raise BadInput("--fleet: an empty element in the comma-separated SPEC")
    scheme, sep, _ = part.partition("://")
    if sep and scheme in ("http", "https"):
        _host_and_port(part, None)  # a URL without a host or with a bad port is refused
        return [part.rstrip("/")]
    if sep and scheme != "dns":
        raise BadInput(f"--fleet {part!r}: expected http(s)://, dns:// or k8s://")
    if not sep and not re.search(r":\d+$", part):
        raise BadInput(f"--fleet {part!r}: expected a URL, dns://NAME:PORT or NAME:PORT")
    host, port = _host_and_port(part if sep else f"dns://{part}", DEFAULT_SIDECAR_PORT)
    return [_url(addr, port) for addr in resolver(host, port)]


def _host_and_port(url: str, default_port: int | None) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadInput(f"--fleet {url!r}: {exc}") from None
    if not parts.hostname:
        raise BadInput(f"--fleet {url!r}: no host")
    if parts.path.strip("/") and parts.scheme == "dns":
        raise BadInput(f"--fleet {url!r}: a DNS name takes no path")
    return parts.hostname, port if port is not None else (default_port or 0)


def _url(addr: str, port: int) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"http://{host}:{port}"


def _k8s_urls(spec: str, kubernetes: PodLister | None) -> list[str]:
    """``k8s://NAMESPACE/LABEL-SELECTOR[?port=N]``: ``http://POD_IP:N`` for every pod the
    selector matches that has an IP and has not terminated (Succeeded/Failed)."""
    rest, _, query = spec[len("k8s://") :].partition("?")
    namespace, _, selector = rest.partition("/")
    if not _NAMESPACE.match(namespace) or not selector.strip():
        raise BadInput(f"--fleet {spec!r}: expected k8s://NAMESPACE/LABEL-SELECTOR[?port=N]")
    port = DEFAULT_SIDECAR_PORT
    for key, values in parse_qs(query, keep_blank_values=True).items():
        if key != "port" or len(values) != 1 or not values[0].isdigit():
            raise BadInput(f"--fleet {spec!r}: the only option is port=N")
        port = int(values[0])
    if not 0 < port < 65536:
        raise BadInput(f"--fleet {spec!r}: port {port} out of range")
    api = kubernetes if kubernetes is not None else _core_v1_api()
    try:
        pods = api.list_namespaced_pod(namespace, label_selector=selector.strip())
    except Exception as exc:  # the client's ApiException or a connection error: one line
        raise SlokitError(f"--fleet {spec!r}: cannot list pods: {_first_line(exc)}") from None
    urls: list[str] = []
    for pod in pods.items:
        status = pod.status
        if status is None or not status.pod_ip or status.phase in ("Succeeded", "Failed"):
            continue  # no sidecar to ask: not started yet, or gone
        urls.append(_url(status.pod_ip, port))
    return urls


def _core_v1_api() -> PodLister:
    # The kubernetes client is a heavy import, needed for k8s:// only.
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise BadInput(
                f"--fleet k8s://: neither in a cluster nor a kubeconfig: {_first_line(exc)}"
            ) from None
    api: PodLister = client.CoreV1Api()
    return api


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# --- asking the sidecars ------------------------------------------------------------------


@dataclass(frozen=True)
class Unreachable:
    """A sidecar that could not be asked, and why."""

    url: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"url": self.url, "error": self.error}


@dataclass(frozen=True)
class PodAnswer:
    """One sidecar's explain document of the request."""

    url: str
    doc: dict[str, Any]


@dataclass(frozen=True)
class _Missing:
    url: str
    #: What the sidecar says it keeps (its 404's ``retention``): where an older request went.
    retention: str | None = None


@dataclass(frozen=True)
class _Refused:
    """The sidecar refused the id itself (400/413/414)."""

    url: str
    message: str


_Outcome = PodAnswer | _Missing | _Refused | Unreachable


@dataclass(frozen=True)
class FleetExplanation:
    """The request explained from the fleet: ``doc`` is the explain document (merged when
    several pods hold fragments of it), ``answered_by`` the sidecar whose document is its
    base, ``merged_from`` the others that added to it."""

    request_id: str
    doc: dict[str, Any]
    answered_by: str
    merged_from: tuple[str, ...]
    asked: tuple[str, ...]
    unreachable: tuple[Unreachable, ...]

    def fleet_dict(self) -> dict[str, Any]:
        return {
            "answered_by": self.answered_by,
            "merged_from": list(self.merged_from),
            "asked": list(self.asked),
            "unreachable": [u.to_dict() for u in self.unreachable],
        }

    def to_dict(self) -> dict[str, Any]:
        """The explain document with ``fleet: {answered_by, merged_from, asked,
        unreachable}`` added (what ``--json`` prints)."""
        return {**self.doc, "fleet": self.fleet_dict()}

    def fleet_lines(self) -> list[str]:
        """What the text output adds below the explanation."""
        replica = self.doc.get("replica") or "?"
        line = f"answered by the sidecar at {self.answered_by} (replica {replica})"
        if self.merged_from:
            line += f", with fragments from {', '.join(self.merged_from)}"
        lines = [f"fleet: {line}; {len(self.asked)} sidecars asked"]
        lines += [f"fleet: unreachable {u.url}: {u.error}" for u in self.unreachable]
        return lines


def explain_fleet(
    request_id: str,
    urls: Sequence[str],
    *,
    token: str | None,
    concurrency: int = 16,
    timeout_s: float = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FleetExplanation:
    """Ask every sidecar in ``urls`` for ``request_id`` and answer from those holding it.

    Raises BadInput (the id is refused), FleetNotFound (no sidecar that answered holds it;
    exit 3) or FleetUnreachable (none answered; exit 1), each naming the unreachable ones.
    Runs its own event loop: from async code, await :func:`explain_fleet_async`."""
    return asyncio.run(
        explain_fleet_async(
            request_id,
            urls,
            token=token,
            concurrency=concurrency,
            timeout_s=timeout_s,
            transport=transport,
        )
    )


async def explain_fleet_async(
    request_id: str,
    urls: Sequence[str],
    *,
    token: str | None,
    concurrency: int = 16,
    timeout_s: float = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> FleetExplanation:
    """:func:`explain_fleet` in the caller's event loop."""
    checked_request_id(request_id)  # refuse a bad id here, not once per sidecar
    if not urls:
        raise BadInput("--fleet: no sidecars to ask")
    if concurrency < 1:
        raise BadInput(f"concurrency {concurrency}: at least 1")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        headers=headers,
        timeout=timeout_s,
        transport=transport,
        limits=httpx.Limits(max_connections=concurrency),
    ) as http:
        outcomes = await asyncio.gather(
            *(_ask(http, limit, url, request_id, timeout_s) for url in urls)
        )
    return _conclude(request_id, tuple(urls), outcomes)


async def _ask(
    http: httpx.AsyncClient,
    limit: asyncio.Semaphore,
    url: str,
    request_id: str,
    timeout_s: float,
) -> _Outcome:
    """One sidecar's answer; never raises."""
    async with limit:
        try:
            async with asyncio.timeout(timeout_s):  # the whole call, however it trickles
                resp = await http.get(f"{url.rstrip('/')}/api/explain", params={"id": request_id})
        except TimeoutError:
            return Unreachable(url, f"no answer within {timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Unreachable(url, f"{type(exc).__name__}: {_first_line(exc)}")
    if resp.status_code == 404:
        return _Missing(url, _retention(resp))
    if resp.status_code in (400, 413, 414):
        return _Refused(url, _error_text(resp))
    if resp.status_code != 200:
        return Unreachable(url, f"answered {resp.status_code}: {_error_text(resp)}")
    try:
        doc = resp.json()
    except ValueError:
        return Unreachable(url, "answered 200 with a body that is not JSON")
    if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
        return Unreachable(url, "answered 200 with something that is not an explain document")
    return PodAnswer(url, doc)


def _retention(resp: httpx.Response) -> str | None:
    """The ``retention`` of a sidecar's 404 (its bounds), if it sent one."""
    try:
        body = resp.json()
    except ValueError:
        return None
    hint = body.get("retention") if isinstance(body, dict) else None
    return hint[:300] if isinstance(hint, str) and hint else None


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200].strip() or resp.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])[:200]
    return resp.text[:200]


def _conclude(
    request_id: str, asked: tuple[str, ...], outcomes: Sequence[_Outcome]
) -> FleetExplanation:
    answers = [o for o in outcomes if isinstance(o, PodAnswer)]
    refused = [o for o in outcomes if isinstance(o, _Refused)]
    missing = [o for o in outcomes if isinstance(o, _Missing)]
    unreachable = [o for o in outcomes if isinstance(o, Unreachable)]
    if answers:
        # a refusal beside an answer is that sidecar's problem: list it with the others
        unreachable += [Unreachable(r.url, f"refused the id: {r.message}") for r in refused]
        doc, base, others = merge_documents(answers)
        return FleetExplanation(
            request_id=request_id,
            doc=doc,
            answered_by=base.url,
            merged_from=tuple(o.url for o in others),
            asked=asked,
            unreachable=tuple(unreachable),
        )
    if refused and not missing:
        raise BadInput(refused[0].message)
    listed = "".join(f"\n  unreachable {u.url}: {u.error}" for u in unreachable)
    if missing or refused:
        said = Counter(m.retention for m in missing if m.retention)
        kept = "".join(f"\n  {n} of them: {hint}" for hint, n in sorted(said.items()))
        raise FleetNotFound(
            f"no request {request_id!r} on any of the {len(missing) + len(refused)} sidecars "
            f"that answered ({len(asked)} asked){kept}{listed}",
            unreachable,
        )
    raise FleetUnreachable(f"none of the {len(asked)} sidecars answered{listed}", unreachable)


# --- merging several pods' documents --------------------------------------------------------


def _rank(sources: Sequence[str], order: tuple[str, ...]) -> int:
    return min((order.index(s) for s in sources if s in order), default=len(order))


def merge_documents(
    answers: Sequence[PodAnswer],
) -> tuple[dict[str, Any], PodAnswer, list[PodAnswer]]:
    """One explain document from the documents of several pods, each the merged record of
    the fragments that pod holds. Returns it, the base answer and the others that added to it.

    - The base is the document whose sources rank first in the store's precedence (vLLM,
      then gateway, client, quality; ties by URL): its server-side facts, context, findings,
      cause, dominant component and SLO verdict are kept as they are.
    - ``sources`` is the union; ``status`` comes from the document whose sources rank first
      in the outcome precedence (client, gateway, vLLM: the client saw what the caller got).
    - Facts the base lacks are taken from the others in precedence order: trace id,
      replica, model, SLO class, token counts, and the client's times (``client_e2e_s``,
      ``client_ttft_s``); with a client E2E, the ``client`` component, the shares and the
      ``client_done`` event follow, and "no client record" leaves ``unknown``.

    The cause and dominant component are not recomputed: they are the analysis of the pod
    that served the request."""
    ranked = sorted(answers, key=lambda a: (_rank(a.doc["sources"], SOURCE_PRECEDENCE), a.url))
    base, others = ranked[0], ranked[1:]
    doc = copy.deepcopy(base.doc)
    if not others:
        return doc, base, []
    docs = [a.doc for a in ranked]
    doc["sources"] = sorted({s for d in docs for s in d["sources"]})
    for key in ("trace_id", "replica", "model", "slo_class"):
        doc[key] = _first(d.get(key) for d in docs)
    tokens = doc.get("tokens")
    if isinstance(tokens, dict):
        for key in tokens:
            tokens[key] = _first(_sub(d, "tokens").get(key) for d in docs)
    by_outcome = sorted(ranked, key=lambda a: _rank(a.doc["sources"], OUTCOME_PRECEDENCE))
    doc["status"] = _first(a.doc.get("status") for a in by_outcome)
    _add_client_times(doc, docs)
    return doc, base, others


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _sub(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, Mapping) else {}


def _add_client_times(doc: dict[str, Any], docs: Sequence[Mapping[str, Any]]) -> None:
    comps = doc.get("components")
    if not isinstance(comps, dict) or comps.get("client_e2e_s") is not None:
        return
    client_e2e = _first(_sub(d, "components").get("client_e2e_s") for d in docs)
    client_ttft = _first(_sub(d, "components").get("client_ttft_s") for d in docs)
    if comps.get("client_ttft_s") is None:
        comps["client_ttft_s"] = client_ttft
    if client_e2e is None:
        return
    # deferred: the explain package holds the components' rules; it loads DuckDB and the
    # store, which a fleet of sidecars queried over HTTP does not otherwise need
    from slokit.analysis.explain import Components

    comps["client_e2e_s"] = client_e2e
    e2e = comps.get("e2e_s")
    comps["client_s"] = max(0.0, client_e2e - e2e) if e2e is not None else None
    names = ("queue", "prefill", "decode", "frontend", "client", "e2e", "client_e2e", "ttft",
             "client_ttft", "tpot")  # fmt: skip
    typed = Components(**{f"{n}_s": comps.get(f"{n}_s") for n in names})
    comps["shares"] = typed.shares()
    timeline = doc.get("timeline")
    if isinstance(timeline, list) and timeline and timeline[0].get("event") == "arrival":
        arrival = timeline[0].get("ts")
        ts = iso(parse_time(arrival) + client_e2e) if isinstance(arrival, str) else None
        timeline.append({"event": "client_done", "t_s": round(client_e2e, 6), "ts": ts})
    unknown = doc.get("unknown")
    if isinstance(unknown, list):
        doc["unknown"] = [u for u in unknown if not str(u).startswith(_NO_CLIENT)]
