"""The client the MCP conformance package drives (tests/test_mcp_conformance.py): ``load_mcp``
with its defaults against the scenario's server, given as the last argument.

In the ``auth/*`` scenarios ``load_mcp`` gets ``auth=`` the SDK's own OAuth client
(``OAuthClientProvider``, authorization code with PKCE): the "browser" follows the
authorization URL without a person and hands back the code the redirect carries; a client id
(and secret) the scenario's context gives is used as pre-registered.

It lists the tools and calls the ones the scenario's context names (``MCP_CONFORMANCE_CONTEXT``,
``toolCalls``) or else each one, with arguments made from its input schema (a ``schema``
argument gets the other tools' input schema, as the JSON Schema scenarios echo it); every
question the server asks is accepted with an empty form, so the schema's defaults fill it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from toolnexus import Answer, Request, load_mcp
from toolnexus.mcp import McpError

REDIRECT = "http://localhost:3000/callback"
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"


async def accept(request: Request) -> Answer:
    """Every request accepted; a form with nothing filled in (its defaults apply)."""
    return Answer(id=request.id, ok=True, data={} if request.kind == "form" else None)


def sample(schema: dict[str, Any]) -> Any:
    """A value that fits a (simple) JSON Schema."""
    if "default" in schema:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", list(properties))
        return {key: sample(properties[key]) for key in required if key in properties}
    return "test"


class Storage:
    """The OAuth client's tokens and registration, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.info = client_info


class Browser:
    """Follows an authorization URL as a person's browser would (the scenario's
    authorization server approves at once) and keeps what the redirect carries."""

    def __init__(self) -> None:
        self.result: AuthorizationCodeResult | None = None

    async def redirect(self, url: str) -> None:
        async with httpx2.AsyncClient() as client:
            response = await client.get(url, follow_redirects=False)
        query = parse_qs(urlsplit(response.headers.get("location", "")).query)
        self.result = AuthorizationCodeResult(
            code=query["code"][0],
            state=query.get("state", [None])[0],
            iss=query.get("iss", [None])[0],
        )

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None, "no authorization redirect was followed"
        return self.result


def oauth(url: str, scenario: str, context: dict[str, Any]) -> OAuthClientProvider:
    """The SDK's OAuth client for ``url``: its client-credentials providers in those
    scenarios, else authorization code, pre-registered if ``context`` gives a client id."""
    storage = Storage()
    if scenario == "auth/client-credentials-basic":
        return ClientCredentialsOAuthProvider(
            url, storage, context["client_id"], context["client_secret"]
        )
    if scenario == "auth/client-credentials-jwt":
        signed = SignedJWTParameters(
            issuer=context["client_id"],
            subject=context["client_id"],
            signing_key=context["private_key_pem"],
            signing_algorithm=context.get("signing_algorithm", "ES256"),
        )
        return PrivateKeyJWTOAuthProvider(
            url, storage, context["client_id"], signed.create_assertion_provider()
        )
    if context.get("client_id"):
        secret = context.get("client_secret")
        storage.info = OAuthClientInformationFull(
            client_id=context["client_id"],
            client_secret=secret,
            redirect_uris=[REDIRECT],  # type: ignore[list-item]
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
        )
    browser = Browser()
    metadata = OAuthClientMetadata(
        client_name="toolnexus-conformance",
        redirect_uris=[REDIRECT],  # type: ignore[list-item]
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    return OAuthClientProvider(
        server_url=url,
        client_metadata=metadata,
        storage=storage,
        redirect_handler=browser.redirect,
        callback_handler=browser.callback,
        client_metadata_url=CLIENT_METADATA_URL,
    )


async def main(url: str) -> None:
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    auth = oauth(url, scenario, context) if scenario.startswith("auth/") else None
    async with load_mcp(url, wait_for=accept, timeout_s=10, auth=auth) as tools:
        print(f"connected at {tools.protocol_version}: {', '.join(tools)}")
        calls = [(c["name"], c.get("arguments", {})) for c in context.get("toolCalls", [])]
        if not calls:
            for tool in tools.values():
                arguments = sample(tool.input_schema)
                if "schema" in tool.input_schema.get("properties", {}):
                    others = [t.input_schema for t in tools.values() if t is not tool]
                    arguments["schema"] = others[0] if others else {}
                calls.append((tool.name, arguments))
        for name, arguments in calls:
            if name not in tools:
                print(f"{name}: not listed")
                continue
            try:
                result = await tools[name].call(arguments)
            except McpError as exc:  # the scenario's server may list a tool it does not serve
                print(f"{name}: {exc}")
            else:
                print(f"{name}: is_error={result.is_error}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[-1]))
