"""Settings that cannot be honoured are refused by name, never silently dropped: the
embedded broker's options and signature settings, the Slack server's means of verifying
posts, and every numeric option (finite and in range).

Threat-model line S9; issue #24 observation 9.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from conformance import TOOLNEXUS, clean_env
from toolnexus import ConfigurationError, RedisSettings
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import SigningKey

pytestmark = pytest.mark.redis


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"require_signatures": True}, "require_signatures"),
        ({"signing_key": "/nowhere/agent-7.key"}, "signing_key"),
        ({"lease_ms": 600, "block_ms": 100}, "block_ms, lease_ms"),
        ({"namspace": "typo"}, "namspace"),
    ],
    ids=["require", "missing-key-file", "redis-options", "unknown"],
)
def test_the_embedded_broker_refuses_what_it_cannot_honour(
    options: dict[str, Any], named: str
) -> None:
    """S9, observation 9: ``connect("memory://", ...)`` accepted signatures required, a key
    file that does not exist and unknown options, and ran unsigned."""
    with pytest.raises(ConfigurationError, match=named) as refused:
        toolnexus.connect("memory://", **options)
    if "signatures" not in str(refused.value) and "sign" not in named:
        assert "default_timeout_s, namespace, queue, retention_s" in str(refused.value)


def test_required_signatures_and_no_url_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """S9, observation 9: with ``TOOLNEXUS_REQUIRE_SIGNATURES=1`` and no URL, ``connect()``
    quietly ran unsigned in memory."""
    monkeypatch.delenv("TOOLNEXUS_URL", raising=False)
    monkeypatch.setenv("TOOLNEXUS_REQUIRE_SIGNATURES", "1")
    with pytest.raises(ConfigurationError, match="TOOLNEXUS_REQUIRE_SIGNATURES=1"):
        toolnexus.connect()


REDIS = "redis://127.0.0.1:6379/0"
BAD_NUMBERS = [
    ("memory://", "default_timeout_s", float("nan")),
    ("memory://", "retention_s", float("inf")),
    (REDIS, "lease_ms", float("nan")),
    (REDIS, "default_timeout_s", float("inf")),
    (REDIS, "retention_s", float("nan")),
    (REDIS, "command_timeout_s", 1e300),
    (REDIS, "block_ms", 100.5),
    (REDIS, "max_connections", "16"),
]


@pytest.mark.parametrize(("url", "name", "value"), BAD_NUMBERS)
def test_every_numeric_option_is_finite_and_in_range(url: str, name: str, value: object) -> None:
    """S9, observation 9/10: NaN passed ``value <= 0`` and infinity passed everything, to
    fail much later as ValueError or OverflowError (or never)."""
    with pytest.raises(ConfigurationError, match=f"{name}="):
        toolnexus.connect(url, **{name: value})


async def test_the_slack_server_refuses_to_start_unable_to_verify_posts(
    redis_url: str, namespace: str
) -> None:
    """S9, observation 9: a Slack server built with neither a signing secret nor an app
    token answered unsigned posts; now it refuses to be built (an empty secret counts as
    none: anyone can compute an HMAC with an empty key)."""
    pytest.importorskip("slack_bolt")
    from toolnexus_workers.slack.server import SlackServer

    async with toolnexus.connect(redis_url, namespace=namespace) as broker:
        common: dict[str, Any] = {"bot_token": "xoxb-1", "channel": "C1", "allowed": ["U1"]}
        for secret in (None, ""):
            with pytest.raises(ConfigurationError, match="verify that clicks come from Slack"):
                SlackServer(broker, signing_secret=secret, **common)
        SlackServer(broker, signing_secret="s3cret", **common)  # either one will do
        SlackServer(broker, app_token="xapp-1", **common)


def test_a_signing_key_object_is_refused_by_memory_too() -> None:
    """S9: not only a path: a key given to a broker that cannot sign is an error."""
    with pytest.raises(ConfigurationError, match="cannot sign"):
        toolnexus.connect("memory://", signing_key=SigningKey.generate("agent-7"))


def test_the_embedded_broker_checks_the_names_it_takes() -> None:
    """S9, observation 9: a namespace the Redis broker refuses was taken in memory."""
    with pytest.raises(ConfigurationError, match="namespace 'a:b'"):
        toolnexus.connect("memory://", namespace="a:b")


# -- RedisSettings (issue #32, observation 4): typed, and refused where not honoured ------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (RedisSettings(lease_ms=600, block_ms=100), "block_ms, lease_ms"),
        (RedisSettings(durability="wait"), "durability"),
        (RedisSettings(redis_options={"username": "ops"}), "redis_options"),
        (RedisSettings(agent="agent-7"), "agent"),
    ],
    ids=["leases", "durability", "connection", "agent"],
)
def test_the_embedded_broker_refuses_settings_it_cannot_honour(
    settings: RedisSettings, named: str
) -> None:
    """observation 4: the embedded broker swallowed what it could not honour."""
    with pytest.raises(ConfigurationError, match=named) as refused:
        toolnexus.connect("memory://", settings=settings)
    assert "default_timeout_s, namespace, queue, retention_s" in str(refused.value)


def test_the_embedded_broker_honours_its_own_settings() -> None:
    settings = RedisSettings(namespace="ops", queue="q", default_timeout_s=5, retention_s=9)
    broker = toolnexus.connect("memory://", settings=settings)
    assert (broker.default_timeout_s, broker.retention_s) == (5, 9)  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="namespace 'a:b'"):
        toolnexus.connect("memory://", settings=RedisSettings(namespace="a:b"))


@pytest.mark.parametrize("url", ["memory://", REDIS])
def test_a_setting_given_twice_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="namespace: given both in settings="):
        toolnexus.connect(url, settings=RedisSettings(namespace="a"), namespace="b")


async def test_settings_and_keywords_make_the_same_broker() -> None:
    typed = toolnexus.connect(REDIS, settings=RedisSettings(lease_ms=60_000, block_ms=500))
    keywords = toolnexus.connect(REDIS, lease_ms=60_000, block_ms=500)
    mixed = toolnexus.connect(REDIS, settings=RedisSettings(lease_ms=60_000), block_ms=500)
    try:
        assert isinstance(typed, RedisBroker) and isinstance(keywords, RedisBroker)
        assert isinstance(mixed, RedisBroker)
        assert typed.settings == keywords.settings == mixed.settings
        assert (typed.settings.lease_ms, typed.settings.block_ms) == (60_000, 500)
    finally:
        for broker in (typed, keywords, mixed):
            await broker.aclose()


@pytest.mark.parametrize(("url", "name", "value"), [b for b in BAD_NUMBERS if b[0] == REDIS])
def test_settings_are_checked_when_made(url: str, name: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"{name}="):
        options: dict[str, Any] = {name: value}
        RedisSettings(**options)


def test_settings_are_frozen_and_hide_passwords() -> None:
    settings = RedisSettings(redis_options={"username": "ops", "password": "s3cret"})
    assert "s3cret" not in repr(settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lease_ms = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.redis_options["password"] = "other"  # type: ignore[index]
    with pytest.raises(ConfigurationError, match="unknown redis_options pasword"):
        RedisSettings(redis_options={"pasword": "s3cret"})
    with pytest.raises(ConfigurationError, match="settings must be a RedisSettings, not dict"):
        toolnexus.connect(REDIS, settings={"lease_ms": 1})  # type: ignore[arg-type]


def _command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOLNEXUS, *args], capture_output=True, text=True, timeout=30, env=clean_env(**env)
    )


@pytest.mark.slow
def test_a_flag_that_cannot_be_honoured_is_named_as_given(tmp_path: Path) -> None:
    """S9, issue #41 observation 6: ``--require-signatures`` without a key names the flag
    that was given (it named ``TOOLNEXUS_REQUIRE_SIGNATURES=1``), and the variable still
    names itself."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\naction = "skip"\n')
    flag = _command("worker", "auto", "--rules", str(rules), "--require-signatures")
    assert flag.returncode == 2
    assert flag.stderr == (
        "toolnexus worker auto: --require-signatures was given but this process has no "
        "signing key: give --signing-key (or set TOOLNEXUS_SIGNING_KEY; toolnexus keygen "
        "makes keys)\n"
    )
    SigningKey.generate("web-1").save(tmp_path)
    no_trust = _command(
        "worker", "auto", "--rules", str(rules), "--require-signatures",
        "--signing-key", str(tmp_path / "web-1.key"),
    )  # fmt: skip
    assert no_trust.returncode == 2
    assert "--require-signatures was given but this process has no trusted keys" in (
        no_trust.stderr
    )
    variable = _command("worker", "auto", "--rules", str(rules), TOOLNEXUS_REQUIRE_SIGNATURES="1")
    assert variable.returncode == 2
    assert "signatures are required (TOOLNEXUS_REQUIRE_SIGNATURES=1)" in variable.stderr


@pytest.mark.slow
def test_the_gateway_starts_with_signatures_required_and_says_what_queue_it_uses(
    tmp_path: Path,
) -> None:
    """S9, issue #41 observations 1 and 6: ``--require-signatures`` without agents' keys or
    trusted keys is refused naming what is missing; ``--queue`` says the gateway publishes
    to it (it said "request queue to answer")."""
    env = {"TOOLNEXUS_GATEWAY_TOKENS": "agent-a=0123456789abcdef0123"}
    no_keys = _command("worker", "gateway", "--require-signatures", **env)
    assert no_keys.returncode == 2
    assert "--require-signatures: the gateway signs each agent's requests with that agent's" in (
        no_keys.stderr
    )
    SigningKey.generate("agent-a").save(tmp_path)
    no_trust = _command(
        "worker", "gateway", "--agent-keys", str(tmp_path), **env,
        TOOLNEXUS_REQUIRE_SIGNATURES="1",
    )  # fmt: skip
    assert no_trust.returncode == 2
    assert "TOOLNEXUS_REQUIRE_SIGNATURES=1: the gateway verifies answers with the" in (
        no_trust.stderr
    )
    usage = " ".join(_command("worker", "gateway", "--help").stdout.split())
    assert "--queue QUEUE request queue the agents' requests are published to" in usage
    assert "request queue to answer" not in usage
