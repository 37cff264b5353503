"""``p2ptrain``: the scripting CLI, a client of the daemon's control socket.

Standard library only at import time: ``p2ptrain status`` runs often (scripts,
prompts, monitoring) and must stay fast. Commands that need more (``daemon``,
``demo``, ``service``) import it inside their function; ``plan``, ``doctor``,
``tui``, ``export`` and ``monitor`` take their arguments from the module that runs them
(its ``add_arguments`` and ``run``), imported only when the command is given.

Replies are read as the protocol's records (``control_types``); one that is
not what they say is an error in one line naming the field.

Exit codes: 0 ok (``status``: training), 1 error (``status``: error state;
any command: a malformed reply), 2 usage error, 3 no daemon, 5 paused or idle
(``status`` only), 141 the reader of the output went away (``p2ptrain events
| head -1``), as a shell reports a command ended by SIGPIPE.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from p2ptrain import __version__
from p2ptrain.durations import parse_duration
from p2ptrain.paths import control_socket
from p2ptrain.control_types import (
    EventsResult, JoinResult, LocalStatus, MalformedReply, PeersResult, Plan, Status, UnbanResult, WorkerStatus,
)
from p2ptrain.protocol import ControlClient, DaemonError, DaemonNotRunning

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_DAEMON, EXIT_NOT_TRAINING = 0, 1, 2, 3, 5
EXIT_OUTPUT_CLOSED = 141

# Commands whose arguments are defined by the module that implements them, as
# ``add_arguments(parser)`` and ``run(args) -> exit code``; each is imported
# only when its command is on the command line (they import much more).
MODULE_COMMANDS = {
    "plan": ("p2ptrain.daemon.plan_command", "what a device would do with a model"),
    "doctor": ("p2ptrain.daemon.doctor", "check this machine: hardware, plan, NVML, CUDA, ports"),
    "tui": ("p2ptrain.tui.app", "open the dashboard (same as p2ptrain-tui)"),
    "export": ("p2ptrain.peers.model.export", "write the trained adapters or model in the Hugging Face format"),
    "monitor": ("p2ptrain.monitor.command", "watch a run from outside it: a web page, /metrics and /api/run.json"),
}


class UsageError(Exception):
    """A bad command line; the message says how to fix it."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the help to read, not the whole usage block."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see {self.prog} --help\n")


def positive_seconds(text: str) -> float:
    """``--timeout``: a number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; use e.g. --timeout 30")
    return value


def duration(text: str) -> float:
    """``pause --for``: a duration with units (``p2ptrain.durations``), in seconds."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _start_hint(home: str | None) -> str:
    return f"p2ptrain daemon --home {home}" if home else "p2ptrain daemon (or: systemctl --user start p2ptrain)"


def _client(args) -> ControlClient:
    return ControlClient(str(control_socket(args.home)), timeout=args.timeout)


def _call(args, method: str, **params):
    return _client(args).call(method, **params)


def _ask(args, method: str, record: type, **params):
    """Call ``method`` and read its result as ``record`` (``control_types``); the plain result with it."""
    result = _call(args, method, **params)
    return record.from_dict(result, f"the daemon's {method} reply"), result


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


# ----- status ----------------------------------------------------------------------

def _ago(ts: float | None) -> str:
    if not ts:
        return ""
    seconds = max(0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _fmt(value, spec: str = "", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _device_words(view: LocalStatus | WorkerStatus) -> str:
    checkpointing = ", gradient checkpointing" if view.gradient_checkpointing else ""
    return (
        f"{view.device or '?'}, {view.precision or '?'}, quantization {view.quantization or 'none'}"
        f"{checkpointing}, micro-batch {_fmt(view.micro_batch)} x {_fmt(view.grad_accum)}"
    )


def _plan_lines(plan: Plan | None) -> list[str]:
    """The daemon's hardware plan for the (first) worker: its memory and why, a line per choice."""
    if not plan:
        return []
    cap = f", allocator capped at {plan.memory_cap_gib} GiB" if plan.memory_cap_gib else ""
    head = f"      Plan: ~{plan.memory_estimate_gib} of {plan.memory_allowed_gib} GiB allowed{cap}"
    return [head, *(f"            - {line}" for line in plan.rationale)]


def _worker_line(worker: WorkerStatus) -> str:
    """One of several workers (one per GPU): ``local.workers[i]``."""
    return (
        f"    Worker: {_device_words(worker)}; {worker.state or '?'}, {_fmt(worker.samples_per_second, '.1f')} samples/s,"
        f" loss {_fmt(worker.loss, '.3f')}, {worker.contributed_samples} samples, peer {worker.peer_id or '-'}"
    )


def _samples_words(local: LocalStatus) -> str:
    """What share of this peer's work the run used, and why the rest was not (``status.local``)."""
    trained, used = local.trained_samples, local.contributed_samples
    unused = {reason: count for reason, count in local.unused_samples.items() if count}
    words = f"{trained} trained, {used} used by the run ({used / trained:.0%})" if trained else "0 trained"
    if unused:
        reasons = ", ".join(f"{count} {reason.replace('_', ' ')}" for reason, count in unused.items())
        words += f", {sum(unused.values())} not used ({reasons})"
    pending = trained - used - sum(unused.values())
    if pending > 0 and local.waiting:
        return words + f", {pending} waiting: {local.waiting}"
    return words + (f", {pending} in the current round" if pending > 0 else "")


def format_status(status: Status) -> str:
    """The human form of ``status``, in the manner of ``systemctl status``."""
    state = status.state
    dot = {"training": "●", "paused": "◐", "error": "✗"}.get(state, "○")
    headline = state + (f" ({status.pause_reason})" if status.pause_reason else "")
    since = status.since
    lines = [f"{dot} p2ptrain: {headline} since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}; {_ago(since)}" if since else f"{dot} p2ptrain: {headline}"]
    if status.paused_until:
        lines.append(f"   Resumes: {time.strftime('%H:%M:%S', time.localtime(status.paused_until))} (timed pause)")
    run = status.run
    if run:
        eta = f", next epoch in ~{run.eta_next_epoch_s:.0f}s" if run.eta_next_epoch_s is not None else ""
        lines.append(f"       Run: {run.id} ({run.mode or '?'}, model {run.model or '?'}), {run.num_peers} peers")
        lines.append(f"     Epoch: {run.epoch}, {run.samples_accumulated}/{_fmt(run.target_batch_size)} samples{eta}")
    local = status.local
    if local:
        workers = local.workers
        lines.append(f"      Peer: {local.nickname or '?'} {local.peer_id or ''} ({local.reachability or 'unknown'})")
        if len(workers) > 1:
            lines.extend(_worker_line(worker) for worker in workers)
        else:
            lines.append(f"    Device: {_device_words(local)}")
        lines.extend(_plan_lines(local.plan))
        total = " in all" if len(workers) > 1 else ""
        lines.append(
            f"  Training: {_fmt(local.samples_per_second, '.1f')} samples/s{total}, loss {_fmt(local.loss, '.3f')},"
            f" {local.contributed_samples} samples contributed{total}"
        )
        if local.trained_samples:
            lines.append(f"   Samples: {_samples_words(local)}" + (" (all workers)" if total else ""))
        traffic = local.traffic
        if traffic:
            kinds = ", ".join(f"{kind} {rate / 1000:.1f}" for kind, rate in traffic.bytes_per_s.items() if rate >= 50)
            lines.append(f"   Traffic: {sum(traffic.bytes_per_s.values()) / 1000:.1f} KB/s ({kinds or 'idle'}),"
                         f" ~{traffic.month_gb:.1f} GB a month at this rate, {traffic.month_used_gb:.2f} GB this month")
        for address in local.addresses[:2]:
            lines.append(f"   Address: {address}")
    for health in status.health:
        mark = "✗" if health.level == "error" else "!"
        fix = f" — fix: {health.fix}" if health.fix else ""
        lines.append(f"    Health: {mark} {health.message}{fix}")
    return "\n".join(lines)


def cmd_status(args) -> int:
    try:
        status, reply = _ask(args, "status", Status)
    except DaemonNotRunning as error:
        if args.json:
            _print_json({"state": "stopped", "socket": error.socket_path, "fix": _start_hint(args.home)})
        else:
            print(error.one_line(_start_hint(args.home)))
        return EXIT_NO_DAEMON
    if args.json:
        _print_json(reply)  # as the daemon sent it: a newer daemon's fields included
    else:
        print(format_status(status))
    state = status.state
    if state in ("training", "finishing", "joining"):
        return EXIT_OK
    return EXIT_ERROR if state == "error" else EXIT_NOT_TRAINING


# ----- verbs -------------------------------------------------------------------------

def _manifest_options(args) -> dict:
    options = {
        "mode": args.mode,
        "model": args.model,
        "target_batch_size": args.target_batch_size,
        "local_steps": args.local_steps,
        "round_end": args.round_end,
        "round_time_limit_s": args.round_time_limit,
        "seq_len": args.seq_len,
        "inner_lr": args.inner_lr,
        "outer_lr": args.outer_lr,
        "outer_momentum": args.outer_momentum,
        "compression": args.compression,
        "compression_rungs": args.compression_rungs,
        "error_feedback_decay": args.error_feedback_decay,
        "seed": args.seed,
        "micro_batch_hint": args.micro_batch,
        "optimizer": args.optimizer,
        "warmup_epochs": args.warmup_epochs,
        "lr_schedule": args.lr_schedule,
        "total_epochs": args.total_epochs,
    }
    if args.model and os.path.isdir(os.path.expanduser(args.model)):
        # the daemon runs in another directory: a local model is named by its absolute path
        options["model"] = os.path.abspath(os.path.expanduser(args.model))
    if args.dataset and args.dataset != ["stdlib"]:
        options["dataset"] = dataset_spec(args.dataset, args.text_field)
    if args.lora_r is not None:
        lora = {"r": args.lora_r, "alpha": args.lora_alpha or 2 * args.lora_r, "dropout": args.lora_dropout}
        if args.lora_targets:
            lora["target_modules"] = args.lora_targets.split(",")
        options["lora"] = {key: value for key, value in lora.items() if value is not None}
    return {key: value for key, value in options.items() if value is not None}


def dataset_spec(sources: list[str], text_field: str | None) -> dict:
    """The manifest's dataset from ``--dataset`` sources: ``hub:NAME[:CONFIG]`` (a Hugging
    Face dataset id or a local dataset directory) or .txt / .jsonl files, which every peer
    reads at the same absolute path."""
    field = {"text_field": text_field} if text_field else {}
    if any(source.startswith("hub:") for source in sources):
        name, _, config = sources[0].removeprefix("hub:").partition(":")
        if len(sources) > 1 or not name:
            raise UsageError("give one hub dataset: --dataset hub:NAME[:CONFIG], e.g. hub:wikitext:wikitext-2-raw-v1")
        if os.path.isdir(os.path.expanduser(name)):
            name = os.path.abspath(os.path.expanduser(name))
        return {"kind": "hub", "name": name, **({"config": config} if config else {}), **field}
    return {"kind": "files", "paths": [os.path.abspath(os.path.expanduser(path)) for path in sources], **field}


def cmd_join(args) -> int:
    if args.new_run and args.run:
        raise UsageError("give either RUN (to join an existing run) or --new-run NAME (to create one), not both")
    run = args.new_run or args.run
    if not run:
        raise UsageError("name the run: p2ptrain join RUN --peers MULTIADDR, or p2ptrain join --new-run NAME")
    params = {"run": run, "initial_peers": args.peers or []}
    if args.new_run:
        params["new_run"] = True
        params["manifest"] = _manifest_options(args)
    status, _ = _ask(args, "join", JoinResult, **params)
    for warning in status.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"joining run {run!r}: {status.state}")
    return EXIT_OK


# A worker finishes its step (one that waits for an averaging round nobody comes to: up to the averaging
# timeout, 120 s on the internet), checkpoints, says goodbye and exits.
RELEASE_TIMEOUT_S = 300.0


def _released(status: Status, method: str) -> bool:
    """Whether the workers have let go of their devices after ``pause`` (every worker process ended) or ``leave``."""
    if method == "leave":
        return status.state in ("idle", "error")
    workers = status.local.workers if status.local else []
    return status.state != "paused" or all(worker.state in ("paused", "finished") for worker in workers)


def _wait_until_released(args, method: str, status: Status) -> Status | None:
    """Poll ``status`` until the workers have let go of their devices; None after ``RELEASE_TIMEOUT_S``."""
    if _released(status, method):
        return status
    print("waiting for the worker to checkpoint and free its device (--no-wait returns at once)", file=sys.stderr)
    deadline = time.monotonic() + RELEASE_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(0.2)
        status, _ = _ask(args, "status", Status)
        if _released(status, method):
            return status
    return None


def _verb(method: str, done: str):
    def command(args) -> int:
        params = {}
        if method == "pause" and args.for_:
            params["for_s"] = args.for_
        status, _ = _ask(args, method, Status, **params)
        if method in ("pause", "leave") and not args.no_wait:
            status = _wait_until_released(args, method, status)
            if status is None:
                print(f"p2ptrain {method}: the worker still holds its device after {RELEASE_TIMEOUT_S:.0f} s; "
                      "see p2ptrain events and the daemon log", file=sys.stderr)
                return EXIT_ERROR
        until = f" until {time.strftime('%H:%M', time.localtime(status.paused_until))}" if status.paused_until else ""
        print(f"{done}{until}; now {status.state}" + (f" ({status.pause_reason})" if status.pause_reason else ""))
        return EXIT_OK

    return command


def cmd_peers(args) -> int:
    result, reply = _ask(args, "peers", PeersResult)
    if args.json:
        _print_json(reply)
        return EXIT_OK
    if not result.peers:
        print(f"no peers seen{' in run ' + result.run_id if result.run_id else ' (not in a run)'}")
        _print_bans(result)
        return EXIT_OK
    header = f"{'NICKNAME':<16} {'PEER':<14} {'DEVICE':<14} {'SAMPLES/S':>9} {'EPOCH':>5} {'LOSS':>7}  REACH     NOTE"
    print(header)
    for peer in result.peers:
        note = ("you " if peer.is_local else "") + ("" if peer.compatible else "INCOMPATIBLE")
        note += " BANNED" if peer.banned else ""
        print(
            f"{(peer.nickname or '?')[:16]:<16} {(peer.peer_id or '?')[-12:]:<14} {(peer.device or '?')[:14]:<14}"
            f" {_fmt(peer.samples_per_second, '.1f'):>9} {_fmt(peer.epoch):>5} {_fmt(peer.loss, '.3f'):>7}"
            f"  {(peer.reachability or '?'):<9} {note}"
        )
    _print_bans(result)
    return EXIT_OK


def _print_bans(result: PeersResult) -> None:
    """The peers this machine banned in the run (``peers`` result's ``bans``), if any."""
    for ban in result.bans:
        banned_at = time.strftime("%Y-%m-%d %H:%M", time.localtime(ban.banned_at))
        print(f"banned {ban.peer_id} since {banned_at} ({ban.reason or '?'}); lift with: p2ptrain unban {ban.peer_id}")


def cmd_unban(args) -> int:
    if (args.peer is None) == (not args.all):
        raise UsageError("give one peer id (p2ptrain peers lists the banned ones) or --all, e.g. p2ptrain unban 12D3KooW...")
    result, _ = _ask(args, "unban", UnbanResult, **({"all": True} if args.all else {"peer": args.peer}))
    lifted = result.unbanned
    print(f"lifted the ban of {', '.join(lifted) if lifted else 'nobody'}; {len(result.bans)} still banned")
    return EXIT_OK


def cmd_events(args) -> int:
    result, reply = _ask(args, "events", EventsResult, limit=args.limit)
    if args.json:
        _print_json(reply)
        return EXIT_OK
    for event in result.events:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(event.ts))}  {event.kind:<16} {event.message}"
              f"{event.repeated_words()}")
    return EXIT_OK


def cmd_config(args) -> int:
    if args.action == "set":
        if args.key is None or args.value is None:
            raise UsageError("usage: p2ptrain config set KEY VALUE (e.g. p2ptrain config set training.checkpoint_interval_s 300)")
        result = _call(args, "config.set", key=args.key, value=args.value)
        print(f"{args.key} set in {result['path']} (applies {result['applies']})")
        return EXIT_OK
    if args.key:
        result = _call(args, "config.get", key=args.key)
        print(json.dumps(result["value"]))
        return EXIT_OK
    result = _call(args, "config.get")
    print(f"# {result['path']}")
    _print_json(result["config"])
    return EXIT_OK


# ----- commands that do not talk to the daemon ------------------------------------------

def cmd_daemon(args) -> int:
    from p2ptrain.daemon.main import run_daemon

    return run_daemon(home=args.home, log_level=args.log_level)


def cmd_service(args) -> int:
    from p2ptrain.paths import resolve_paths
    from p2ptrain.service import ServiceInstallError, install_service, uninstall_service

    if args.action == "uninstall" and args.bindir is not None:
        raise UsageError("--bindir is only for install (uninstall removes the unit whatever p2ptrain it runs): drop --bindir")
    try:
        if args.action == "uninstall":
            removed, commands = uninstall_service(user=args.user, dry_run=args.dry_run)
        else:
            commands = install_service(user=args.user, bindir=args.bindir, dry_run=args.dry_run)
    except ServiceInstallError as error:
        print(f"p2ptrain service {args.action}: {error}", file=sys.stderr)
        return EXIT_ERROR
    if args.action == "uninstall":
        for path in removed:
            print(f"{'would remove' if args.dry_run else 'removed'} {path}")
        kept = resolve_paths(None, system=not args.user)
        print(f"kept your training state (database, identity, checkpoints) in {kept.state_dir} and {kept.config_file}")
    print("now run:" if not args.dry_run else "would change the files; then run:")
    for command in commands:
        print(f"  {command}")
    return EXIT_OK


def cmd_demo(args) -> int:
    from p2ptrain.demo import run_demo

    return run_demo(peers=args.peers, mode=args.mode, base_dir=args.dir, duration_s=args.duration, ui=args.ui)


# ----- argument parsing -------------------------------------------------------------------

def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; ``--home`` and ``--timeout`` go before or after the command.

    Args:
        command: the command given on the command line; when it is one of
            ``MODULE_COMMANDS``, its module is imported to add its arguments.
    """
    common = OneLineParser(add_help=False)
    common.add_argument("--home", default=argparse.SUPPRESS, help="keep config, state, database, socket and logs under this directory (or set P2PTRAIN_HOME)")
    common.add_argument("--timeout", type=positive_seconds, default=argparse.SUPPRESS, help="seconds to wait for the daemon (default 10)")

    parser = OneLineParser(prog="p2ptrain", parents=[common], description="Donate your GPU (or CPU) to peer-to-peer training runs.")
    parser.add_argument("--version", action="version", version=f"p2ptrain {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, help_text: str, handler, **kwargs) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text, **kwargs)
        sub.set_defaults(handler=handler)
        return sub

    sub = add("status", "show what the daemon is doing (exit 0 training, 5 paused/idle, 3 no daemon, 1 error)", cmd_status)
    sub.add_argument("--json", action="store_true", help="print the stable JSON status")

    sub = add("join", "join a run (RUN --peers MULTIADDR) or create one (--new-run NAME)", cmd_join)
    sub.add_argument("run", nargs="?", help="the run to join")
    sub.add_argument("--peers", nargs="+", metavar="MULTIADDR", help="bootstrap addresses (a peer's local.addresses)")
    sub.add_argument("--new-run", metavar="NAME", help="create a new run with this name and publish its manifest")
    new_run = sub.add_argument_group("settings of a new run (the run's manifest)")
    new_run.add_argument("--mode", choices=["sync", "diloco"])
    new_run.add_argument("--model", help="'tiny', a hub id or a local directory")
    new_run.add_argument("--target-batch-size", type=int, help="samples per epoch across the swarm (sync; DiLoCo: per round)")
    new_run.add_argument("--local-steps", type=int, help="DiLoCo's H: inner steps per round with --round-end local_steps; "
                                                         "the unit of the inner lr's warm-up and schedule either way")
    new_run.add_argument("--round-end", choices=["samples", "local_steps"],
                         help="when a DiLoCo round ends: when the swarm trained --target-batch-size samples in it, every peer "
                              "training until then (samples, the default: for mixed hardware), or after --local-steps inner "
                              "steps on every peer (local_steps: the DiLoCo paper's setting, for equal hardware)")
    new_run.add_argument("--round-time-limit", type=float, metavar="SECONDS",
                         help="with --round-end samples, also end a round this many seconds after it began")
    new_run.add_argument("--seq-len", type=int)
    new_run.add_argument("--micro-batch", type=int, help="suggested micro-batch per peer")
    new_run.add_argument("--inner-lr", type=float, help="learning rate: sync's optimizer and DiLoCo's inner AdamW (default 0.001)")
    new_run.add_argument("--outer-lr", type=float, help="DiLoCo's outer SGD learning rate (default 1.0: with momentum 0, "
                                                        "the plain average of the peers' models)")
    new_run.add_argument("--outer-momentum", type=float, help="DiLoCo's outer Nesterov momentum (default 0: the paper's 0.9 "
                                                              "extrapolates a lone peer's rounds; join warns when lr / (1 - momentum) is above 1.5)")
    new_run.add_argument("--compression", help="what a peer sends when averaging, at most: none, fp16, blockwise8bit, "
                                               "or (diloco) sparse<bits>bit-<k>of<chunk>, e.g. sparse2bit-64of4096")
    new_run.add_argument("--compression-rungs", nargs="+", metavar="RUNG",
                         help="cheaper compressions peers on slow uplinks may send instead (p2ptrain plan --uplink)")
    new_run.add_argument("--error-feedback-decay", type=float,
                         help="sparse compressions: the share of what was not sent carried into the next round (default 1)")
    new_run.add_argument("--seed", type=int)
    new_run.add_argument(
        "--dataset", nargs="+", metavar="SOURCE", help="'stdlib' (the built-in corpus, default), hub:NAME[:CONFIG] (a Hugging Face dataset, e.g. "
        "hub:wikitext:wikitext-2-raw-v1), or .txt/.jsonl files present at the same path on every peer",
    )
    new_run.add_argument("--text-field", help="the field holding the text in .jsonl rows or a hub dataset (default 'text')")
    new_run.add_argument("--optimizer", choices=["adamw", "lamb"], help="sync mode's optimizer (default adamw)")
    new_run.add_argument("--warmup-epochs", type=int, help="raise the learning rate linearly over this many epochs")
    new_run.add_argument("--lr-schedule", choices=["constant", "cosine", "linear"], help="after warm-up (cosine and linear need --total-epochs)")
    new_run.add_argument("--total-epochs", type=int, help="the epoch where a cosine or linear schedule reaches 0")
    new_run.add_argument("--lora-r", type=int, help="train LoRA adapters of this rank instead of all weights")
    new_run.add_argument("--lora-alpha", type=float)
    new_run.add_argument("--lora-dropout", type=float)
    new_run.add_argument("--lora-targets", help="comma-separated module names, e.g. q_proj,v_proj")

    no_wait = "return at once, before the worker has checkpointed and freed its device"
    sub = add("pause", "stop contributing; returns once the GPU is free (--for 2h resumes by itself)", _verb("pause", "paused"))
    sub.add_argument("--for", dest="for_", type=duration, metavar="DURATION", help="e.g. 90s, 45m, 2h, 1h30m, 1d")
    sub.add_argument("--no-wait", action="store_true", help=no_wait)
    add("resume", "resume training", _verb("resume", "resumed"))
    add("finish", "complete the current epoch, then pause", _verb("finish", "finishing the epoch"))
    sub = add("leave", "checkpoint and leave the run; returns once the worker is gone", _verb("leave", "left"))
    sub.add_argument("--no-wait", action="store_true", help=no_wait)

    sub = add("peers", "list the peers of the run", cmd_peers)
    sub.add_argument("--json", action="store_true")
    sub = add("unban", "let a peer this machine banned average with it again (PEER, or --all)", cmd_unban)
    sub.add_argument("peer", nargs="?", metavar="PEER", help="the banned peer's id (p2ptrain peers lists them)")
    sub.add_argument("--all", action="store_true", help="lift every ban of the run")
    sub = add("events", "show the daemon's recent events", cmd_events)
    sub.add_argument("--json", action="store_true")
    sub.add_argument("--limit", type=int, default=30)

    sub = add("config", "show or change the daemon's config", cmd_config)
    sub.add_argument("action", nargs="?", choices=["show", "get", "set"], default="show")
    sub.add_argument("key", nargs="?")
    sub.add_argument("value", nargs="?")

    sub = add("daemon", "run the daemon in the foreground", cmd_daemon)
    sub.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    sub = add("service", "install or uninstall the systemd unit", cmd_service)
    sub.add_argument("action", choices=["install", "uninstall"])
    sub.add_argument("--user", action="store_true", help="a user unit (systemctl --user) instead of the system service")
    sub.add_argument("--bindir", help="install only: where the p2ptrain script is installed (default: this one's)")
    sub.add_argument("--dry-run", action="store_true")

    sub = add("demo", "a local swarm on 127.0.0.1 training the built-in model on the built-in corpus", cmd_demo)
    sub.add_argument("--peers", type=int, default=3, help="how many daemons (default 3)")
    sub.add_argument("--mode", choices=["sync", "diloco"], default="sync")
    sub.add_argument("--dir", help="keep the peers' homes here (default: a new temporary directory)")
    sub.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    sub.add_argument("--ui", choices=["auto", "tui", "text"], default="auto", help="how to show progress")

    for name, (module, help_text) in MODULE_COMMANDS.items():
        sub = add(name, help_text, _module_command(module))
        if name == command:
            _import(module).add_arguments(sub)
    return parser


def _import(module: str):
    return __import__(module, fromlist=["run"])


def _module_command(module: str):
    """The handler of a command of ``MODULE_COMMANDS``: its module's ``run(args)``."""

    def command(args) -> int:
        return _import(module).run(args)

    return command


def given_command(argv: list[str]) -> str | None:
    """The command on a command line: its first word that is neither a global option nor the value of one."""
    words = iter(argv)
    for word in words:
        if word in ("--home", "--timeout"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one ``p2ptrain`` command line; returns its exit code (see the module's docstring)."""
    try:
        try:
            return _run(sys.argv[1:] if argv is None else argv)
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`p2ptrain events | head -1`): end quietly, and send what is
        # still buffered to /dev/null, or the interpreter's flush at exit fails on the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OUTPUT_CLOSED


def _run(argv: list[str]) -> int:
    parser = build_parser(given_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    args.home = getattr(args, "home", None) or os.environ.get("P2PTRAIN_HOME") or None
    args.timeout = getattr(args, "timeout", 10.0)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"p2ptrain {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except DaemonNotRunning as error:
        print(error.one_line(_start_hint(args.home)), file=sys.stderr)
        return EXIT_NO_DAEMON
    except DaemonError as error:
        print(f"p2ptrain {args.command}: {error.one_line()}", file=sys.stderr)
        return EXIT_USAGE if error.code in ("bad-request", "unknown-method") else EXIT_ERROR
    except MalformedReply as error:
        print(f"p2ptrain {args.command}: the daemon's reply is not what this p2ptrain reads: {error} (restart the daemon "
              "so that it runs the p2ptrain installed now, or use the p2ptrain it was started from)", file=sys.stderr)
        return EXIT_ERROR
    except TimeoutError:
        print(f"p2ptrain {args.command}: the daemon did not answer within {args.timeout:.0f} s; see its log (journalctl -u p2ptrain)", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
