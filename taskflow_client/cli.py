"""``python -m taskflow_client`` -- the client from a shell script.

Every answer is printed as JSON on stdout: one object per line (a list prints one line per
item), so ``jq`` reads it directly. Errors print ``code: message`` on stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .client import Client
from .errors import TaskflowError, TransportError

EXIT_OK = 0
EXIT_PROBLEMS = 1  # check: the board has problems
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_NO_WORK = 3  # claim: nothing ready (within --wait)
EXIT_REFUSED = 4  # the board answered with an error (code: message on stderr)
EXIT_TRANSPORT = 5  # no definitive answer: unreachable, timeout, not the API's answer

EPILOG = f"""\
exit codes: {EXIT_OK} ok; {EXIT_PROBLEMS} check found problems; {EXIT_USAGE} bad command line;
{EXIT_NO_WORK} claim found no work; {EXIT_REFUSED} the board refused (stderr: "code: message",
e.g. "lease_lost: ..."); {EXIT_TRANSPORT} transport error (the outcome is unknown).

example:
  export TASKFLOW_URL=http://127.0.0.1:8000 TASKFLOW_KEY=tfk_...
  python -m taskflow_client create '{{"id": "t1", "title": "hello", "payload": {{"n": 2}}}}'
  claim=$(python -m taskflow_client claim --ttl 60) || exit   # 3 = no work
  id=$(jq -r .task.id <<<"$claim"); token=$(jq -r .lease.token <<<"$claim")
  python -m taskflow_client complete "$id" "$token" '{{"ok": true}}'

a worker loop, one request per task (complete --next also claims the next task; its answer's
"next" is that {{task, lease}}, or null when none was ready):
  held=$(python -m taskflow_client claim --ttl 60) || exit
  while [ "$held" != null ]; do
    id=$(jq -r .task.id <<<"$held"); token=$(jq -r .lease.token <<<"$held")
    held=$(python -m taskflow_client complete "$id" "$token" '{{"ok": true}}' --next --ttl 60 | jq -c .next)
  done
"""


def _json_arg(text: str | None, what: str, parser: argparse.ArgumentParser, *, stdin_default: bool) -> Any:
    if text is None and not stdin_default:
        return None
    if text is None or text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        parser.error(f"{what} is not valid JSON: {exc}")


def _next_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--next", action="store_true",
                   help="also claim the next ready task in the same request: the answer (the task) then has "
                        "\"next\": {task, lease}, or null when none was ready")
    p.add_argument("--ttl", type=float, default=60.0, help="with --next: its lease seconds (default %(default)s)")
    p.add_argument("--queue", help="with --next: claim from this queue only")
    p.add_argument("--wait", type=float, default=0.0, help="with --next: wait up to this many seconds for work")


def _with_next(answer: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    task, lease = answer
    return {**task, "next": None if lease is None else lease.as_dict()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskflow_client",
        description="Talk to a TaskFlow board: create, list, claim, renew, complete, fail, check.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=os.environ.get("TASKFLOW_URL", "http://127.0.0.1:8000"),
                        help="the board's base URL (env TASKFLOW_URL; default %(default)s)")
    parser.add_argument("--key", default=os.environ.get("TASKFLOW_KEY"),
                        help="agent API key (env TASKFLOW_KEY)")
    parser.add_argument("--timeout", type=float, default=30.0, help="network timeout in seconds")
    parser.add_argument("--capabilities", default=None, metavar="LABELS",
                        help="narrow claims to these of the key's capabilities, comma-separated (e.g. gpu,python; "
                             "default: all of the key's)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("create", help="create a task (a JSON object) or a batch (a JSON list)")
    p.add_argument("json", nargs="?", help="the task(s) as JSON; read from stdin when omitted or '-'")

    p = sub.add_parser("get", help="print one task")
    p.add_argument("task_id")

    p = sub.add_parser("list", help="print tasks, oldest first, one JSON object per line")
    p.add_argument("--stage", action="append", help="only this stage (repeatable)")
    p.add_argument("--queue")
    p.add_argument("--owner")
    p.add_argument("--text", help="substring of id or title")

    p = sub.add_parser("events", help="print a task's history, one event per line")
    p.add_argument("task_id")

    p = sub.add_parser("claim", help="claim the next ready task (or --task ID); prints {task, lease}; "
                                     f"exit {EXIT_NO_WORK} when there is no work")
    p.add_argument("--ttl", type=float, default=60.0, help="lease seconds (default %(default)s)")
    p.add_argument("--queue")
    p.add_argument("--wait", type=float, default=0.0, help="wait up to this many seconds for work (max 30)")
    p.add_argument("--task", dest="task_id", help="claim this task instead of the next ready one")

    p = sub.add_parser("resume", help="take a PAUSED task with a new lease; prints {task, lease}")
    p.add_argument("task_id")
    p.add_argument("--ttl", type=float, default=60.0)

    p = sub.add_parser("renew", help="extend a lease; prints {task, lease}")
    p.add_argument("task_id")
    p.add_argument("token")
    p.add_argument("--ttl", type=float, default=60.0)
    p.add_argument("--checkpoint", help="JSON to save as the task's checkpoint")
    p.add_argument("--progress", type=float, help="fraction done, 0..1")

    p = sub.add_parser("release", help="give the task back to the queue")
    p.add_argument("task_id")
    p.add_argument("token")
    _next_options(p)

    p = sub.add_parser("complete", help="commit a result")
    p.add_argument("task_id")
    p.add_argument("token")
    p.add_argument("result", nargs="?", default="{}", help="the result as JSON (default {}; '-' = stdin)")
    _next_options(p)

    p = sub.add_parser("fail", help="record a failed attempt")
    p.add_argument("task_id")
    p.add_argument("token")
    p.add_argument("error", help="what went wrong (text)")
    p.add_argument("--permanent", action="store_true", help="do not retry even with attempts left")
    _next_options(p)

    p = sub.add_parser("pause", help="give the lease up, keeping a checkpoint for resume")
    p.add_argument("task_id")
    p.add_argument("token")
    p.add_argument("checkpoint", help="the checkpoint as JSON ('-' = stdin)")

    for verb, text in (("admit", "operator: admit a held task"),
                       ("requeue", "operator: FAILED or PAUSED back to QUEUED"),
                       ("cancel", "operator: cancel a task")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("task_id")
        p.add_argument("--version", type=int, help="refuse if the task is no longer at this version")
        p.add_argument("--reason", default="")
        if verb == "requeue":
            p.add_argument("--reset-attempts", action="store_true")

    sub.add_parser("check", help=f"print the board's problems, one per line; exit {EXIT_PROBLEMS} if any")
    return parser


def _print(value: Any) -> None:
    items: list[Any] = value if isinstance(value, list) else [value]
    for item in items:
        sys.stdout.write(json.dumps(item, separators=(",", ":"), ensure_ascii=False) + "\n")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    narrowed = None if args.capabilities is None else [c.strip() for c in args.capabilities.split(",") if c.strip()]
    client = Client(args.url, args.key, timeout=args.timeout, capabilities=narrowed)
    command = args.command
    if command == "create":
        _print(client.create(_json_arg(args.json, "the task", parser, stdin_default=True)))
    elif command == "get":
        _print(client.get(args.task_id))
    elif command == "list":
        for task in client.iter_tasks(stage=args.stage, queue=args.queue, owner=args.owner, text=args.text):
            _print(task)
    elif command == "events":
        for event in client.iter_events(args.task_id):
            _print(event)
    elif command == "claim":
        if args.task_id:
            lease = client.claim(args.task_id, args.ttl)
        else:
            lease = client.claim_next(args.ttl, queue=args.queue, wait_seconds=args.wait)
        if lease is None:
            print("no work: no task is ready", file=sys.stderr)
            return EXIT_NO_WORK
        _print(lease.as_dict())
    elif command == "resume":
        _print(client.resume(args.task_id, args.ttl).as_dict())
    elif command == "renew":
        checkpoint = _json_arg(args.checkpoint, "--checkpoint", parser, stdin_default=False)
        _print(client.renew(args.task_id, args.token, args.ttl, checkpoint=checkpoint,
                            progress=args.progress).as_dict())
    elif command in ("release", "complete", "fail") and args.next:
        following = {"ttl_seconds": args.ttl, "queue": args.queue, "wait_seconds": args.wait}
        if command == "release":
            _print(_with_next(client.release_and_claim(args.task_id, args.token, **following)))
        elif command == "complete":
            result = _json_arg(args.result, "the result", parser, stdin_default=True)
            _print(_with_next(client.complete_and_claim(args.task_id, args.token, result, **following)))
        else:
            _print(_with_next(client.fail_and_claim(args.task_id, args.token, args.error,
                                                    retryable=not args.permanent, **following)))
    elif command == "release":
        _print(client.release(args.task_id, args.token))
    elif command == "complete":
        _print(client.complete(args.task_id, args.token, _json_arg(args.result, "the result", parser,
                                                                   stdin_default=True)))
    elif command == "fail":
        _print(client.fail(args.task_id, args.token, args.error, retryable=not args.permanent))
    elif command == "pause":
        _print(client.pause(args.task_id, args.token, _json_arg(args.checkpoint, "the checkpoint", parser,
                                                                stdin_default=True)))
    elif command == "admit":
        _print(client.admit(args.task_id, version=args.version, reason=args.reason))
    elif command == "requeue":
        _print(client.requeue(args.task_id, version=args.version, reason=args.reason,
                              reset_attempts=args.reset_attempts))
    elif command == "cancel":
        _print(client.cancel(args.task_id, version=args.version, reason=args.reason))
    elif command == "check":
        problems = client.check()
        _print(problems)
        if problems:
            print(f"{len(problems)} problem(s)", file=sys.stderr)
            return EXIT_PROBLEMS
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args, parser)
    except TaskflowError as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_REFUSED
    except TransportError as exc:
        print(f"transport_error: {exc.message}", file=sys.stderr)
        return EXIT_TRANSPORT
    except ValueError as exc:  # e.g. a malformed --url
        print(f"usage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `... | head`
        return EXIT_OK
