"""The control protocol's methods: check the params, then ask the collaborator that knows.

Each method takes the request's ``params`` dict and returns the ``result``,
a record of ``control_types`` as a dict (``to_dict``) where the protocol
types it; bad params raise ``RequestError`` with a one-line message and fix.
The method table is in DEVELOPERS.md; ``ControlMethods.handlers`` is the server's.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from p2ptrain import protocol
from p2ptrain.config import ConfigError, config_as_dict
from p2ptrain.control_types import Ban, EventRow, EventsResult, JoinResult, PeerRow, PeersResult, Status, UnbanResult
from p2ptrain.daemon.config_file import ConfigFile
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.run_control import RunControl
from p2ptrain.daemon.run_view import RunView
from p2ptrain.daemon.server import Handler, RequestError
from p2ptrain.multiaddr import validate_multiaddr
from p2ptrain.peers.swarm.manifest import ManifestError, check_run_id, new_manifest
from p2ptrain.peers.swarm.outer_step import stability_warning
from p2ptrain.storage import queries
from p2ptrain.storage.bans import banned_peers
from p2ptrain.storage.database import Database


def _bad(message: str, fix: str) -> RequestError:
    return RequestError(protocol.BAD_REQUEST, message, fix)


def _number(params: dict, name: str, default: float | None = None, minimum: float | None = None) -> float | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{name} must be a number, not {value!r}", f"send e.g. {{\"{name}\": 10}}")
    if minimum is not None and value < minimum:
        raise _bad(f"{name} must be at least {minimum}, not {value!r}", f"send a {name} >= {minimum}")
    return value


def _limit(params: dict, default: int) -> int:
    value = _number(params, "limit", default, minimum=1)
    return int(min(value, 100_000))


def _string(params: dict, name: str, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(f"{name} must be a non-empty string, not {value!r}", f"send e.g. {{\"{name}\": \"...\"}}")
    return value


class ControlMethods:
    """The protocol's methods, bound to one daemon's collaborators.

    Args:
        status: builds the status object (``control_types.Status``).
        control: the state machine the verbs go to.
        run: the run view (the live peer table).
        db: the database the history methods read.
        config: the daemon's config and its file.
        event_log: where config changes are recorded.
    """

    def __init__(self, status: Callable[[], Status], control: RunControl, run: RunView, db: Database, config: ConfigFile, event_log: EventLog):
        self._status, self.control, self.run, self.db, self.config, self.event_log = status, control, run, db, config, event_log

    def handlers(self) -> dict[str, Handler]:
        """Each protocol method's handler (``subscribe`` is the server's own)."""
        return {
            "status": self.status,
            "peers": self.peers,
            "metrics": self.metrics,
            "epochs": self.epochs,
            "events": self.events,
            "join": self.join,
            "pause": self.pause,
            "resume": self.resume,
            "finish": self.finish,
            "leave": self.leave,
            "unban": self.unban,
            "config.get": self.config_get,
            "config.set": self.config_set,
        }

    async def status(self, params: dict) -> dict:
        return self._status().to_dict()

    async def peers(self, params: dict) -> dict:
        run_id = self.run.run_id
        rows = self.run.peers
        if not rows and run_id:
            rows = [PeerRow.from_dict(row, "a row of the peers table") for row in queries.peers_table(self.db, run_id)]
        bans = [Ban(**ban) for ban in banned_peers(self.db, run_id)]
        banned = {ban.peer_id for ban in bans}
        peers = [row.replace(banned=row.peer_id in banned) for row in rows]
        return PeersResult(run_id=run_id, peers=peers, bans=bans).to_dict()

    async def metrics(self, params: dict) -> dict:
        since = _number(params, "since")
        steps = queries.steps_since(self.db, since=since, limit=_limit(params, 1000), run_id=_string(params, "run_id"))
        return {"steps": steps}

    async def epochs(self, params: dict) -> dict:
        run_id = _string(params, "run_id") or self.run.run_id
        return {"epochs": queries.recent_epochs(self.db, run_id=run_id, limit=_limit(params, 20))}

    async def events(self, params: dict) -> dict:
        since = _number(params, "since")
        rows = queries.events_since(self.db, since=since, limit=_limit(params, 200))
        return EventsResult(events=[EventRow.from_dict(row, "a row of the events table") for row in rows]).to_dict()

    async def join(self, params: dict) -> dict:
        run_id = _string(params, "run", required=True)
        try:
            check_run_id(run_id)
        except ManifestError as error:
            raise _bad(error.message, error.fix) from None
        initial_peers = params.get("initial_peers") or []
        if not isinstance(initial_peers, list) or not all(isinstance(peer, str) for peer in initial_peers):
            raise _bad("initial_peers must be a list of multiaddr strings", "pass --peers /ip4/HOST/tcp/PORT/p2p/PEER_ID")
        try:
            initial_peers = [validate_multiaddr(peer) for peer in initial_peers]
        except ValueError as error:
            raise _bad(str(error), "copy the address from `p2ptrain status` on a peer of the run (local.addresses)") from None
        new_run = params.get("new_run", False)
        if not isinstance(new_run, bool):
            raise _bad(f"new_run must be true or false, not {new_run!r}", 'send "new_run": true to create a run')
        manifest, warnings = None, []
        if new_run:
            options = params.get("manifest") or {}
            if not isinstance(options, dict):
                raise _bad("manifest must be an object of run settings", 'send e.g. "manifest": {"mode": "sync"}')
            try:
                defined = new_manifest(run_id, **options)
            except ManifestError as error:
                raise _bad(error.message, error.fix) from None
            manifest = defined.model_dump(mode="json")
            warnings = [warning for warning in [stability_warning(defined.mode, defined.outer_lr, defined.outer_momentum)] if warning]
        elif not initial_peers and not self.config.config.dht.initial_peers:
            raise _bad(
                f"to join the existing run {run_id!r} this peer needs a bootstrap address",
                f"pass --peers MULTIADDR (a peer's local.addresses), or create it: p2ptrain join --new-run {run_id}",
            )
        self.control.join({"run_id": run_id, "initial_peers": initial_peers, "new_run": new_run, "manifest": manifest})
        return JoinResult(**{name: getattr(self._status(), name) for name in Status.SCHEMA}, warnings=warnings).to_dict()

    async def pause(self, params: dict) -> dict:
        for_s = _number(params, "for_s", minimum=1)
        self.control.pause("user", for_s=for_s)
        return self._status().to_dict()

    async def resume(self, params: dict) -> dict:
        self.control.resume()
        return self._status().to_dict()

    async def finish(self, params: dict) -> dict:
        self.control.finish()
        return self._status().to_dict()

    async def leave(self, params: dict) -> dict:
        self.control.leave()
        return self._status().to_dict()

    async def unban(self, params: dict) -> dict:
        peer_id = _string(params, "peer")
        everyone = params.get("all", False)
        if not isinstance(everyone, bool):
            raise _bad(f"all must be true or false, not {everyone!r}", 'send "all": true to lift every ban')
        if (peer_id is None) == (not everyone):
            raise _bad("unban needs either a peer id or all, not both and not neither",
                       'send {"peer": "12D3Koo..."} or {"all": true} (p2ptrain peers lists the banned peers)')
        lifted = self.control.unban(None if everyone else [peer_id])
        run_id = self.run.run_id
        return UnbanResult(run_id=run_id, unbanned=lifted, bans=[Ban(**ban) for ban in banned_peers(self.db, run_id)]).to_dict()

    async def config_get(self, params: dict) -> dict:
        data: Any = config_as_dict(self.config.config)
        key = _string(params, "key")
        if key:
            for part in key.split("."):
                if not isinstance(data, dict) or part not in data:
                    raise _bad(f"unknown config key {key!r}", "p2ptrain config show lists the keys")
                data = data[part]
            return {"key": key, "value": data, "path": str(self.config.path)}
        return {"config": data, "path": str(self.config.path)}

    async def config_set(self, params: dict) -> dict:
        key = _string(params, "key", required=True)
        if "value" not in params:
            raise _bad("config.set needs a value", "send {\"key\": \"...\", \"value\": ...}")
        try:
            config = self.config.set(key, params["value"])
        except ConfigError as error:
            raise _bad(str(error), "") from None  # the ConfigError message already names the fix
        except OSError as error:
            raise RequestError(protocol.INTERNAL, f"cannot write {self.config.path}: {error.strerror}", "check that directory's permissions")
        self.event_log.record("config-changed", f"{key} set", {"key": key})
        section = key.split(".")[0]
        applies = {"dht": "at the next join or daemon restart", "training": "at the next join or daemon restart",
                   "metrics": "at the next daemon restart"}.get(section, "now")
        return {"config": config_as_dict(config), "path": str(self.config.path), "applies": applies}
