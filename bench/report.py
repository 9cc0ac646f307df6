"""Turn case results into ``RESULTS.md`` (tables, ratios, targets) and ``results.png``."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.channels import BUDGETS, CHANNELS
from bench.common import Latency, Throughput, merge_latency
from bench.machine import Machine

FLOOR_LATENCY = ("floor", "direct")
FLOOR_THROUGHPUT = ("floor", "pool")
TOOLNEXUS = ("toolnexus", "default")
PEERS = ("arq", "celery", "rq", "taskiq")


class Tables:
    """The results of one run, pooled over rounds."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = [r for r in results if "wakeup" in r]
        self.latency: dict[tuple[str, str], tuple[Latency, str]] = {}
        self.throughput: dict[tuple[str, str], list[tuple[Throughput, int, str]]] = {}
        self.scale: list[dict[str, Any]] = [r for r in results if "scale" in r]
        self.codec: list[dict[str, Any]] = [row for r in results for row in r.get("codec", [])]
        self.codec_settings = next((r["settings"] for r in results if "codec" in r), "")
        self.problems = [r for r in results if "error" in r or "skipped" in r]
        # variant ("memory", "idle", "dead waiters") -> its figures (bench/fleet.py)
        self.fleet: dict[str, dict[str, Any]] = {
            r["variant"]: {**r["fleet"], "settings": r.get("settings", "")}
            for r in results
            if "fleet" in r
        }
        # (case, variant) -> (alone, with the others pending, how many others)
        self.wakeup: dict[tuple[str, str], tuple[Latency, Latency, int]] = {}
        wake_parts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in results:
            if "wakeup" in r:
                wake_parts[(r.get("case", "?"), r.get("variant", ""))].append(r["wakeup"])
        for key, wparts in wake_parts.items():
            self.wakeup[key] = (
                merge_latency([w["none"] for w in wparts], [w["none_samples_ms"] for w in wparts]),
                merge_latency(
                    [w["loaded"] for w in wparts], [w["loaded_samples_ms"] for w in wparts]
                ),
                wparts[0]["pending"],
            )

        lat_parts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        tp_parts: dict[tuple[str, str, int], list[Throughput]] = defaultdict(list)
        settings: dict[tuple[str, str], str] = {}
        for r in results:
            key = (r.get("case", "?"), r.get("variant", ""))
            if "latency" in r:
                lat_parts[key].append(r)
                settings.setdefault(key, r.get("settings", ""))
            for row in r.get("throughput", []):
                tp_parts[(*key, row["concurrency"])].append(row)
                settings.setdefault(key, r.get("settings", ""))
        for key, parts in lat_parts.items():
            merged = merge_latency(
                [p["latency"] for p in parts], [p.get("samples_ms", []) for p in parts]
            )
            self.latency[key] = (merged, settings[key])
        for (case, variant, _c), rows in sorted(tp_parts.items()):
            # The median round by round trips per second; n counts every round.
            ordered = sorted(rows, key=lambda t: t["per_s"])
            median = ordered[(len(ordered) - 1) // 2]
            self.throughput.setdefault((case, variant), []).append(
                (median, sum(t["n"] for t in rows), settings[(case, variant)])
            )
        self.rounds = max((len(v) for v in tp_parts.values()), default=0)
        self.latency_rounds = max((len(v) for v in lat_parts.values()), default=0)

    def per_s(self, key: tuple[str, str], concurrency: int) -> float | None:
        for row, _n, _s in self.throughput.get(key, []):
            if row["concurrency"] == concurrency:
                return row["per_s"]
        return None


def _loop_of(variant: str) -> str:
    """``", uvloop"`` of a variant measured on uvloop, else ``""``."""
    return variant[variant.index(",") :] if "," in variant else ""


def floor_latency_key(variant: str) -> tuple[str, str]:
    """The floor row a latency row is compared with: the one on the same event loop."""
    return (FLOOR_LATENCY[0], FLOOR_LATENCY[1] + _loop_of(variant))


def floor_throughput_key(variant: str, kind: str = FLOOR_THROUGHPUT[1]) -> tuple[str, str]:
    """The floor row (``pool`` or ``coalesced``) a throughput row is compared with."""
    return ("floor", kind + _loop_of(variant))


def _ms(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}" if x < 1000 else f"{x:,.0f}"


def _ratio(x: float | None, base: float | None, digits: int = 2) -> str:
    if x is None or base is None or base == 0 or math.isnan(x) or math.isnan(base):
        return "–"
    return f"{x / base:.{digits}f}×"


def _bytes(n: float) -> str:
    return f"{n / 1024:,.2f} KiB" if abs(n) < 1024 * 1024 else f"{n / 1024 / 1024:,.1f} MiB"


def _channel_rows(t: Tables) -> list[tuple[str, Latency, float, float]]:
    """Each measured channel: its name, latency, p50 as a ratio to the broker's own p50 in
    the same run, and its budget (that ratio's bound, bench/channels.py)."""
    broker = t.latency.get(TOOLNEXUS)
    rows = []
    for channel in CHANNELS:
        got = t.latency.get(("channel", channel))
        if got and broker:
            rows.append((channel, got[0], got[0]["p50_ms"] / broker[0]["p50_ms"], BUDGETS[channel]))
    return rows


def _channel_targets(t: Tables) -> list[str]:
    broker = t.latency.get(TOOLNEXUS)
    return [
        f"- {'✅' if ratio <= budget else '❌'} channel {channel}: p50 {_ms(lat['p50_ms'])} ms = "
        f"**{ratio:.2f}×** the broker's own {_ms(broker[0]['p50_ms'])} ms in this run "
        f"(budget ≤ {budget:g}×)"
        for channel, lat, ratio, budget in _channel_rows(t)
        if broker
    ]


def _channels_section(t: Tables) -> list[str]:
    broker = t.latency.get(TOOLNEXUS)
    rows = _channel_rows(t)
    if not rows or not broker:
        return []
    out = [
        "",
        "## Channels: each way a person answers or an agent waits",
        "",
        "One request at a time through each channel's public interface: the worker runs as "
        "`toolnexus worker NAME` in its own process on the same Redis; the agent, the webhook "
        "receiver and the SMTP server (aiosmtpd) in the case process. Samples pooled over "
        f"{t.latency_rounds} round(s), each channel in a fresh process, alternating with the "
        "broker's own round trip (`toolnexus | default` above), which each ratio and budget "
        "is to: ratios within one run, as this 2-core machine is shared and its absolute "
        "times drift between runs.",
        "",
        "| channel | what is timed | samples | p50 ms | p90 ms | p99 ms | p50 vs broker "
        "| p50 added ms | p99 vs broker | budget (p50) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    base = broker[0]
    for channel, lat, ratio, budget in rows:
        out.append(
            f"| {channel} | {CHANNELS[channel]} | {lat['n']:,} | {_ms(lat['p50_ms'])} "
            f"| {_ms(lat['p90_ms'])} | {_ms(lat['p99_ms'])} | {ratio:.2f}× "
            f"| {lat['p50_ms'] - base['p50_ms']:+.3f} | {_ratio(lat['p99_ms'], base['p99_ms'])} "
            f"| ≤ {budget:g}× |"
        )
    return out


def _targets(t: Tables) -> list[str]:
    lines: list[str] = []
    floor = t.latency.get(FLOOR_LATENCY)
    tnx = t.latency.get(TOOLNEXUS)
    if floor and tnx:
        r50 = tnx[0]["p50_ms"] / floor[0]["p50_ms"]
        r99 = tnx[0]["p99_ms"] / floor[0]["p99_ms"]
        lines.append(
            f"- {'✅' if r50 <= 1.5 else '❌'} round-trip p50 {_ms(tnx[0]['p50_ms'])} ms = "
            f"**{r50:.2f}×** the floor's {_ms(floor[0]['p50_ms'])} ms (target ≤ 1.5×)"
        )
        lines.append(
            f"- {'✅' if r99 <= 2 else '❌'} round-trip p99 {_ms(tnx[0]['p99_ms'])} ms = "
            f"**{r99:.2f}×** the floor's {_ms(floor[0]['p99_ms'])} ms (target ≤ 2×)"
        )
        signed = t.latency.get(("toolnexus", "signed"))
        if signed:
            s50 = signed[0]["p50_ms"] / floor[0]["p50_ms"]
            lines.append(
                f"- {'✅' if s50 <= 2 else '❌'} round-trip p50 with signatures required "
                f"{_ms(signed[0]['p50_ms'])} ms = **{s50:.2f}×** the floor's (target ≤ 2×; "
                f"{signed[0]['p50_ms'] / tnx[0]['p50_ms']:.2f}× unsigned)"
            )
    lines += _channel_targets(t)
    top = max((c for c, _w, _n in _levels(t)), default=0)
    for key in sorted(k for k in t.throughput if k[0] == "toolnexus"):
        tp = t.per_s(key, top)
        pooled = t.per_s(floor_throughput_key(key[1]), top)
        coalesced = t.per_s(floor_throughput_key(key[1], "coalesced"), top)
        if tp is None or not pooled or not coalesced:
            continue
        share, share_c = tp / pooled, tp / coalesced
        if key[1] == "serve":  # the README's responder: the target of SPEC §13
            mark = "✅" if share >= 1.0 else "❌"
            target = "target ≥ 100% of the pooled floor"
        else:
            mark, target = "·", "for comparison"
        lines.append(
            f"- {mark} {top:,} concurrent waits ({key[1]}): {tp:,.0f} round trips/s = "
            f"**{share:.0%}** of the pooled floor's {pooled:,.0f}/s, **{share_c:.0%}** of the "
            f"coalesced floor's {coalesced:,.0f}/s ({target})"
        )
        same = t.per_s(("floor", "same writes"), top)
        if key[1] == "serve" and same:
            lines.append(
                f"- {'✅' if tp >= same else '❌'} {top:,} concurrent waits (serve) against a "
                f"coalesced floor that also makes toolnexus's Redis writes (state, route, "
                f"event, audit record; no checks): **{tp / same:.0%}** of its {same:,.0f}/s "
                f"(target ≥ 100%)"
            )
    wake = t.wakeup.get(TOOLNEXUS)
    if wake:
        alone, loaded, pending = wake
        ratio = loaded["p50_ms"] / alone["p50_ms"]
        floor_wake = t.wakeup.get(("floor", "coalesced"))
        floor_text = (
            f"; the floor: {floor_wake[1]['p50_ms'] / floor_wake[0]['p50_ms']:.2f}×"
            if floor_wake
            else ""
        )
        lines.append(
            f"- {'✅' if ratio <= 1.5 else '❌'} answer wake-up with {pending:,} other waits "
            f"pending: p50 {_ms(loaded['p50_ms'])} ms = **{ratio:.2f}×** the p50 with none, "
            f"{_ms(alone['p50_ms'])} ms (target ≤ 1.5×{floor_text})"
        )
    if tnx:
        peers = [(k, v[0]) for k, v in t.latency.items() if k[0] in PEERS]
        if peers:
            (pk, best) = min(peers, key=lambda kv: kv[1]["p50_ms"])
            ok = all(tnx[0]["p50_ms"] < lat["p50_ms"] for _k, lat in peers)
            lines.append(
                f"- {'✅' if ok else '❌'} p50 faster than every peer: the fastest peer, "
                f"{pk[0]} ({pk[1]}), takes {_ms(best['p50_ms'])} ms = "
                f"**{best['p50_ms'] / tnx[0]['p50_ms']:.1f}×** toolnexus's p50"
            )
    base = next((s for s in t.scale if s["case"] == "bare task"), None)
    floor_scale = next((s for s in t.scale if s["case"] == "floor"), None)
    for s in t.scale:
        if s["case"] != "toolnexus":
            continue
        sc = s["scale"]
        beyond = sc["per_wait_bytes"] - (base["scale"]["per_wait_bytes"] if base else 0)
        constant = sc["connections"] == sc["connections_at_one"]
        vs_floor = (
            f"; the floor, measured alike: {_bytes(floor_scale['scale']['per_wait_bytes'])}"
            if floor_scale
            else ""
        )
        lines.append(
            f"- {'✅' if beyond <= 2048 else '❌'} {sc['waits']:,} pending waits: "
            f"**{_bytes(sc['per_wait_bytes'])}** RSS per wait, {_bytes(beyond)} beyond a bare "
            f"asyncio task awaiting a future (target ≤ 2 KiB beyond the request{vs_floor})"
        )
        lines.append(
            f"- {'✅' if constant else '❌'} Redis connections: **{sc['connections']}** with "
            f"{sc['waits']:,} waits pending, {sc['connections_at_one']} with one (target: constant)"
        )
    return lines + _fleet_targets(t)


def _ended_kept(mem: dict[str, Any]) -> float:
    """Bytes per ended request that live for its retention (state, route, event): all of
    ``ended_bytes`` but the audit record, which the audit stream's caps bound instead."""
    return float(mem["ended_bytes"] - mem.get("audit_bytes", 0))


def _without_audit(mem: dict[str, Any]) -> str:
    return " without its audit record" if "audit_bytes" in mem else ""


def _audit_beside(mem: dict[str, Any]) -> str:
    """The audit record's bytes per request, and the cap of its stream (older runs: none)."""
    if "audit_bytes" not in mem:
        return ""
    return (
        f"; beside it, its audit record: {mem['audit_bytes']:,.0f} B (the audit stream is "
        f"capped at {mem['audit_max_entries']:,} records, `audit_max_entries`, and trimmed "
        f"by age), {mem['ended_bytes']:,.0f} B in all"
    )


HOLDER_STEADY_MAX = 0.01  # Redis commands per open request per second: "no steady cost"


def _holder_per_broker(idle: dict[str, Any]) -> str:
    """What the holding responder spends per waiter, as a broker's share (absent from
    runs before it was told apart)."""
    if "holder_cmds_per_broker_s" not in idle:
        return ""
    return (
        f"; its looks at each waiter add {idle['holder_cmds_per_broker_s']:.2f} commands/s "
        f"per broker"
    )


def _fleet_targets(t: Tables) -> list[str]:
    lines: list[str] = []
    mem = t.fleet.get("memory")
    if mem:
        ratio = mem["open_bytes"] / mem["floor_open_bytes"]
        kept = _ended_kept(mem)
        ended = kept / mem["request_bytes"]
        lines += [
            f"- {'✅' if ratio <= 2.5 else '❌'} Redis memory per open request "
            f"({mem['requests']:,} open): {mem['open_bytes']:,.0f} B = **{ratio:.2f}×** the "
            f"floor's {mem['floor_open_bytes']:,.0f} B (one XADD of the same request; "
            f"target ≤ 2.5×)",
            f"- {'✅' if ended <= 0.5 else '❌'} Redis memory per ended request during its "
            f"retention{_without_audit(mem)}: {kept:,.0f} B = **{ended:.2f}×** the request's "
            f"{mem['request_bytes']:,} encoded bytes (target ≤ 0.5×){_audit_beside(mem)}",
        ]
    idle = t.fleet.get("idle")
    if idle:
        lines += [
            f"- {'✅' if idle['cmds_per_broker_s'] <= 1 else '❌'} an idle broker "
            f"({idle['brokers']:,} over {idle['processes']} processes, {idle['open_per_broker']} "
            f"open requests each): **{idle['cmds_per_broker_s']:.2f}** Redis commands/s "
            f"(target ≤ 1; the liveness floor: {idle['floor_cmds_per_broker_s']:.2f})",
            f"- {'✅' if idle['holder_cmds_per_request_s'] <= HOLDER_STEADY_MAX else '❌'} "
            f"an open request held by a responder: **{idle['holder_cmds_per_request_s']:.3f}** "
            f"Redis commands/s beyond its broker's (target: no steady cost, "
            f"≤ {HOLDER_STEADY_MAX}){_holder_per_broker(idle)}",
        ]
    dead = t.fleet.get("dead waiters")
    if dead:
        bound = dead["liveness_s"] + 5
        lines.append(
            f"- {'✅' if dead['withdrawn_after_s'] <= bound else '❌'} a killed agent's "
            f"{dead['requests']:,} open requests withdrawn **{dead['withdrawn_after_s']:.1f} s** "
            f"after the kill (target ≤ liveness {dead['liveness_s']:.0f} s + 5 s)"
        )
    chan = t.fleet.get("channels")
    if chan:
        cost = chan["cpu_us_per_request_group"] * chan["groups"]
        ratio = cost / chan["one_group_cpu_us_per_request"]
        p50 = chan["lag_p50_ms"].values()
        spread = max(p50) / min(p50) if p50 and min(p50) > 0 else math.nan
        lines += [
            f"- {'✅' if ratio <= chan['groups'] else '❌'} {chan['groups']} consumer groups "
            f"on one queue: Redis CPU {cost:,.0f} µs per round trip = **{ratio:.2f}×** one "
            f"group's {chan['one_group_cpu_us_per_request']:,.0f} µs (target ≤ "
            f"{chan['groups']}×)",
            f"- {'✅' if spread <= 2 else '❌'} the slowest group's p50 delivery lag = "
            f"**{spread:.2f}×** the fastest's (target ≤ 2×)",
        ]
    dur = t.fleet.get("durable")
    if dur:
        reads = dur["durable_reads_per_answer"]
        lines.append(
            f"- {'✅' if reads <= 2 else '❌'} a durable answer with {dur['waiters']:,} durable "
            f"waiters (one identity each) is read by **{reads:.1f}** processes (XREAD calls "
            f"beyond the idle rate; without durable: {dur['plain_reads_per_answer']:.1f}; "
            f"target: O(1), ≤ 2)"
        )
    return lines + _cluster_targets(t)


def _shares(cpu: list[float]) -> list[float]:
    total = sum(cpu)
    return [c / total if total > 0 else math.nan for c in cpu]


def _agents(clu: dict[str, Any], waiters: list[int] | None = None) -> str:
    """Who asked, in the Cluster case (a run before the case had ``agents`` had one broker
    per queue in one process, one waiter identity each), and where their waiters fell."""
    agents = clu.get("agents")
    if agents is None:
        return "one waiting broker per queue (a waiter each)"
    where = (
        f"; their waiters on masters 1–{len(waiters)}: {'/'.join(str(w) for w in waiters)}"
        if waiters
        else ""
    )
    return (
        f"{agents} agents (a waiter each, asking in turn, {clu.get('concurrency', 20)} at a "
        f"time{where})"
    )


def _cluster_targets(t: Tables) -> list[str]:
    clu = t.fleet.get("cluster")
    if not clu:
        return []
    lines = []
    queue_master = clu.get("one_queue_master")
    on = f", on master {queue_master + 1}" if queue_master is not None else ""
    for what, cpu, cmds, alone, waiters in (
        (f"one queue (its keys share one slot by design{on})", clu["one_queue_cpu_us"],
         clu["one_queue_cmds"], clu["standalone_cpu_us"], clu.get("one_queue_waiters")),
        (f"{clu['queues']} queues", clu["several_cpu_us"], clu["several_cmds"],
         clu["standalone_several_cpu_us"], clu.get("several_waiters")),
    ):  # fmt: skip
        shares = _shares(cpu)
        ok = all(1 / 6 <= share <= 2 / 3 for share in shares)
        lines.append(
            f"- {'✅' if ok else '❌'} the 3-master Cluster's Redis CPU per round trip, "
            f"{what}, asked by {_agents(clu, waiters)}: each master's share "
            f"**{', '.join(f'{x:.0%}' for x in shares)}** "
            f"(of the commands: {', '.join(f'{x:.0%}' for x in _shares(cmds))}; "
            f"{sum(cpu):,.0f} µs in all = {_ratio(sum(cpu), alone)} one standalone node's "
            f"{alone:,.0f} µs; target: each within 2× of an even third, 17–67%)"
        )
    on_masters = sorted({index for index, _slot, _n in clu["durable_states"].values()})
    lines.append(
        f"- · one agent's durable states on one queue share one slot, by design: on each of "
        f"{len(clu['durable_states'])} queues all on one master; over the queues on "
        f"{len(on_masters)} of {len(clu['masters'])} masters (Cluster table)"
    )
    return lines


def _full_sweep(idle: dict[str, Any]) -> str:
    """How often the holder read every request's state, as the run measured it (a third
    of the lease before the full sweep was made rare)."""
    seconds = idle.get("full_sweep_s")
    if seconds is None:
        return "third of the lease"
    return f"{seconds:.0f} s, long after the window: added by that count"


def _by_command(rates: dict[str, float], digits: int = 2) -> str:
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in rates.items()) or "–"


def _table(intro: str, columns: str, align: str, row: str) -> list[str]:
    """A paragraph and a one-row table under it."""
    return ["", intro, "", columns, align, row]


def _fleet_section(t: Tables) -> list[str]:
    if not t.fleet:
        return []
    out = [
        "",
        "## Fleet: what agents cost the Redis they share",
        "",
        "Agents and responders in processes of their own; figures read from the server "
        "(`INFO memory`, `INFO commandstats`, `INFO cpu`), so they count every client's work "
        "(`bench/fleet.py`).",
    ]
    mem = t.fleet.get("memory")
    if mem:
        kept = _ended_kept(mem)
        out += _table(
            f"Memory: {mem['settings']}. Floor: one `XADD` of the same encoded request each. "
            "Ended: the same requests withdrawn, during their retention; in all, and without "
            "the audit record (the state, route and event, which live for the retention; the "
            "audit stream is capped by count, `audit_max_entries`, and by age).",
            "| requests | encoded request B | floor B/request | open B/request | vs floor "
            "| ended B/request, in all | audit record B | ended without it | vs request bytes |",
            "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            f"| {mem['requests']:,} | {mem['request_bytes']:,} | {mem['floor_open_bytes']:,.0f} "
            f"| {mem['open_bytes']:,.0f} | {_ratio(mem['open_bytes'], mem['floor_open_bytes'])} "
            f"| {mem['ended_bytes']:,.0f} | {mem.get('audit_bytes', 0):,.0f} | {kept:,.0f} "
            f"| {_ratio(kept, mem['request_bytes'])} |",
        )
    idle = t.fleet.get("idle")
    if idle:
        out += _table(
            f"Idle: {idle['settings']}, nobody answering; then a responder holding every "
            "request (as a web page showing them does): its extra per open request (lease "
            "renewals, many ids per `XCLAIM`; its blocking reads of the requests and of the "
            "events, which tell it of resolutions elsewhere; the full sweep, one `HMGET` per "
            f"request every {_full_sweep(idle)}) and per waiter (an `EXISTS` of its liveness "
            "mark every third of the liveness bound, and the full sweep's script call), shown "
            "per broker. Floor: one `SET ... PX` per agent every third of the liveness bound "
            f"({idle['liveness_s']:.0f} s).",
            "| brokers | processes | open each | floor cmd/s per broker | cmd/s per broker "
            "| by command | Redis CPU µs/s per broker | holder cmd/s per open request "
            "| by command | holder cmd/s per broker | holder Redis CPU µs/s per open request |",
            "|--:|--:|--:|--:|--:|---|--:|--:|---|--:|--:|",
            f"| {idle['brokers']:,} | {idle['processes']} | {idle['open_per_broker']} "
            f"| {idle['floor_cmds_per_broker_s']:.2f} | {idle['cmds_per_broker_s']:.2f} "
            f"| {_by_command(idle['commands'])} | {idle['cpu_us_per_broker_s']:.0f} "
            f"| {idle['holder_cmds_per_request_s']:.3f} "
            f"| {_by_command(idle['holder_commands'], 3)} "
            f"| {idle.get('holder_cmds_per_broker_s', 0.0):.2f} "
            f"| {idle['holder_cpu_us_per_request_s']:.1f} |",
        )
    dead = t.fleet.get("dead waiters")
    if dead:
        commands = ", ".join(f"{k} {v:,}" for k, v in dead["withdraw_commands"].items()) or "–"
        out += _table(
            f"Dead waiters: {dead['settings']}; the time until the last is withdrawn, and "
            "the Redis commands and CPU from the kill until then. Floor: the liveness bound.",
            "| requests | liveness s | withdrawn after s | vs liveness | Redis commands "
            "| Redis CPU s |",
            "|--:|--:|--:|--:|---|--:|",
            f"| {dead['requests']:,} | {dead['liveness_s']:.0f} | "
            f"{dead['withdrawn_after_s']:.1f} "
            f"| {_ratio(dead['withdrawn_after_s'], dead['liveness_s'])} | {commands} "
            f"| {dead['withdraw_cpu_s']:.2f} |",
        )
    chan = t.fleet.get("channels")
    if chan:
        out += _table(
            f"Many channels: {chan['settings']}. Floor: one group. Lag: from a request's "
            "creation to its delivery to the group's responder.",
            "| groups | Redis CPU µs per round trip, one group | per round trip per group "
            "| vs one group | p50 lag ms by group | p99 lag ms by group |",
            "|--:|--:|--:|--:|---|---|",
            f"| {chan['groups']} | {chan['one_group_cpu_us_per_request']:,.0f} "
            f"| {chan['cpu_us_per_request_group']:,.0f} "
            f"| {_ratio(chan['cpu_us_per_request_group'], chan['one_group_cpu_us_per_request'])} "
            f"| {_by_command(chan['lag_p50_ms'], 1)} | {_by_command(chan['lag_p99_ms'], 1)} |",
        )
    dur = t.fleet.get("durable")
    if dur:
        out += _table(
            f"Durable waits at scale: {dur['settings']}. Floor: the same fleet waiting "
            "without `durable`. Reads: XREAD calls an answer causes beyond the idle rate "
            "(the processes it wakes); wake-up: from `accept()` to the waiting task's "
            "return; CPU: Redis CPU per answer beyond the idle rate.",
            "| waiters | processes | answers | reads per answer, durable | without "
            "| wake-up p50 ms, durable | without | Redis CPU µs per answer, durable "
            "| without |",
            "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            f"| {dur['waiters']:,} | {dur['processes']} | {dur['answers']} "
            f"| {dur['durable_reads_per_answer']:.2f} | {dur['plain_reads_per_answer']:.2f} "
            f"| {_ms(dur['durable_wake_p50_ms'])} | {_ms(dur['plain_wake_p50_ms'])} "
            f"| {dur['durable_cpu_us_per_answer']:,.0f} | {dur['plain_cpu_us_per_answer']:,.0f} |",
        )
    return out + _cluster_section(t) + _sizing(t)


def _cluster_section(t: Tables) -> list[str]:
    clu = t.fleet.get("cluster")
    if not clu:
        return []
    q = clu["queues"]
    one, several = _shares(clu["one_queue_cpu_us"]), _shares(clu["several_cpu_us"])
    rows = [
        f"| standalone node | all | – | {clu['standalone_cpu_us']:,.0f} | – "
        f"| {clu['standalone_cmds']:.1f} | {clu['standalone_several_cpu_us']:,.0f} | – "
        f"| {clu['standalone_several_cmds']:.1f} | – |"
    ]
    one_waiters, several_waiters = clu.get("one_queue_waiters"), clu.get("several_waiters")
    for i, slots in enumerate(clu["masters"]):
        waiters = (
            f"{one_waiters[i]} / {several_waiters[i]}" if one_waiters and several_waiters else "–"
        )
        rows.append(
            f"| master {i + 1} | {slots} | {clu['queues_per_master'][i]} "
            f"| {clu['one_queue_cpu_us'][i]:,.0f} | {one[i]:.0%} | {clu['one_queue_cmds'][i]:.1f} "
            f"| {clu['several_cpu_us'][i]:,.0f} | {several[i]:.0%} "
            f"| {clu['several_cmds'][i]:.1f} | {waiters} |"
        )
    total = (
        f"{sum(one_waiters)} / {sum(several_waiters)}" if one_waiters and several_waiters else "–"
    )
    rows.append(
        f"| Cluster | all | {q} | {sum(clu['one_queue_cpu_us']):,.0f} | 100% "
        f"| {sum(clu['one_queue_cmds']):.1f} | {sum(clu['several_cpu_us']):,.0f} | 100% "
        f"| {sum(clu['several_cmds']):.1f} | {total} |"
    )
    durable = ", ".join(
        f"{queue} → master {index + 1} (slot {slot:,}, {n} states)"
        for queue, (index, slot, n) in clu["durable_states"].items()
    )
    return [
        "",
        f"Cluster share: {clu['settings']}; with one queue, and spread over {q} queues "
        f"(`q-0` … `q-{q - 1}`; "
        + (f"agent i on queue i mod {q}" if "agents" in clu else "one waiting broker each")
        + "; the responder process has one broker per queue), first on the standalone node "
        "(the floor), then on the Cluster. "
        "Redis CPU per round trip on each node beyond its idle rate (`INFO cpu`), commands "
        "per round trip (`INFO commandstats`, without connection set-up). One queue's keys "
        "hash to one slot by design (`{ns:q:queue}`), and a waiter's keys to its own slot "
        "(`{ns:w:waiter}`, a waiter's id random in every process): with one queue the "
        "queue's master does the queue's share of the work and the waiters' share spreads "
        "as their slots fall (last column), with several the queues spread over the masters "
        "too. Commands count those a script calls as well as the script itself.",
        "",
        "| node | slots | queues' slots served | Redis CPU µs per round trip, one queue "
        f"| share | commands | µs, {q} queues | share | commands "
        f"| agents' waiters, one queue / {q} |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        *rows,
        *_queue_master_commands(clu),
        "",
        "Durable states: one agent (`agent-0`) with durable waits on each queue. Its durable "
        "states on one queue share one slot by design (`{ns:w:agent.queue-hash}`), so they "
        "all land on one master; its states on other queues land on other slots: "
        f"{durable}.",
    ]


def _queue_master_commands(clu: dict[str, Any]) -> list[str]:
    """With one queue, what its master runs per round trip, by command (calls, and the µs
    inside them from commandstats: a script's include the commands it calls)."""
    index, by_command = clu.get("one_queue_master"), clu.get("one_queue_commands")
    if index is None or not by_command:
        return []
    top = sorted(by_command[index].items(), key=lambda kv: -kv[1][1])[:8]
    lookups = [node.get("command|getkeys", [0.0, 0.0])[0] for node in by_command]
    return [
        "",
        f"With one queue, its master (master {index + 1}) runs per round trip, by command "
        "(calls, µs inside them by `INFO commandstats`; a script's µs include the commands it "
        "calls, which are counted again under their own names): "
        + ", ".join(f"`{name}` {calls:.2f} ({us:.1f} µs)" for name, (calls, us) in top)
        + ". `COMMAND GETKEYS` per round trip on each master (redis-py asks the node its "
        "commands parser uses for the keys of a command it cannot route itself, as it would "
        "each `XREAD` and `XREADGROUP` had toolnexus not named their node; counted with the "
        "round trips' commands): " + ", ".join(f"{x:.2f}" for x in lookups) + ".",
    ]


SIZING_CPU_US_S = 500_000  # half of the one core a Redis node runs its commands on
SIZING_MEMORY = 1024**3  # used_memory given to toolnexus on one node


def _sizing(t: Tables) -> list[str]:
    """What one Redis node holds, from this run's fleet figures and a stated budget."""
    mem, idle, chan = t.fleet.get("memory"), t.fleet.get("idle"), t.fleet.get("channels")
    rows: list[str] = []
    budget = f"{SIZING_CPU_US_S:,} µs/s"
    if idle and idle["cpu_us_per_broker_s"] > 0:
        per = idle["cpu_us_per_broker_s"]
        rows.append(
            f"| idle agents (brokers) | {budget} ÷ {per:,.0f} µs/s each "
            f"| {SIZING_CPU_US_S / per:,.0f} | Redis CPU |"
        )
    if mem:
        rows += [
            f"| open requests | 1 GiB ÷ {mem['open_bytes']:,.0f} B each "
            f"| {SIZING_MEMORY / mem['open_bytes']:,.0f} | memory |",
            f"| ended requests kept for their retention (with their audit records) "
            f"| 1 GiB ÷ {mem['ended_bytes']:,.0f} B "
            f"each | {SIZING_MEMORY / mem['ended_bytes']:,.0f} | memory |",
        ]
    if idle and idle["holder_cmds_per_request_s"] > 0:
        per_cmd = idle["holder_cmds_per_request_s"]
        rows.append(
            f"| open requests held by responders | 10,000 commands/s ÷ {per_cmd:.3f} "
            f"commands/s each | {10_000 / per_cmd:,.0f} | Redis commands (10,000/s given "
            f"to the responders holding them) |"
        )
    if chan and chan["one_group_cpu_us_per_request"] > 0:
        per = chan["one_group_cpu_us_per_request"]
        rows.append(
            f"| answers per second (one channel) | {budget} ÷ {per:,.0f} µs per round trip "
            f"| {SIZING_CPU_US_S / per:,.0f} | Redis CPU |"
        )
    clu = t.fleet.get("cluster")
    if clu and max(clu["several_cpu_us"]) > 0:
        busiest = max(clu["several_cpu_us"])
        rows.append(
            f"| answers per second (3-master Cluster, {clu['queues']} queues) | {budget} ÷ "
            f"{busiest:,.0f} µs per round trip on the busiest master "
            f"| {SIZING_CPU_US_S / busiest:,.0f} | the busiest master's Redis CPU |"
        )
    if not rows:
        return []
    return [
        "",
        "### Sizing one Redis node",
        "",
        f"Each figure alone, from this run: Redis CPU at {budget} (half the core Redis runs "
        "commands on), memory at 1 GiB of `used_memory`. A fleet uses several at once: add "
        "the fractions. A 3-master Cluster holds as much more as its busiest master leaves room "
        "for (the Cluster share table: with several queues the work spreads; one queue's "
        "keys stay on one master).",
        "",
        "| what | arithmetic | one node | bound by |",
        "|---|---|--:|---|",
        *rows,
    ]


def _levels(t: Tables) -> list[tuple[int, int, int]]:
    rows = t.throughput.get(FLOOR_THROUGHPUT) or next(iter(t.throughput.values()), [])
    return [(r["concurrency"], r["warmup"], n) for r, n, _s in rows]


def render(t: Tables, machine: Machine, elapsed_s: float, note: str) -> str:
    out: list[str] = ["# toolnexus benchmarks", ""]
    if note:
        out += [f"> {note}", ""]
    out += [
        "Generated by `python -m bench` (regenerates this file and `results.png`). "
        "Round trip = an agent's `Request` published to Redis, read by a responder in another "
        "process, answered, and the `Answer` back in the waiting coroutine. Every case uses "
        "the same request and answer data and the same private `redis-server` "
        "(no persistence), one case process at a time.",
        "",
        "![latency and throughput](results.png)",
        "",
        "## Machine",
        "",
        f"- {machine['date']}, run took {elapsed_s / 60:.1f} min",
        f"- CPU: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']:.0f} GiB",
        f"- {machine['kernel']}; {machine['python']}; redis-server {machine['redis_server']}",
        "- " + ", ".join(f"{k} {v}" for k, v in machine["packages"].items()),
        f"- toolnexus commit {machine['commit']}; measured code: {machine['toolnexus_source']}",
        "",
        "## Targets",
        "",
        *_targets(t),
        "",
        "## Round-trip latency, one wait at a time",
        "",
        f"Samples pooled over {t.latency_rounds} alternating round(s) for floor and toolnexus, "
        "each case in a fresh process (a process's p50 moves with where the scheduler puts "
        "it); "
        "warm-up round trips excluded (counted in the warm-up column). "
        "Ratios are to the floor's figure.",
        "",
        "| case | variant | settings | samples | warm-up | p50 ms | p90 ms | p99 ms "
        "| p50 vs floor | p99 vs floor |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    order = sorted(
        ((k, v) for k, v in t.latency.items() if k[0] != "channel"),
        key=lambda kv: (kv[0][0] not in ("floor", "toolnexus"), kv[1][0]["p50_ms"]),
    )
    for (case, variant), (lat, settings) in order:
        own_loop = case in ("floor", "toolnexus")
        floor = t.latency.get(floor_latency_key(variant) if own_loop else FLOOR_LATENCY)
        out.append(
            f"| {case} | {variant} | {settings} | {lat['n']:,} | {lat['warmup']:,} "
            f"| {_ms(lat['p50_ms'])} | {_ms(lat['p90_ms'])} | {_ms(lat['p99_ms'])} "
            f"| {_ratio(lat['p50_ms'], floor[0]['p50_ms'] if floor else None)} "
            f"| {_ratio(lat['p99_ms'], floor[0]['p99_ms'] if floor else None)} |"
        )
    out += _channels_section(t)
    out += [
        "",
        "## Throughput with concurrent waits",
        "",
        "Each of N coroutines waits for an answer and publishes its next request as soon as "
        "it has it. Round trips per second of the median round; p50/p99 are the latency of "
        "one round trip under that load. Ratio to the floor on the same event loop (one XADD "
        "per wait over a pool).",
        "",
        "| case | variant | concurrent waits | round trips (all rounds) | round trips/s "
        "| vs floor | p50 ms | p99 ms | settings |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for (case, variant), rows in sorted(t.throughput.items()):
        for tp, n, settings in rows:
            floor_per_s = t.per_s(floor_throughput_key(variant), tp["concurrency"])
            out.append(
                f"| {case} | {variant} | {tp['concurrency']:,} | {n:,} | {tp['per_s']:,.0f} "
                f"| {_ratio(tp['per_s'], floor_per_s)} | {_ms(tp['p50_ms'])} "
                f"| {_ms(tp['p99_ms'])} | {settings} |"
            )
    out += [
        "",
        "## Answer wake-up with other waits pending",
        "",
        "One process, one round trip at a time (as in the latency table, but through the "
        "client that serves concurrent waits): first with no other wait pending, then with "
        "that many other waits published that no responder answers (toolnexus: an allow-list "
        "naming nobody; floor: a marker field). Samples pooled over the rounds.",
        "",
        "| case | variant | other waits pending | samples | p50 alone ms | p50 with them ms "
        "| ratio | p99 alone ms | p99 with them ms | settings |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    wake_settings = {
        (r.get("case", "?"), r.get("variant", "")): r.get("settings", "") for r in t.results
    }
    for (case, variant), (alone, loaded, pending) in sorted(t.wakeup.items()):
        out.append(
            f"| {case} | {variant} | {pending:,} | {loaded['n']:,} | {_ms(alone['p50_ms'])} "
            f"| {_ms(loaded['p50_ms'])} | {_ratio(loaded['p50_ms'], alone['p50_ms'])} "
            f"| {_ms(alone['p99_ms'])} | {_ms(loaded['p99_ms'])} "
            f"| {wake_settings.get((case, variant), '')} |"
        )
    out += [
        "",
        "## Scale: pending waits in one process",
        "",
        "All waits published, none answered: RSS growth of the waiting process (after a full "
        "GC; floor and toolnexus run the same harness, `bench/harness.py`: requests built "
        "before the baseline, one task per wait, one deadline timer for all), Redis "
        "connections it holds "
        "(CLIENT LIST entries whose port is one of the process's sockets), then the time from "
        "the responder starting to answer until every wait has its answer. "
        "`bare task` is the same number of asyncio tasks each awaiting a future: no broker.",
        "",
        "| case | variant | waits | RSS growth | per wait | per wait beyond bare task "
        "| Redis connections (1 wait → all) | publish all s | resolve all s |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    base = next((s for s in t.scale if s["case"] == "bare task"), None)
    for s in t.scale:
        sc = s["scale"]
        beyond = (
            _bytes(sc["per_wait_bytes"] - base["scale"]["per_wait_bytes"])
            if base and s is not base
            else "–"
        )
        conns = "–" if s is base else f"{sc['connections_at_one']} → {sc['connections']}"
        out.append(
            f"| {s['case']} | {s.get('variant', '')} | {sc['waits']:,} "
            f"| {_bytes(sc['rss_delta_bytes'])} | {_bytes(sc['per_wait_bytes'])} | {beyond} "
            f"| {conns} | {sc['publish_s']:.2f} | {sc['resolve_s']:.2f} |"
        )
    out += [
        "",
        "## Codec: one typical message",
        "",
        f"Per call, {t.codec_settings}. `stdlib json` encodes the message as a dict and "
        "decodes to a dict (no validation); pydantic validates into models of the same shape.",
        "",
        "| codec | message | bytes | encode µs | decode µs | encode + decode µs "
        "| vs toolnexus MSGPACK |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    ref = {
        row["message"]: row["encode_us"] + row["decode_us"]
        for row in t.codec
        if row["codec"] == "toolnexus MSGPACK"
    }
    for crow in t.codec:
        total = crow["encode_us"] + crow["decode_us"]
        out.append(
            f"| {crow['codec']} | {crow['message']} | {crow['bytes']} | {crow['encode_us']:.2f} "
            f"| {crow['decode_us']:.2f} | {total:.2f} | {_ratio(total, ref.get(crow['message']))} |"
        )
    out += _fleet_section(t)
    out += [
        "",
        "## How it is measured",
        "",
        "- One private `redis-server --save '' --appendonly no` on a free loopback port; "
        "FLUSHALL between cases; each case in a fresh Python process, its responder or "
        "worker in another process started by the case and stopped after it.",
        "- Payload: the same request data (a 5-field dict, ~230 bytes as JSON) and answer data "
        "in every case, each library carrying it in its own envelope and serializer.",
        "- Floor latency: `XADD` request → responder `XREADGROUP BLOCK` → `XADD` answer + `XACK` "
        "in one pipeline → waiter's `XREAD BLOCK` on its reply stream, on one connection, no "
        "background task. Floor throughput: one blocking reader demultiplexes answers to "
        "futures by id; requests go out one `XADD` per wait over a 50-connection pool "
        "(`pool`) or coalesced per event-loop turn into one pipeline (`coalesced`).",
        "- toolnexus: `toolnexus.connect(url)` with its defaults; the responder process is "
        "`async for pending in broker.responder(...): await pending.accept(data)` "
        "(`default`), starts one task per pending (`concurrent accepts`), or is "
        "`toolnexus.serve(broker, worker)` with its defaults, the README's responder SDK "
        "(`serve`: up to 100 `show()` calls at once, each `await pending.accept(data)`).",
        "- Rows marked `uvloop` ran the case process and its responder on uvloop's event loop "
        "(`python -m bench --uvloop auto|yes|no`; auto: when it is installed).",
        "- Peers: one worker process each, started by the benchmark. `default` = the "
        "library's default poll intervals; `min poll` = every poll interval at "
        "0.001 s (arq's worker `poll_delay` and `job.result(poll_delay=...)`, Celery's "
        "`AsyncResult.get(interval=...)`, taskiq's `wait_result(check_interval=...)`). RQ "
        "has no poll interval on this path (`BLPOP` dequeue, `XREAD BLOCK` result), so its "
        "second row uses `SimpleWorker` (no fork per job) instead.",
        "- Percentiles interpolate linearly between the sorted samples.",
    ]
    if t.problems:
        out += ["", "## Skipped or failed", ""]
        for p in t.problems:
            what = f"{p.get('case', '?')} {p.get('variant', '')}".strip()
            if "skipped" in p:
                out.append(f"- {what}: skipped ({p['skipped']})")
            else:
                lines = p["error"].strip().splitlines() or ["?"]
                out.append(f"- {what}: **failed**: `{lines[-1]}`")
    return "\n".join(out) + "\n"


def chart(t: Tables, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.5))
    items = sorted(t.latency.items(), key=lambda kv: kv[1][0]["p50_ms"])
    labels = [f"{c} ({v})" if v else c for (c, v), _ in items]
    p50 = [lat["p50_ms"] for _k, (lat, _s) in items]
    p99 = [lat["p99_ms"] for _k, (lat, _s) in items]
    y = list(range(len(items)))
    ax1.barh([i + 0.2 for i in y], p50, height=0.4, label="p50", color="#3b7dd8")
    ax1.barh([i - 0.2 for i in y], p99, height=0.4, label="p99", color="#f0a030")
    ax1.set_yticks(y, labels)
    ax1.set_xscale("log")
    ax1.set_xlabel("round-trip latency, ms (log scale)")
    ax1.set_title("Sequential round trip")
    ax1.legend(loc="lower right")
    ax1.grid(axis="x", which="both", alpha=0.3)

    series = sorted(t.throughput.items())
    levels = sorted({row["concurrency"] for _k, rows in series for row, _n, _s in rows})
    width = 0.8 / max(1, len(series))
    for i, ((case, variant), rows) in enumerate(series):
        by_c = {row["concurrency"]: row["per_s"] for row, _n, _s in rows}
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(levels))]
        ax2.bar(xs, [by_c.get(c, 0.0) for c in levels], width=width, label=f"{case} ({variant})")
    ax2.set_xticks(range(len(levels)), [f"{c:,} wait{'s' if c != 1 else ''}" for c in levels])
    ax2.set_ylabel("round trips / s")
    ax2.set_title("Throughput with concurrent waits")
    if series:
        ax2.legend(fontsize="small")
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(
    t: Tables, results: list[dict[str, Any]], machine: Machine, command: str
) -> dict[str, str]:
    """The run's headline figures by name, written as the report writes them, for pages that
    quote them (``docs_hooks/bench_results.py`` renders ``{{ bench:NAME }}``): the run's date,
    machine and command first, then every figure this run measured."""
    figures = {
        "run.date": machine["date"],
        "run.command": command,
        "run.machine": f"{machine['cpu']}, {machine['cores']} cores, "
        f"{machine['memory_gib']:.0f} GiB; {machine['kernel']}",
        "run.python": machine["python"],
        "run.redis_server": machine["redis_server"],
        "run.commit": machine["commit"],
    }
    lat = {key: lat for key, (lat, _s) in t.latency.items()}
    floor, tnx, signed = (
        lat.get(FLOOR_LATENCY),
        lat.get(TOOLNEXUS),
        lat.get(("toolnexus", "signed")),
    )
    if floor and tnx:
        rounds = {
            key: [
                r["latency"]["p50_ms"]
                for r in results
                if "latency" in r and (r.get("case"), r.get("variant")) == key
            ]
            for key in (FLOOR_LATENCY, TOOLNEXUS)
        }
        figures |= {
            "latency.rounds": str(t.latency_rounds),
            "latency.p50_ms": _ms(tnx["p50_ms"]),
            "latency.p99_ms": _ms(tnx["p99_ms"]),
            "latency.floor_p50_ms": _ms(floor["p50_ms"]),
            "latency.floor_p99_ms": _ms(floor["p99_ms"]),
            "latency.p50_vs_floor": _ratio(tnx["p50_ms"], floor["p50_ms"]),
            "latency.p99_vs_floor": _ratio(tnx["p99_ms"], floor["p99_ms"]),
            "latency.round_p50_min_ms": _ms(min(rounds[TOOLNEXUS])),
            "latency.round_p50_max_ms": _ms(max(rounds[TOOLNEXUS])),
            "latency.floor_round_p50_min_ms": _ms(min(rounds[FLOOR_LATENCY])),
            "latency.floor_round_p50_max_ms": _ms(max(rounds[FLOOR_LATENCY])),
        }
        if signed:
            figures["latency.signed_p50_ms"] = _ms(signed["p50_ms"])
            figures["latency.signed_p50_vs_floor"] = _ratio(signed["p50_ms"], floor["p50_ms"])
        peers = {key: v for key, v in lat.items() if key[0] in PEERS}
        if peers:
            (case, variant), best = min(peers.items(), key=lambda kv: kv[1]["p50_ms"])
            defaults = [v["p50_ms"] for (_c, w), v in peers.items() if w == "default"]
            figures |= {
                "peers.fastest": f"{case} ({variant})",
                "peers.fastest_p50_ms": _ms(best["p50_ms"]),
                "peers.fastest_vs_toolnexus": _ratio(best["p50_ms"], tnx["p50_ms"], 1),
                "peers.default_vs_toolnexus_min": _ratio(min(defaults), tnx["p50_ms"], 0),
                "peers.default_vs_toolnexus_max": _ratio(max(defaults), tnx["p50_ms"], 0),
            }
    for channel, clat, ratio, budget in _channel_rows(t):
        figures |= {
            f"channels.{channel}.p50_ms": _ms(clat["p50_ms"]),
            f"channels.{channel}.p99_ms": _ms(clat["p99_ms"]),
            f"channels.{channel}.vs_broker": f"{ratio:.2f}×",
            f"channels.{channel}.budget": f"{budget:g}×",
        }
    top = max((c for c, _w, _n in _levels(t)), default=0)
    pooled = t.per_s(FLOOR_THROUGHPUT, top)
    coalesced = t.per_s(("floor", "coalesced"), top)
    same = t.per_s(("floor", "same writes"), top)
    figures["throughput.waits"] = f"{top:,}"
    for name, variant in (
        ("serve", "serve"),
        ("accepts", "concurrent accepts"),
        ("default", "default"),
    ):
        per_s = t.per_s(("toolnexus", variant), top)
        if per_s is not None:
            figures[f"throughput.{name}_per_s"] = f"{per_s:,.0f}"
            figures[f"throughput.{name}_vs_pool"] = _ratio(per_s, pooled)
            figures[f"throughput.{name}_vs_coalesced"] = _ratio(per_s, coalesced)
            figures[f"throughput.{name}_vs_same_writes"] = _ratio(per_s, same)
    if same is not None:
        figures["throughput.same_writes_per_s"] = f"{same:,.0f}"
    wake = t.wakeup.get(TOOLNEXUS)
    if wake:
        figures["wakeup.pending"] = f"{wake[2]:,}"
        figures["wakeup.p50_ratio"] = _ratio(wake[1]["p50_ms"], wake[0]["p50_ms"])
    scale = {s["case"]: s["scale"] for s in t.scale}
    if "toolnexus" in scale:
        sc = scale["toolnexus"]
        figures |= {
            "scale.waits": f"{sc['waits']:,}",
            "scale.per_wait_kib": f"{sc['per_wait_bytes'] / 1024:.2f}",
            "scale.connections": str(sc["connections"]),
        }
        if "bare task" in scale:
            beyond = sc["per_wait_bytes"] - scale["bare task"]["per_wait_bytes"]
            figures["scale.beyond_bare_kib"] = f"{beyond / 1024:.2f}"
        if "floor" in scale:
            figures["scale.floor_per_wait_kib"] = f"{scale['floor']['per_wait_bytes'] / 1024:.2f}"
    mem = t.fleet.get("memory")
    if mem:
        figures |= {
            "fleet.request_bytes": f"{mem['request_bytes']:,}",
            "fleet.open_bytes": f"{mem['open_bytes']:,.0f}",
            "fleet.open_vs_floor": _ratio(mem["open_bytes"], mem["floor_open_bytes"]),
            "fleet.ended_bytes": f"{mem['ended_bytes']:,.0f}",
            "fleet.ended_kept_bytes": f"{_ended_kept(mem):,.0f}",
            "fleet.audit_bytes": f"{mem.get('audit_bytes', 0):,.0f}",
        }
    return figures


def write_report(
    out: Path,
    results: list[dict[str, Any]],
    machine: Machine,
    elapsed_s: float,
    note: str = "",
    command: str = "python -m bench",
) -> None:
    t = Tables(results)
    (out / "RESULTS.md").write_text(render(t, machine, elapsed_s, note))
    chart(t, out / "results.png")
    figures = summary(t, results, machine, command)
    (out / "summary.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
