"""``python -m bench._case SPEC.json OUT.json``: run one case in a fresh process.

Each case gets a process of its own so that no case inherits another's tasks,
connections, allocator state or imports. The runner reads OUT.json back.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from typing import Any

from bench.common import CaseResult

# The Python packages each peer needs: a peer whose import fails is skipped, not failed.
PEER_MODULES = {
    "bench.peers.cases:arq_case": "arq",
    "bench.peers.cases:celery_case": "celery",
    "bench.peers.cases:rq_case": "rq",
    "bench.peers.cases:taskiq_case": "taskiq_redis",
}


def run(spec: dict[str, Any]) -> CaseResult | dict[str, Any]:
    target: str = spec["fn"]
    needs = PEER_MODULES.get(target)
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError as exc:
            return CaseResult(case=spec["label"], variant=spec["params"].get("variant", ""),
                              skipped=f"cannot import {needs}: {exc}")  # fmt: skip
    module_name, fn_name = target.split(":")
    fn = getattr(importlib.import_module(module_name), fn_name)
    result: CaseResult = fn(spec["url"], spec["params"])
    return result


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    try:
        out: Any = run(spec)
        code = 0
    except BaseException:
        out = {"error": traceback.format_exc()}
        code = 1
    with open(out_path, "w") as f:
        json.dump(out, f)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
