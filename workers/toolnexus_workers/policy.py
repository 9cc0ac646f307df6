"""Cedar policies for ``toolnexus worker auto --policy FILE.cedar`` (extra ``policy``).

Each request is one Cedar authorization request:

- **principal**: the asking agent as its *verified* signer, ``Agent::"<key name>"`` (the
  key that signed the request, checked against the trusted keys); a request that is not
  signed by a trusted key is ``Unverified::"agent"``, so no policy naming an agent can be
  met by a claimed name. Both have ``verified`` (a boolean) and ``claimed`` (the agent
  name the request claims, ``""`` if none).
- **action**: ``Action::"<kind>"`` (``Action::"approval"``, ...); a tool approval is
  ``Action::"tool:<tool name>"``, which is ``in Action::"tool_call"`` (another kind with a
  ``:`` could pose as one, so it fails closed).
- **resource**: ``Request::"<id>"`` with ``kind``, ``prompt``, ``server``, ``tool``,
  ``agent`` (claimed), ``queue``, and ``arguments`` (a tool approval's proposed
  arguments) or ``data`` (any other request's data).

JSON becomes Cedar values: objects are records, arrays sets, fractions decimals (up to 4
places). What Cedar cannot hold (``null``, a finer fraction, an integer beyond 64 bits, an
object with a key Cedar reserves: ``__entity``, ``__extn``, ``__expr``) is left out, so a
policy that reads it fails to evaluate, and the request is declined.

The decision: permit accepts (a tool call as proposed); forbid declines, the deciding
policies' ids (their ``@id("...")``, else Cedar's ``policyN``) the reason; no policy
applies: no decision, the request is left for people. **Errors fail closed**: any policy
that fails to evaluate, or a decision not understood, declines (or, ``on_error="skip"``,
leaves the request for people), even when a permit applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from toolnexus import ConfigurationError, Request
from toolnexus.errors import InvalidRequest
from toolnexus.frameworks import TOOL_CALL, tool_call_of

try:
    import cedarpy
except ImportError:  # pragma: no cover: the extra is installed where tests run
    raise ConfigurationError(
        "--policy needs cedarpy: pip install 'toolnexus-bridge[policy]'"
    ) from None

Verdict = Literal["accept", "decline", "skip"]
OnError = Literal["decline", "skip"]
UNVERIFIED: dict[str, str] = {"type": "Unverified", "id": "agent"}
TOOL_CALLS: dict[str, str] = {"type": "Action", "id": TOOL_CALL}
_RESERVED = frozenset({"__entity", "__extn", "__expr"})
_LONG = 2**63
_LEFT_OUT = object()


class PolicyError(ConfigurationError):
    """A policy file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Decision:
    """What the policy decided for one request: ``verdict``, the ids of the ``policies``
    that decided it, and ``why`` in words (``permit``, ``forbid``, ``no decision``, or
    the error that failed it closed)."""

    verdict: Verdict
    policies: tuple[str, ...]
    why: str

    @property
    def label(self) -> str:
        """The deciding policies, as the log and the answer's ``person`` name them."""
        return ",".join(self.policies) or "none"


class Policy:
    """A Cedar policy set that decides requests (see the module's documentation).

    ``on_error``: what an error decides: ``"decline"`` (the default), or ``"skip"`` (leave
    the request for people). Never accept."""

    def __init__(
        self, policies: cedarpy.PolicySet, count: int, source: str, on_error: OnError = "decline"
    ) -> None:
        self.policies = policies
        self.count = count
        self.source = source
        self.on_error: OnError = on_error

    @classmethod
    def load(cls, path: Path, on_error: OnError = "decline") -> Policy:
        """The policies in the Cedar file ``path``.

        Raises:
            PolicyError: the file cannot be read, or is not a usable policy set.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"cannot read policy file {str(path)!r}: {exc}") from exc
        return cls.parse(text, str(path), on_error)

    @classmethod
    def parse(cls, text: str, source: str = "<policy>", on_error: OnError = "decline") -> Policy:
        """The policies in Cedar ``text`` (``source`` names it in errors).

        Raises:
            PolicyError: not Cedar (with Cedar's reason), no policy at all, or templates
                (which decide nothing until linked).
        """
        try:
            policies = cedarpy.PolicySet.from_str(text)
        except ValueError as exc:
            raise PolicyError(f"{source}: not a valid Cedar policy set: {exc}") from exc
        if policies.templates():
            raise PolicyError(f"{source}: templates (?principal, ?resource) decide nothing here")
        count = len(policies)
        if count == 0:
            raise PolicyError(f"{source}: no policies: add at least one permit or forbid")
        return cls(policies, count, source, on_error)

    def decide(self, request: Request, signer: str | None, queue: str) -> Decision:
        """The decision for ``request``, whose verified signer is ``signer`` (None: not
        signed by a trusted key), asked on ``queue``. Never raises: an error decides
        ``on_error``."""
        try:
            query, entities = _query(request, signer, queue)
        except InvalidRequest as exc:
            return Decision(self.on_error, (), f"error: {exc}")
        try:
            result = cedarpy.is_authorized(query, self.policies, entities)
            decision = result.decision
            diagnostics = result.diagnostics
            named = diagnostics.id_annotations_by_reason
            ids = tuple(named.get(p) or p for p in diagnostics.reasons)
            errors = list(diagnostics.errors)
        except Exception as exc:  # cedarpy's own failure: anything, so fail closed
            return Decision(self.on_error, (), f"error: the policy could not be evaluated: {exc}")
        if errors:
            return Decision(self.on_error, ids, f"error: {'; '.join(errors)}")
        if decision == cedarpy.Decision.Allow and ids:
            return Decision("accept", ids, "permit")
        if decision == cedarpy.Decision.Deny:
            return (
                Decision("decline", ids, "forbid") if ids else Decision("skip", (), "no decision")
            )
        return Decision(self.on_error, ids, f"error: a decision not understood: {decision!r}")

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"<Policy {self.count} policies from {self.source}>"


def _query(
    request: Request, signer: str | None, queue: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The Cedar request and entities that stand for ``request``.

    Raises:
        InvalidRequest: a tool approval whose call is malformed, or a kind with ``:``.
    """
    source = request.source
    claimed = source.agent or ""
    principal = {"type": "Agent", "id": signer} if signer is not None else UNVERIFIED
    attributes: dict[str, Any] = {
        "kind": request.kind,
        "prompt": request.prompt,
        "server": source.server or "",
        "tool": source.tool or "",
        "agent": claimed,
        "queue": queue,
    }
    parents: list[dict[str, str]] = []
    if request.kind == TOOL_CALL:
        call = tool_call_of(request)
        action = {"type": "Action", "id": f"tool:{call.name}"}
        parents.append(TOOL_CALLS)
        attributes["tool"] = call.name
        attributes["arguments"] = call.arguments
    elif ":" in request.kind:  # it would pose as a tool's action ("tool:transfer")
        raise InvalidRequest(f"request {request.id!r}: a kind with ':' ({request.kind!r})")
    else:
        action = {"type": "Action", "id": request.kind}
        attributes["data"] = request.data
    resource = {"type": "Request", "id": request.id}
    entities: list[dict[str, Any]] = [
        {
            "uid": principal,
            "attrs": {"verified": signer is not None, "claimed": claimed},
            "parents": [],
        },
        {"uid": action, "attrs": {}, "parents": parents},
        {"uid": TOOL_CALLS, "attrs": {}, "parents": []},
        {"uid": resource, "attrs": _record(attributes), "parents": []},
    ]
    query: dict[str, Any] = {
        "principal": principal,
        "action": action,
        "resource": resource,
        "context": {},
    }
    return query, entities


def _record(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without what Cedar cannot hold (see :func:`_cedar`)."""
    converted = {key: _cedar(value) for key, value in values.items()}
    return {key: value for key, value in converted.items() if value is not _LEFT_OUT}


def _cedar(value: Any) -> Any:
    """``value`` (JSON) as a Cedar JSON value, or ``_LEFT_OUT`` if Cedar cannot hold it."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if -_LONG <= value < _LONG else _LEFT_OUT
    if isinstance(value, float):
        if value.is_integer() and -_LONG <= value < _LONG:
            return int(value)
        return _decimal(value)
    if isinstance(value, list):
        items = [_cedar(item) for item in value]
        return _LEFT_OUT if any(item is _LEFT_OUT for item in items) else items
    if isinstance(value, dict):
        if _RESERVED & set(value) or not all(isinstance(key, str) for key in value):
            return _LEFT_OUT
        return _record(value)
    return _LEFT_OUT  # None, or anything else


def _decimal(value: float) -> Any:
    """A fraction as a Cedar ``decimal`` (4 places at most, within ±922337203685477)."""
    if value != value or abs(value) >= 922_337_203_685_477:  # NaN, an infinity, too large
        return _LEFT_OUT
    exact = Decimal(repr(value))
    if exact != exact.quantize(Decimal("0.0001")):
        return _LEFT_OUT
    return {"__extn": {"fn": "decimal", "arg": f"{exact:.4f}"}}


__all__ = ["Decision", "OnError", "Policy", "PolicyError", "Verdict"]
