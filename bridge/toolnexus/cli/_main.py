"""The ``toolnexus`` command (SPEC §13). ``toolnexus demo`` runs a whole round trip;
``toolnexus keygen NAME`` makes a signing key; ``toolnexus acl`` (in :mod:`._acl`) writes a
fleet's Redis ACL file; ``ask`` and ``answer`` (in :mod:`._ask`) are an
approval gate for scripts; ``status``, ``check`` and ``audit`` (in :mod:`._ops`) are for
operators. This module holds only the parser and the dispatch.
``toolnexus worker NAME`` runs a responder worker found by its ``toolnexus.workers``
entry point (so workers depend on this package, never the other way round).

Configuration comes from flags, then ``TOOLNEXUS_*`` environment variables
(``TOOLNEXUS_URL`` for the broker), then the defaults of :mod:`..settings` (Redis on this
machine; ``demo`` runs on the embedded ``memory://``). Every command that talks to a broker
takes the same flags (:func:`~toolnexus.settings.connection_parser`), and every error ends
it with the status :mod:`._exits` maps it to.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._hops import parse_duration
from .._numeric import MAX_SECONDS, check_number
from ..errors import ConfigurationError, ToolnexusError
from ..models import Hop
from ..settings import connection_options, connection_parser
from . import _acl as acl
from ._exits import EXIT_ERROR, EXIT_NOT_DONE, EXIT_OK, failed


def duration_s(text: str) -> float:
    """``"90"``, ``"30s"``, ``"10m"``, ``"1.5h"``, ``"2d"``, ``"500ms"`` in seconds (positive,
    at most :data:`~toolnexus._numeric.MAX_SECONDS`)."""
    seconds = parse_duration(text)
    try:
        check_number("duration", seconds)
    except ConfigurationError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a positive duration of at most {MAX_SECONDS:g} s: "
            "use e.g. 90, 30s, 10m, 1h or 2d"
        ) from None
    assert seconds is not None
    return seconds


def _hop(text: str) -> Hop:
    """``"15m=oncall"``: after 15 minutes, queue ``oncall`` too."""
    after, _, queue = text.partition("=")
    if not queue:
        raise argparse.ArgumentTypeError(f"{text!r} is not DURATION=QUEUE (e.g. 15m=oncall)")
    return Hop(after_s=duration_s(after), queue=queue)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not JSON: {exc}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}...: JSON nested too deep") from None


def _meta_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not KEY=VALUE (e.g. ticket=OPS-12)")
    return key, value


def _positive_int(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number of at least 1")
    return number


def command_parser() -> argparse.ArgumentParser:
    """The parser of the ``toolnexus`` command and its subcommands (the CLI reference
    is made from it)."""
    parser = argparse.ArgumentParser(
        prog="toolnexus",
        description="Pause an AI agent for a person anywhere in a fleet.",
    )
    parser.add_argument(
        "--version", action="version", version=f"toolnexus {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        parents=[connection_parser(keys=False, embedded=True, queue_default="demo")],
        help="run a whole round trip: an MCP server asks, a responder answers",
        description=(
            "Run the example MCP booking server, an agent calling its tool through "
            "load_mcp, and a responder answering the form and the authorization it asks "
            "for; then print the tool's result. Needs nothing but this package."
        ),
    )
    demo.add_argument(
        "--responder",
        choices=["terminal", "auto", "none"],
        default="terminal",
        help=(
            "who answers: you, at this terminal (default), an unattended bot, or none here "
            "(responder workers on the --url broker answer)"
        ),
    )
    demo.add_argument("--restaurant", default="Chez Toolnexus", help="where to book")
    keygen = commands.add_parser(
        "keygen",
        help="make an Ed25519 signing key: NAME.key (private) and NAME.pub",
        description=(
            "Write NAME.key (the private key, mode 0600: give it to one process as "
            "TOOLNEXUS_SIGNING_KEY) and NAME.pub (its public line: add it to the "
            "TOOLNEXUS_TRUSTED_KEYS of the processes that verify this one). Existing "
            "files are never replaced."
        ),
    )
    keygen.add_argument("name", metavar="NAME", help="the key's name, e.g. agent-7 or ops-bot")
    keygen.add_argument("--dir", default=".", help="where to write the files (default: here)")
    names = ", ".join(sorted(_workers())) or "none installed"
    worker = commands.add_parser(
        "worker",
        help=f"run a responder worker ({names})",
        description=(
            f"Run a responder worker: {names}. "
            "`toolnexus worker NAME --help` shows the worker's own options."
        ),
    )
    worker.add_argument("name", metavar="NAME", help=f"which worker: {names}")
    worker.add_argument("args", nargs=argparse.REMAINDER, help="the worker's own options")
    _ops_parsers(commands)
    acl.add_parser(commands)
    return parser


def _ops_parsers(commands: Any) -> None:
    """The commands that ask, answer and look: ask, answer, status, check, audit, dead-letters."""
    _ask_parser(commands)
    _answer_parser(commands)
    _status_parser(commands)
    _check_parser(commands)
    _audit_parser(commands)
    _dead_letters_parser(commands)


def _ask_parser(commands: Any) -> None:
    ask = commands.add_parser(
        "ask",
        parents=[connection_parser()],
        help="ask a question and wait: exit 0 accepted, 1 declined, 2 not answered, 3 no broker, "
        "5 refused by a responder, 130 Ctrl-C",
        description=(
            "Publish a question and wait for a responder's answer: an approval gate for shell "
            "pipelines and CI. Accepted: the answer's data is printed as JSON on stdout and "
            "the exit status is 0. Declined: 1. Expired, dismissed or withdrawn: 2 (also bad "
            "usage). The broker unreachable: 3. A responder refused the request (a missing or "
            "bad signature, a key it does not trust): 5, said at once. Ctrl-C: 130, the request "
            "withdrawn. The request id is printed on stderr, so that `toolnexus answer ID` can "
            "answer it; a queue no worker reads is warned about at once."
        ),
    )
    ask.add_argument("prompt", help="the question, as the person will read it")
    what = ask.add_argument_group("what is asked")
    form = what.add_mutually_exclusive_group()
    form.add_argument("--schema", metavar="FILE", help="a JSON Schema form to fill in")
    form.add_argument(
        "--choice",
        action="append",
        metavar="OPTION",
        help='an option to pick (repeat: --choice eu --choice us); data is {"answer": ...}',
    )
    form.add_argument(
        "--data",
        type=_json_value,
        default=None,
        metavar="JSON",
        help="the request's data, for a --kind agreed on with the responders (not a form)",
    )
    what.add_argument(
        "--kind",
        metavar="KIND",
        help="approval (the default), input (with --schema or --choice: the default then), "
        "authorization (with --link: the default then), or a kind the responders know",
    )
    what.add_argument(
        "--link",
        metavar="URL",
        help="the page the person goes to: an authorization's (e.g. an OAuth consent page); "
        "any request may carry one (--url is the broker's)",
    )
    what.add_argument(
        "--meta",
        action="append",
        type=_meta_item,
        metavar="KEY=VALUE",
        help="a note for responders, in the request's meta (repeat; VALUE is text)",
    )
    who = ask.add_argument_group("who asks (the request's source: responders' rules match it)")
    who.add_argument("--agent", metavar="NAME", help="the asking agent (default: 'toolnexus ask')")
    who.add_argument("--server", metavar="NAME", help="the MCP server asking, if any")
    who.add_argument("--tool", metavar="NAME", help="the tool asking, if any")
    ask.add_argument(
        "--timeout",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="how long to wait: 90, 30s, 10m, 1h (default 10m, after the last --escalate hop)",
    )
    ask.add_argument(
        "--escalate",
        action="append",
        type=_hop,
        metavar="DURATION=QUEUE",
        help="unanswered after DURATION, publish it to QUEUE too (repeat: 15m=oncall 1h=managers)",
    )
    ask.add_argument(
        "--allow",
        action="append",
        metavar="NAME",
        help="who may answer: a responder key name or person, * patterns (repeat)",
    )
    ask.add_argument(
        "--quorum",
        type=_positive_int,
        metavar="N",
        help="N accepting answers from distinct persons are needed (with --allow: who)",
    )
    ask.add_argument(
        "--quorum-decline",
        choices=("veto", "count"),
        default="veto",
        help="with --quorum: one decline declines it (veto, the default), or declines are "
        "counted too and whichever side reaches N first decides (count)",
    )
    ask.add_argument(
        "--on-expiry",
        choices=("accept", "decline"),
        help="unanswered in time: accept (with the form's defaults) or decline, marked as a "
        "default (exit 0 or 1); without it, exit 2",
    )
    ask.add_argument(
        "--durable",
        action="store_true",
        help="the question outlives this process: asking again with the same --id attaches "
        "to it (the answer given meanwhile comes back at once)",
    )
    ask.add_argument("--id", metavar="ID", help="the request id (default: a fresh one)")
    ask.add_argument("--json", action="store_true", help="print the whole answer as JSON")


def _answer_parser(commands: Any) -> None:
    answer = commands.add_parser(
        "answer",
        parents=[connection_parser()],
        help="answer a request by id (--accept [JSON], --decline or --dismiss) and confirm it",
        description=(
            "Resolve request ID: the answer is checked against the request's form and "
            "signed when TOOLNEXUS_SIGNING_KEY is set; then wait up to --confirm for the "
            "waiting agent to take it (it checks signatures and allow-lists itself). Exit "
            "status: 0 the waiter took it (the line says what it stored, and who answered), "
            "or a quorum counted the vote; 1 refused, and the line says why: by the broker "
            "(already answered, expired, withdrawn, unknown, not allowed, or invalid for "
            "the form) or by the waiter (it opened the request again, or took another "
            "answer); 2 bad usage; 3 the broker unreachable; 4 sent, not confirmed: no "
            "waiter took it within --confirm (a busy or restarting waiter, a durable "
            "request nobody waits for now: it may yet)."
        ),
    )
    answer.add_argument("id", metavar="ID", help="the request id (toolnexus ask prints it)")
    how = answer.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--accept",
        nargs="?",
        type=_json_value,
        const=None,
        default=argparse.SUPPRESS,
        metavar="JSON",
        help="accept, with the form's data as JSON (e.g. '{\"seats\": 2}')",
    )
    how.add_argument("--decline", action="store_true", help="answer an explicit no")
    how.add_argument("--dismiss", action="store_true", help="close it without a choice")
    answer.add_argument("--person", help="who answered (e.g. ops:alice), recorded and signed")
    answer.add_argument(
        "--confirm",
        type=duration_s,
        default=5.0,
        metavar="DURATION",
        help="how long to wait for the waiter to take or refuse it (default 5s)",
    )


def _status_parser(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        parents=[connection_parser(queue=None, keys=False)],
        help="queues, groups, consumers, heartbeats, dead letters and waiters",
        description=(
            "Per queue and consumer group: open requests and the oldest one's age, "
            "unacknowledged and undelivered entries, consumers with idle time and heartbeat "
            "age, dead letters; and how many waiting processes are alive. Every queue of the "
            "namespace unless --queue names some. --json prints the fields the README lists."
        ),
    )
    status.add_argument("--json", action="store_true", help="print JSON (stable field names)")
    status.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    status.add_argument(
        "--interval",
        type=duration_s,
        default=2.0,
        metavar="DURATION",
        help="with --watch: how often to refresh (default 2s)",
    )
    status.add_argument(
        "--queue",
        action="append",
        default=[q for q in [os.environ.get("TOOLNEXUS_QUEUE")] if q] or None,
        help="a queue to show (repeat; default: $TOOLNEXUS_QUEUE, else every queue)",
    )


def _check_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check",
        parents=[connection_parser(keys=False)],
        help="health probe: exit 0 when Redis answers and the workers have heartbeats",
        description=(
            "Exit 0 when Redis is reachable and the workers named (GROUP, any consumer of "
            "it, or GROUP/CONSUMER) have fresh heartbeats; with none named, at least one "
            "worker of the queue has. Otherwise exit 1 with one line saying why."
        ),
    )
    check.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="GROUP[/CONSUMER]",
        help="a worker that must have a fresh heartbeat (repeat)",
    )
    check.add_argument(
        "--here",
        action="store_true",
        help="count only workers running on this host (a container's own health check)",
    )


def _audit_parser(commands: Any) -> None:
    audit = commands.add_parser(
        "audit",
        parents=[connection_parser(keys=False)],
        help="the audit trail: how each request was resolved, and by whom",
        description=(
            "Print the audit records of resolved requests, oldest first: one timeline merged "
            "from the queue's audit streams (each agent's own, the responders', and the "
            "previous release's). Run it as the ops user, which reads them all."
        ),
    )
    audit.add_argument(
        "--since",
        type=duration_s,
        default=None,
        metavar="DURATION",
        help="only records of the last DURATION (e.g. 1h; default: all kept)",
    )
    audit.add_argument("--id", default=None, help="only the records of this request")
    audit.add_argument("--json", action="store_true", help="print a JSON array of records")
    audit.add_argument(
        "--raw",
        action="store_true",
        help="with --json: also the signed bytes of each record (base64), to verify offline",
    )


def _dead_letters_parser(commands: Any) -> None:
    dead = commands.add_parser(
        "dead-letters",
        help="list, show, requeue or purge a queue's dead letters",
        description=(
            "A queue's dead letters are the entries its readers could not take: a request "
            "that is not readable, not signed, or signed by a key they do not trust; an "
            "unreadable answer or event. Each is kept with the error, the stream and entry "
            "it came from, the consumer group that could not take it (one dead letter per "
            "group: the request stays for the others), and its original fields (bounded in "
            "size). Exit status: 0 done; 1 no "
            "dead letter has that id, or one could not be requeued (the line says why); 2 "
            "bad usage; 3 the broker unreachable."
        ),
    )
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        parents=[connection_parser(keys=False)],
        help="one line each, oldest first: id, when, group, the request it held, the error",
        description="List the queue's dead letters, oldest first.",
    )
    show = actions.add_parser(
        "show",
        parents=[connection_parser(keys=False)],
        help="every field of one dead letter",
        description="Show one dead letter.",
    )
    show.add_argument("id", metavar="ID", help="the dead letter's id (as list prints it)")
    requeue = actions.add_parser(
        "requeue",
        parents=[connection_parser(keys=False)],
        help="put a dead-lettered request back on its queue",
        description=(
            "Put the request a dead letter holds back on the queue's request stream, as it "
            "was (its signature too: responders verify it again, so first fix what refused "
            "it, such as their trusted keys), and delete the dead letter. An entry still in "
            "the stream (for groups that have not read it) is moved to its end, never "
            "copied; a request requeued already is left where it is. Only requests "
            "can be requeued, and only whole ones: a dead letter whose original was cut "
            "to the size limit is refused. Exit status 1 if one could not be."
        ),
    )
    purge = actions.add_parser(
        "purge",
        parents=[connection_parser(keys=False)],
        help="delete dead letters",
        description="Delete one dead letter, or with --all every one of the queue.",
    )
    for parser in (requeue, purge):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("id", nargs="?", metavar="ID", help="the dead letter's id")
        which.add_argument("--all", action="store_true", help="every dead letter of the queue")
    for parser in (listing, show, requeue, purge):
        parser.add_argument("--json", action="store_true", help="print JSON")


def _keygen(args: argparse.Namespace) -> int:
    from ..security._signing import SigningKey

    key = SigningKey.generate(args.name)
    key_path, pub_path = (path.resolve() for path in key.save(args.dir))
    print(f"private key: {key_path}  (mode 0600; TOOLNEXUS_SIGNING_KEY={key_path})")
    print(f"public key:  {pub_path}")
    print("trusted-keys line (add it to TOOLNEXUS_TRUSTED_KEYS of who verifies this key):")
    print(key.public_line())
    return 0


WORKERS_GROUP = "toolnexus.workers"
"""The entry-point group where workers register: ``NAME = "module:main"``."""

DISTRIBUTION = "toolnexus-bridge"
"""This project's name on the package index (which gives ``toolnexus`` to the agent toolkit):
the name its metadata and its extras are found by."""


def _version() -> str:
    """This project's installed version (``toolnexus-bridge``, as its metadata says)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install toolnexus-bridge)"


def _workers() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=WORKERS_GROUP)}


def _extras() -> set[str]:
    try:
        metadata = importlib.metadata.metadata(DISTRIBUTION)
        return set(metadata.get_all("Provides-Extra") or [])
    except importlib.metadata.PackageNotFoundError:
        return set()


def _worker(args: argparse.Namespace) -> int:
    """Load worker ``args.name`` and run its ``main(argv)``."""
    workers = _workers()
    entry = workers.get(args.name)
    if entry is None:
        known = ", ".join(sorted(workers)) or "none"
        print(f"toolnexus: no worker named {args.name!r} (installed: {known})", file=sys.stderr)
        return EXIT_ERROR
    try:
        main: Callable[[Sequence[str]], int] = entry.load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in ("toolnexus", "toolnexus_workers") or not missing:
            raise
        extra = entry.name if entry.name in _extras() else None
        fix = f": pip install '{DISTRIBUTION}[{extra}]'" if extra else ""
        print(
            f"toolnexus worker {entry.name} needs {missing!r}, which is not installed{fix}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return main(args.args)


async def _demo(args: argparse.Namespace) -> int:
    from ..mcp._sdk import require_mcp2

    require_mcp2("toolnexus demo")
    from ._demo import RECAP, result_text, run_demo

    result = await run_demo(
        args.url,
        responder=args.responder,
        restaurant=args.restaurant,
        namespace=args.namespace,
        queue=args.queue,
    )
    print(f"\nTool result: {result_text(result)}")
    print(RECAP)
    return 1 if result.is_error else 0


def _run_demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo(args))


def _ask(args: argparse.Namespace) -> int:
    from ..models import OnExpiry, Quorum
    from ._ask import ask, build_request, load_schema

    schema = load_schema(args.schema) if args.schema else None
    on_expiry = None if args.on_expiry is None else OnExpiry(ok=args.on_expiry == "accept")
    request = build_request(
        args.prompt,
        schema=schema,
        choices=args.choice,
        kind=args.kind,
        url=args.link,
        data=args.data,
        agent=args.agent,
        server=args.server,
        tool=args.tool,
        meta=dict(args.meta or ()),
        quorum=None if args.quorum is None else Quorum(args.quorum, args.quorum_decline),
        request_id=args.id,
        on_expiry=on_expiry,
        durable=args.durable,
        escalate=args.escalate,
    )
    # without --timeout: 10 minutes, or for an escalation the broker's default after its last hop
    timeout_s = args.timeout if args.timeout is not None or args.escalate else 600.0
    return asyncio.run(
        ask(
            args.url,
            connection_options(args),
            request,
            timeout_s=timeout_s,
            allow=args.allow,
            as_json=args.json,
        )
    )


def _answer(args: argparse.Namespace) -> int:
    from ._ask import answer, the_answer

    accept = "accept" in args
    given = the_answer(
        args.id,
        accept=accept,
        data=args.accept if accept else None,
        decline=args.decline,
        person=args.person,
    )
    return asyncio.run(answer(args.url, connection_options(args), given, confirm_s=args.confirm))


def _status(args: argparse.Namespace) -> int:
    from ._ops import closed_pipe_is_the_end, discover_queues, read_status, status_text

    async def once() -> str:
        queues = args.queue or await discover_queues(args.url, args.namespace)
        status = await read_status(args.url, args.namespace, queues)
        if args.json:
            return json.dumps(status.to_json(), indent=None if args.watch else 2)
        return status_text(status)

    with closed_pipe_is_the_end():
        if not args.watch:
            print(asyncio.run(once()), flush=True)
            return EXIT_OK
        try:
            while True:
                shown = asyncio.run(once())
                print(shown if args.json else f"\x1b[H\x1b[J{shown}", flush=True)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return EXIT_OK  # the way to stop watching
    return EXIT_OK  # the reader closed the pipe: it has seen enough


def _check(args: argparse.Namespace) -> int:
    from ._ops import check

    ok, line = asyncio.run(check(args.url, args.namespace, args.queue, args.worker, here=args.here))
    print(line if ok else f"toolnexus check: {line}", file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_NOT_DONE


def _audit(args: argparse.Namespace) -> int:
    from ._ops import audit_json, audit_text, closed_pipe_is_the_end, redis_brokers

    async def read() -> list[Any]:
        async with redis_brokers(args.url, args.namespace, [args.queue]) as (broker,):
            since = None if args.since is None else time.time() - args.since
            return await broker.audit(since=since, request_id=args.id)

    records = asyncio.run(read())
    with closed_pipe_is_the_end():
        if args.json:
            print(audit_json(records, raw=getattr(args, "raw", False)), flush=True)
        else:
            for record in records:
                print(audit_text(record))
            sys.stdout.flush()
    return EXIT_OK


def _dead_letters(args: argparse.Namespace) -> int:
    from . import _ops as ops

    async def act() -> tuple[int, Any, list[str]]:
        """The exit status, what to print (JSON-able), and lines for stderr."""
        async with ops.redis_brokers(args.url, args.namespace, [args.queue]) as (broker,):
            one = getattr(args, "id", None)
            letters = await broker.dead_letters(one)
            if one is not None and not letters:
                return EXIT_NOT_DONE, None, [f"no dead letter {one} on queue {args.queue!r}"]
            if args.action == "list":
                return EXIT_OK, letters, []
            if args.action == "show":
                return EXIT_OK, letters[0], []
            if args.action == "purge":
                return EXIT_OK, {"purged": await ops.purge(broker, one)}, []
            done, problems = [], []
            for letter in letters:
                if letter.requeue_problem is not None:
                    problems.append(f"{letter.id} not requeued: {letter.requeue_problem}")
                    continue
                entry = await ops.requeue(broker, letter)
                if entry is None:
                    problems.append(f"{letter.id} not requeued: it is gone (requeued or purged)")
                else:
                    done.append({"id": letter.id, "entry": entry, "request_id": letter.request_id})
            return (EXIT_NOT_DONE if problems else EXIT_OK), {"requeued": done}, problems

    status, result, problems = asyncio.run(act())
    for line in problems:
        print(f"toolnexus dead-letters: {line}", file=sys.stderr)
    if result is None:
        return status
    with ops.closed_pipe_is_the_end():
        if args.json:
            if isinstance(result, list):
                shown: Any = [r.to_json() for r in result]
            else:
                shown = result if isinstance(result, dict) else result.to_json()
            print(json.dumps(shown, indent=2))
        elif args.action == "list":
            print(
                "\n".join(ops.dead_letter_line(r) for r in result)
                or f"no dead letters on queue {args.queue!r}"
            )
        elif args.action == "show":
            print(ops.dead_letter_text(result))
        elif args.action == "purge":
            print(f"purged {result['purged']} dead letter(s) of queue {args.queue!r}")
        else:
            for done in result["requeued"]:
                held = f" ({done['request_id']})" if done["request_id"] else ""
                print(f"{done['id']}: requeued as {done['entry']}{held}")
        sys.stdout.flush()
    return status


def _acl(args: argparse.Namespace) -> int:
    print(acl.users_acl(args.agent, args.responder, args.ops, args.namespace), end="")
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _run_demo,
    "keygen": _keygen,
    "ask": _ask,
    "answer": _answer,
    "status": _status,
    "check": _check,
    "audit": _audit,
    "acl": _acl,
    "dead-letters": _dead_letters,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolnexus`` command line; the exit status is returned (and used by the script)."""
    args = command_parser().parse_args(argv)
    if args.command == "worker":
        return _worker(args)
    garbled = _not_text(args)
    if garbled is not None:
        print(
            f"toolnexus {args.command}: {garbled}: not UTF-8 text (bytes this system's "
            "encoding cannot decode)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        return _COMMANDS[args.command](args)
    except (ToolnexusError, KeyboardInterrupt) as exc:
        return failed(f"toolnexus {args.command}", exc, getattr(args, "url", None))


def _not_text(args: argparse.Namespace) -> str | None:
    """The first argument that is not text (undecodable bytes in argv arrive as lone
    surrogates, which nothing can send or store), by name; None when all are."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                try:
                    item.encode()
                except UnicodeEncodeError:
                    return name
    return None


if __name__ == "__main__":
    sys.exit(main())
