"""Start a peer's worker as a subprocess, stop it after the case."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``argv`` run with ``sys.executable``; output to ``log``; SIGTERM then SIGKILL on exit."""

    def __init__(self, argv: list[str], url: str, log: Path) -> None:
        self.argv = [sys.executable, *argv]
        self.env = {
            **os.environ,
            "BENCH_REDIS_URL": url,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    def __enter__(self) -> WorkerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(
                f"worker {self.argv[1:]} exited with {self.proc.returncode}; see {self.log}"
            )

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self._out is not None:
            self._out.close()
