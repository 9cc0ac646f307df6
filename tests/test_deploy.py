"""``deploy/`` and the ``Dockerfile``: the compose file validated by docker-compose, the
Dockerfile by hadolint, the Kubernetes manifests validated against the Kubernetes schemas
and read, and a smoke test that runs what
compose would run, without Docker (there is no Docker engine on these machines)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import redis
import yaml

import toolnexus
from conftest import free_port
from toolnexus.redis_broker import RedisBroker

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
TOOLNEXUS = str(BIN / "toolnexus")
CI = bool(os.environ.get("CI"))


def tool(name: str, where: Path | None = None) -> str:
    """The path of tool ``name``; the test is skipped without it unless on CI."""
    found = shutil.which(name, path=str(where) if where else None)
    if found is None:
        if CI:
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed here")
    return found


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def example_env() -> dict[str, str]:
    lines = (DEPLOY / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def clean_env(**extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **extra}


# -- static checks --------------------------------------------------------------------------


@pytest.mark.slow
def test_docker_compose_validates_the_compose_file() -> None:
    binary = tool("docker-compose")
    args = [binary, "-f", str(DEPLOY / "compose.yaml"), "config"]
    done = subprocess.run(
        args, env=clean_env(**example_env()), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert sorted(services) == ["auto", "demo-agent", "redis", "web"]
    missing = subprocess.run(args, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0
    assert "set REDIS_AGENT_PASSWORD in deploy/.env" in missing.stderr


def test_the_compose_file_runs_redis_with_aof_always_and_the_acl_file() -> None:
    redis_service = compose()["services"]["redis"]
    script = " ".join(redis_service["command"])
    assert "set-passwords.sh /etc/toolnexus/users.acl > /tmp/users.acl" in script
    assert "redis-server /etc/toolnexus/redis.conf --aclfile /tmp/users.acl" in script
    assert redis_service["image"].startswith("redis:7")
    config = (DEPLOY / "redis" / "redis.conf").read_text().splitlines()
    assert "appendonly yes" in config and "appendfsync always" in config
    assert "maxmemory-policy noeviction" in config


def test_every_service_logs_in_as_a_user_of_the_acl_file_and_an_agent_waits_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo agent waits as the agent its Redis user names, whose ACL line gives it its
    own waiter keys alone (``toolnexus acl``); workers log in as the responder."""
    monkeypatch.delenv("TOOLNEXUS_AGENT", raising=False)
    users = {
        line.split()[1]: line for line in (DEPLOY / "redis" / "users.acl").read_text().splitlines()
    }
    logins = {}
    for name, service in compose()["services"].items():
        url = service.get("environment", {}).get("TOOLNEXUS_URL")
        if url is not None:
            logins[name] = interpolate(url, example_env())
    roles = {name: urlsplit(url).username for name, url in logins.items()}
    assert roles == {"web": "responder", "auto": "responder", "demo-agent": "agent"}
    assert "~{toolnexus:w:agent.*}:answers" in users["agent"]
    assert ":w:*}" not in users["agent"]
    agent = toolnexus.connect(logins["demo-agent"])
    assert isinstance(agent, RedisBroker) and agent.settings.agent == "agent"


@pytest.mark.slow
def test_hadolint_passes_the_dockerfile() -> None:
    binary = tool("hadolint", BIN)
    done = subprocess.run(
        [binary, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, flags=re.M)) == 2  # multi-stage
    assert re.search(r"^USER 10001", dockerfile, flags=re.M)
    assert 'CMD ["toolnexus", "check", "--here"]' in dockerfile
    assert 'ENTRYPOINT ["toolnexus"]' in dockerfile


def manifests() -> list[dict[str, Any]]:
    documents = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def test_the_kubernetes_manifests_are_valid_against_the_kubernetes_schemas() -> None:
    """Every manifest but the Kustomization (kustomize's, not the API server's) passes the
    schemas of the Kubernetes API (kubernetes-validate's copy of the newest it knows),
    strictly: a field the schema does not name is refused, as the typo'd one here is."""
    version = kubernetes_validate.latest_version()
    resources = [d for d in manifests() if d["kind"] != "Kustomization"]
    assert len(resources) == 13
    for document in resources:
        kubernetes_validate.validate(document, version, strict=True)
    named = {(d["kind"], d["metadata"]["name"]): d for d in resources}
    typo = copy.deepcopy(named["StatefulSet", "toolnexus-web"])
    (container,) = typo["spec"]["template"]["spec"]["containers"]
    container["livenessProbes"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="livenessProbes"):
        kubernetes_validate.validate(typo, version, strict=True)


def test_the_kubernetes_manifests_have_probes_resources_a_budget_and_policies() -> None:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in manifests():
        by_kind.setdefault(document["kind"], []).append(document)
    kustomization = by_kind["Kustomization"][0]
    for resource in kustomization["resources"]:
        assert (DEPLOY / "kubernetes" / resource).is_file()
    for generator in kustomization["configMapGenerator"]:
        for entry in generator["files"]:
            assert (DEPLOY / "kubernetes" / entry.split("=", 1)[1]).is_file(), entry
    deployments = {d["metadata"]["name"]: d for d in by_kind["Deployment"] + by_kind["StatefulSet"]}
    assert sorted(deployments) == ["redis", "toolnexus-auto", "toolnexus-web"]
    for name in ("toolnexus-auto", "toolnexus-web"):
        deployment = deployments[name]
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        assert container["args"][0] == "worker"
        assert container["livenessProbe"]["exec"]["command"] == ["toolnexus", "check", "--here"]
        assert "readinessProbe" in container
        assert {"requests", "limits"} <= set(container["resources"])
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployments["redis"]["spec"]["template"]["spec"]["containers"][0]["command"][:2] == [
        "redis-server",
        "/etc/toolnexus/redis.conf",
    ]
    budgets = {b["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for b in by_kind[
        "PodDisruptionBudget"
    ]}  # fmt: skip
    assert budgets == {"toolnexus-web", "toolnexus-auto"}
    policies = {p["metadata"]["name"]: p for p in by_kind["NetworkPolicy"]}
    assert policies["redis"]["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 6379}]
    assert "Egress" in policies["toolnexus-workers"]["spec"]["policyTypes"]
    # agents outside the cluster reach Redis, and only Redis, from the networks named
    agents = policies["redis-agents"]["spec"]
    assert agents["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "redis"}
    assert agents["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 6379}]
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind["Service"]}
    ranges = [
        block["ipBlock"]["cidr"] for block in agents["ingress"][0]["from"] if "ipBlock" in block
    ]
    assert services["redis-agents"]["loadBalancerSourceRanges"] == ranges
    # every web replica is a group of its own, with one session secret, behind TLS
    web = deployments["toolnexus-web"]
    (container,) = web["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--group") + 1] == "$(POD_NAME)" and web["spec"]["replicas"] == 2
    env = {e["name"] for e in container["env"]}
    assert {"POD_NAME", "TOOLNEXUS_WEB_SESSION_SECRET"} <= env
    (ingress,) = by_kind["Ingress"]
    assert ingress["spec"]["tls"][0]["secretName"] == "toolnexus-web-tls"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "toolnexus-web"


# -- the smoke test ---------------------------------------------------------------------------

PASSWORDS = {user: secrets.token_hex(16) for user in ("agent", "responder", "ops")}


@contextlib.contextmanager
def deploy_redis(directory: Path) -> Iterator[int]:
    """redis-server with deploy/redis/redis.conf and the ACL file set-passwords.sh makes."""
    env = clean_env(**{f"REDIS_{u.upper()}_PASSWORD": p for u, p in PASSWORDS.items()})
    acl = subprocess.run(
        ["bash", str(DEPLOY / "redis" / "set-passwords.sh")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (directory / "users.acl").write_text(acl)
    port = free_port()
    process = subprocess.Popen(
        [
            tool("redis-server"),
            str(DEPLOY / "redis" / "redis.conf"),
            "--aclfile", str(directory / "users.acl"),
            "--dir", str(directory),
            "--port", str(port),
            "--bind", "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, username="ops", password=PASSWORDS["ops"])
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.exceptions.ConnectionError):
                if client.ping():
                    break
            assert process.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield port
    finally:
        process.kill()
        process.wait(10)


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ``${VAR}`` and ``${VAR:?message}``."""
    return re.sub(r"\$\{(\w+)(?::\?[^}]*)?\}", lambda m: variables[m[1]], text)


def service_process(
    name: str, variables: dict[str, str], port: int, **replace: str
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment compose gives service ``name``, with Redis at
    ``port`` here, the service's volumes at their host paths, and ``replace``'d arguments."""
    service = compose()["services"][name]
    command = [replace.get(arg, arg) for arg in service["command"]]
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        command = [arg.replace(target, str(DEPLOY / source)) for arg in command]
    env = {
        key: interpolate(str(value), variables).replace("@redis:6379", f"@127.0.0.1:{port}")
        for key, value in service.get("environment", {}).items()
    }
    return [TOOLNEXUS, *command], clean_env(**env)


def check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOLNEXUS, "check", *args], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.slow
def test_what_compose_runs_completes_the_demo_round_trip(tmp_path: Path) -> None:
    variables = {
        **{f"REDIS_{u.upper()}_PASSWORD": p for u, p in PASSWORDS.items()},
        "TOOLNEXUS_WEB_TOKEN": secrets.token_hex(16),
        "TOOLNEXUS_METRICS_TOKEN": secrets.token_hex(16),
    }
    web_port = str(free_port())
    metrics_ports = {"auto": str(free_port()), "web": str(free_port())}
    with deploy_redis(tmp_path) as port, contextlib.ExitStack() as logs:
        workers: dict[str, subprocess.Popen[bytes]] = {}
        envs: dict[str, dict[str, str]] = {}
        try:
            for name, replace in [
                ("auto", {"0.0.0.0": "127.0.0.1"}),
                ("web", {"8700": web_port, "0.0.0.0": "127.0.0.1"}),  # a shared machine
            ]:
                replace["9100"] = metrics_ports[name]
                command, envs[name] = service_process(name, variables, port, **replace)
                log = logs.enter_context((tmp_path / f"{name}.log").open("wb"))
                workers[name] = subprocess.Popen(command, env=envs[name], stderr=log)
            deadline = time.monotonic() + 30
            while check(envs["auto"], "--worker", "auto", "--worker", "web").returncode != 0:
                for name, worker in workers.items():
                    why = (tmp_path / f"{name}.log").read_text()
                    assert worker.poll() is None, f"{name} worker exited: {why}"
                assert time.monotonic() < deadline, "the workers never sent a heartbeat"
                time.sleep(0.2)
            command, env = service_process("demo-agent", variables, port)
            demo = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert demo.returncode == 0, demo.stdout + demo.stderr
            assert "Tool result: Booked: a table for 2 at Chez Toolnexus on 2026-09-01" in (
                demo.stdout
            )
            assert "in the name of Demo Guest (guest@example.com);" in demo.stdout
            assert "; deposit authorized." in demo.stdout
            for name in workers:
                done = check(envs[name], "--here")
                assert done.returncode == 0, done.stderr
                assert done.stdout.startswith("ok: ")
            ops_url = f"redis://ops:{PASSWORDS['ops']}@127.0.0.1:{port}/0"
            audit = subprocess.run(
                [TOOLNEXUS, "audit", "--json", "--url", ops_url],
                env=clean_env(), capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert audit.returncode == 0, audit.stderr
            records = json.loads(audit.stdout)
            assert [(r["kind"], r["ok"], r["person"]) for r in records] == [
                ("input", True, "auto:demo booking details"),
                ("authorization", True, "auto:demo deposit"),
            ]
            scrape = urllib.request.Request(
                f"http://127.0.0.1:{metrics_ports['auto']}/metrics",
                headers={"Authorization": f"Bearer {variables['TOOLNEXUS_METRICS_TOKEN']}"},
            )
            metrics = urllib.request.urlopen(scrape, timeout=10).read().decode()
            answered = (
                'toolnexus_worker_requests_total{consumer="%s",group="auto",state="answered"} 2.0'
            )
            assert re.search(re.escape(answered).replace("%s", '[^"]+'), metrics), metrics
            resolved = (
                'toolnexus_requests_resolved_total{outcome="answered",queue="default",'
                'reason="accepted"} 2.0'
            )
            assert resolved in metrics
        finally:
            for worker in workers.values():
                worker.send_signal(signal.SIGTERM)
            codes = {name: worker.wait(30) for name, worker in workers.items()}
        assert codes == {"auto": 0, "web": 0}
