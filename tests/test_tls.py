"""TLS (``rediss://``) with a CA, a server and a client certificate made here: a whole round
trip, and a server the client cannot verify is refused as unavailable."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import toolnexus
from conftest import FAST, RedisServer
from toolnexus import BrokerUnavailable, Request, new_id

pytestmark = pytest.mark.redis


class Authority:
    """A certificate authority that signs certificates into PEM files in ``directory``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.key = directory, ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = self._build(self.name, self.key.public_key(), ca=True, usage=None)
        self.cert_file = self._write(
            f"{name}.crt", self.cert.public_bytes(serialization.Encoding.PEM)
        )

    def _build(
        self,
        subject: x509.Name,
        public_key: ec.EllipticCurvePublicKey,
        *,
        ca: bool,
        usage: x509.ObjectIdentifier | None,
    ) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(self.key, hashes.SHA256())

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def issue(self, name: str, usage: x509.ObjectIdentifier) -> tuple[str, str]:
        """A certificate for ``name`` and its key: (cert file, key file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = self._build(subject, key.public_key(), ca=False, usage=usage)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return (
            self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{name}.key", key_pem),
        )


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return Authority(tmp_path, "toolnexus-test-ca")


@pytest.fixture
def client_tls(ca: Authority) -> dict[str, Any]:
    cert, key = ca.issue("agent", ExtendedKeyUsageOID.CLIENT_AUTH)
    return {"ssl_ca_certs": ca.cert_file, "ssl_certfile": cert, "ssl_keyfile": key}


@pytest.fixture
def tls_server(tmp_path: Path, ca: Authority, client_tls: dict[str, Any]) -> Iterator[RedisServer]:
    cert, key = ca.issue("redis", ExtendedKeyUsageOID.SERVER_AUTH)
    server = RedisServer(
        tmp_path,
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        key,
        "--tls-ca-cert-file",
        ca.cert_file,
        "--tls-auth-clients",
        "yes",
        tls=True,
        **client_tls,
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def test_a_round_trip_over_tls_with_client_certificates(
    tls_server: RedisServer, client_tls: dict[str, Any]
) -> None:
    assert tls_server.url.startswith("rediss://")
    options = {"queue": "tls", **FAST, **client_tls}
    async with (
        toolnexus.connect(tls_server.url, **options) as agent,
        toolnexus.connect(tls_server.url, **options) as bot,
    ):

        async def respond() -> str:
            async with bot.responder("ops") as requests:
                async for pending in requests:
                    await pending.accept({"n": 3}, person="web:alice")
                    return pending.request.prompt
            raise AssertionError("the responder stopped before a request came")

        responding = asyncio.create_task(respond())
        answer = await agent.wait_for(
            Request(id=new_id(), kind="approval", prompt="Over TLS?"), timeout_s=20
        )
        assert (answer.ok, answer.data, answer.person) == (True, {"n": 3}, "web:alice")
        assert await responding == "Over TLS?"


async def test_a_server_signed_by_another_ca_is_unavailable(
    tmp_path: Path, tls_server: RedisServer, client_tls: dict[str, Any]
) -> None:
    other = Authority(tmp_path, "someone-else")
    options = {**client_tls, "ssl_ca_certs": other.cert_file}
    with pytest.raises(BrokerUnavailable, match="certificate verify failed"):
        async with toolnexus.connect(tls_server.url, **options):
            pass


async def test_a_client_without_a_certificate_is_turned_away(
    tls_server: RedisServer, ca: Authority
) -> None:
    with pytest.raises(BrokerUnavailable, match="cannot reach Redis"):
        async with toolnexus.connect(tls_server.url, ssl_ca_certs=ca.cert_file):
            pass


async def test_plain_redis_to_a_tls_port_is_unavailable(tls_server: RedisServer) -> None:
    plain = tls_server.url.replace("rediss://", "redis://")
    with pytest.raises(BrokerUnavailable, match="cannot reach Redis"):
        async with toolnexus.connect(plain):
            pass
