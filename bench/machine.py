"""What the figures were measured on."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]


class Machine(TypedDict):
    date: str
    cpu: str
    cores: int
    memory_gib: float
    kernel: str
    python: str
    redis_server: str
    packages: dict[str, str]
    commit: str
    toolnexus_source: str


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "bridge", "bench/*.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    changed = " + uncommitted changes to the measured code" if dirty else ""
    return f"{head}{changed}" if head else "unknown"


def _toolnexus_source() -> str:
    """Where the measured toolnexus was imported from, and a hash of its source files."""
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("toolnexus")
    if spec is None or spec.origin is None:
        return "not importable"
    package = Path(spec.origin).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):  # subpackages (redis_broker) too
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return f"{package} (sources sha256 {digest.hexdigest()[:12]})"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe(redis_server_version: str) -> Machine:
    dists = [
        "toolnexus", "redis", "hiredis", "msgspec", "pydantic",
        "arq", "celery", "kombu", "rq", "taskiq", "taskiq-redis",
    ]  # fmt: skip
    packages = {d: v for d in dists if (v := _version(d)) is not None}
    return Machine(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        cpu=_cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        kernel=f"{platform.system()} {platform.release()}",
        python=f"{platform.python_implementation()} {platform.python_version()}",
        redis_server=redis_server_version,
        packages=packages,
        commit=_commit(),
        toolnexus_source=_toolnexus_source(),
    )
