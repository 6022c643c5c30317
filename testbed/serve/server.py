"""`testbed serve`: one warm testbed.Lab for a lab's inventory, the runs of every user queued in front of it, and
the HTTP API (testbed.serve.api) on a Unix socket.

The runs are executed in the main thread, one after another, through the same Lab.run a `testbed run` makes its one
run with: same results folder, same catalog entry, same Ctrl-C. The main thread is where Python delivers signals,
so a run stops as `testbed run` stops on Ctrl-C or SIGTERM (the step's faults healed, teardown, the fabric read
back), whether a user cancelled it (the API thread sends this process SIGUSR1) or the server is stopping. The
API runs in a thread of its own, with its own event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from testbed.contracts.errors import ConfigError, UserError
from testbed.lab import Lab, refuse_on_a_lab, refuse_on_the_twin
from testbed.serve.api import Service, make_app
from testbed.serve.identity import Admins, Peer, own_dir, prepare_folder
from testbed.serve.queue import Closed, QueuedRun, RunQueue
from testbed.serve.queue_file import QueueFile

if TYPE_CHECKING:
    from testbed.serve.webhook import Webhook

CANCEL_SIGNAL = signal.SIGUSR1  # the API thread's word to the runner: stop the run under way
FOLLOW_EVERY_S = 0.1  # how often a run's events.jsonl is read for new events to pass on


@dataclass(frozen=True)
class ServeConfig:
    inventory_file: str
    emulate: bool
    socket_path: Path
    results: Path
    admin_group: str | None = None
    socket_group: str | None = None  # only this group's members (and root) may connect
    web: tuple[str, int] | None = None  # the read-only web page's TCP address (testbed.serve.web)
    remote: Any = None  # testbed.serve.remote.Remote: the API over TLS, for clients with a token (--remote)
    webhook: str | None = None  # POSTed to when a run ends (testbed.serve.webhook)


class Cancelled(KeyboardInterrupt):
    """A run stopped by the API (its owner or an admin): handled by the run as Ctrl-C is."""


class Stopping(KeyboardInterrupt):
    """The server was told to stop (SIGTERM, SIGINT): the run under way stops as on Ctrl-C, the queue is cancelled."""


class Server:
    def __init__(self, config: ServeConfig, console: Console) -> None:
        self.config = config
        self.console = console
        self.stopping: str | None = None
        self._cancel: tuple[str, str] | None = None  # (run id, who) the API asked to stop
        self._in_run: str | None = None  # the run id while the main thread is inside Lab.run
        self._waiting = False  # while the main thread waits for the next run
        self._main = threading.get_ident()  # made in the main thread, where signals are handled
        # The socket's place first: a second server for the lab is refused before it starts anything.
        prepare_folder(config.socket_path.parent, shared=config.socket_path.parent != own_dir())
        _claim(config.socket_path)
        self.queue_file = QueueFile(config.results, config.socket_path.name.removesuffix(".sock"))
        self._save_failed = False
        self.queue = RunQueue(saver=self._save_queue)
        inventory_bytes = Path(config.inventory_file).read_bytes()
        self.inventory_sha256 = hashlib.sha256(inventory_bytes).hexdigest()
        self.lab = ServedLab(
            config.inventory_file,
            emulate=config.emulate,
            results=config.results,
            console=Console(quiet=True),
            queue=self.queue,
            index_behind=True,  # the next queued run starts before the last one's catalog entry; readers sync first
        )
        self._spool = Path(tempfile.mkdtemp(prefix="testbed-serve-"))  # submitted playbooks, while they load
        self.webhook = self._webhook(config.webhook) if config.webhook else None
        self._restore()

    # -- preparing a submitted run (in the API's worker threads) -----------------------------------------------

    def prepare(self, peer: Peer, body: dict) -> tuple[str, str, dict, object]:
        """The playbook file to record, its text, the options and the plan of a submitted run; UserError when
        refused.
        """
        if body.get("emulate") is not None and bool(body["emulate"]) != self.config.emulate:
            mode = "the emulated twin" if self.config.emulate else "the lab itself"
            raise UserError(f"this server runs {mode} of {self.config.inventory_file}; run with --standalone instead")
        given = body.get("inventory_sha256")
        if given is not None and given != self.inventory_sha256:
            raise UserError(
                f"this server serves the inventory {self.config.inventory_file}, and yours is not that file; "
                "run with --standalone, or with the server's inventory"
            )
        trials = _optional_int(body, "trials", minimum=1)
        seed = _optional_int(body, "seed", minimum=0)
        yes = bool(body.get("yes", False))
        options = {
            "trials": trials,
            "seed": seed,
            "tags": _tags(body.get("tags", [])),
            "note": _note(body.get("note")),
            "params": _params(body.get("params", {})),
            "yes": yes,
        }
        if body.get("path") is not None:
            if peer.remote or peer.uid not in (0, os.geteuid()):  # a stolen token reads no file of the server's
                raise UserError("only root and the server's account, locally, may have the server read a file: send it")
            playbook_file, text = str(body["path"]), _read_text(Path(str(body["path"])))
        else:
            given_text, playbook_file = body.get("playbook"), str(body.get("playbook_file") or "playbook.yaml")
            if not isinstance(given_text, str):
                raise UserError("playbook: give the playbook's YAML text (or path, for the server's own account)")
            text = given_text
        return playbook_file, text, options, self._plan(playbook_file, text, options)

    def _plan(self, playbook_file: str, text: str, options: dict):
        """A run's plan, made from its playbook's text; UserError naming the client's file when it is refused."""
        from testbed.documents import load_playbook
        from testbed.plan import make_plan

        trials, seed, yes = options["trials"], options["seed"], options["yes"]
        spooled = Path(tempfile.mkdtemp(dir=self._spool)) / (Path(playbook_file).name or "playbook.yaml")
        spooled.write_text(text, encoding="utf-8")
        try:
            model = load_playbook(spooled, self.lab.inventory).model
            plan = make_plan(model, self.lab.inventory, trials=trials, seed=seed)
            if self.config.emulate:
                refuse_on_the_twin(plan, playbook_file)
            else:
                refuse_on_a_lab(plan, self.config.inventory_file, confirmed=yes)
        except ConfigError as exc:
            problems = "\n".join(str(p).replace(str(spooled), playbook_file) for p in exc.problems)
            raise UserError(problems) from None
        finally:
            shutil.rmtree(spooled.parent, ignore_errors=True)
        return plan

    # -- the queue on disk (testbed.serve.queue_file) ------------------------------------------------------------

    def _save_queue(self, running: dict | None, queued: list[dict]) -> None:
        try:
            self.queue_file.save(running, queued)
        except OSError as exc:  # a full disk: the runs go on; a kill now would lose the queued ones, say so once
            if not self._save_failed:
                self._save_failed = True
                self.console.print(
                    f"[yellow]the queue could not be saved in {escape(str(self.queue_file.path))}: "
                    f"{escape(str(exc))}; a kill of this server now loses its queued runs[/]",
                    soft_wrap=True,
                )
            return
        self._save_failed = False

    def _restore(self) -> None:
        """The runs the last server for this lab left (killed outright): its queued runs queued again, in their
        order and as their users'; the run it was making listed as aborted, with the heal that restores the lab.
        """
        running, queued, warning = self.queue_file.load()
        if warning is not None:
            self.console.print(f"[yellow]{escape(warning)}[/]", soft_wrap=True)
        restored, lost = [], []
        if running is not None:
            run = _from_record(running)
            run.status = "aborted"
            heal = f"testbed heal {run.run_dir} restores what it left" if run.run_dir else "it had no folder yet"
            run.error = f"the server was killed while it ran this run: {heal}"
            lost.append(run)
            self.console.print(f"run {run.id} ({escape(run.user)}): {escape(run.error)}", soft_wrap=True)
        for record in queued:
            run = _from_record(record)
            try:
                run.plan = self._plan(run.playbook_file, run.playbook_text, run.options)
            except UserError as exc:  # the inventory changed under it, say: listed as refused, with why
                run.status, run.error = "refused", f"not run after the server's restart: {exc}"
                lost.append(run)
                self.console.print(f"run {run.id} ({escape(run.user)}): {escape(run.error)}", soft_wrap=True)
                continue
            restored.append(run)
        if restored:
            said = ", ".join(f"{r.id} ({r.user})" for r in restored)
            self.console.print(f"restored {len(restored)} queued run(s), in order: {escape(said)}", soft_wrap=True)
        self.queue.restore(restored, lost)

    # -- stopping ---------------------------------------------------------------------------------------------

    def stop_running(self, run: QueuedRun, by: str) -> None:
        """Called by the API thread: the runner stops `run` as on Ctrl-C, if it is still the one under way."""
        self._cancel = (run.id, by)
        signal.pthread_kill(self._main, CANCEL_SIGNAL)

    def _on_cancel_signal(self, signum, frame) -> None:
        cancel = self._cancel
        if cancel is not None and cancel[0] == self._in_run:
            raise Cancelled(f"cancelled by {cancel[1]}")

    def _on_stop_signal(self, signum, frame) -> None:
        # Raised only where the main thread waits for a run or is inside one: elsewhere (recording a run's end)
        # the runner sees `stopping` when it is done there.
        name = signal.Signals(signum).name
        self.stopping = f"the server was stopped ({name})"
        if self._waiting or self._in_run is not None:
            raise Stopping(f"stopped with the server ({name})")

    # -- the server's life --------------------------------------------------------------------------------------

    def serve(self) -> int:
        config = self.config
        http = HttpThread(self._service(), config)
        signal.signal(CANCEL_SIGNAL, self._on_cancel_signal)
        previous = {s: signal.signal(s, self._on_stop_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        if config.remote is not None:  # SIGHUP: the tokens file is read again (systemctl reload)
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, lambda signum, frame: config.remote.tokens.reread())
        try:
            http.start()
            mode = "the emulated twin of " if config.emulate else ""
            self.console.print(
                f"testbed serve: {mode}{escape(config.inventory_file)}, runs into {escape(str(config.results))}",
                soft_wrap=True,
            )
            if config.web is not None:
                self.console.print(f"web page (read-only) at http://{config.web[0]}:{http.web_port}/", soft_wrap=True)
            if config.remote is not None:
                where = f"{config.remote.address.host}:{http.remote_port}"
                self.console.print(f"remote API (TLS, tokens) at https://{escape(where)}/", soft_wrap=True)
            self.console.print(f"listening on {escape(str(config.socket_path))}", soft_wrap=True)
            try:
                while self.stopping is None:
                    self._waiting = True
                    try:
                        item = self.queue.take()
                    finally:
                        self._waiting = False
                    self._run_one(item)
            except (Closed, Stopping):
                pass
        finally:
            why = self.stopping or "the server stopped"
            for run in self.queue.close(why):
                self.console.print(f"cancelled {run.id} ({escape(run.user)}): {escape(why)}", soft_wrap=True)
            http.stop()
            self.console.print("closing the lab (devices stopped, locks released)")
            try:
                self.lab.close()
            finally:
                if self.webhook is not None:
                    self._close_webhook(self.webhook)
                self.queue_file.close()
                shutil.rmtree(self._spool, ignore_errors=True)
                for s, handler in previous.items():
                    signal.signal(s, handler)
                signal.signal(CANCEL_SIGNAL, signal.SIG_DFL)
        return 0

    def _run_one(self, item: QueuedRun) -> None:
        self.console.print(f"run {item.id} ({escape(item.user)}): {escape(item.playbook_file)}", soft_wrap=True)
        status, error, run_dir = "failed", None, None
        self.lab.serving = item
        try:
            self._in_run = item.id
            try:
                cancel = self._cancel  # asked for before the signal could find this run under way
                if cancel is not None and cancel[0] == item.id:
                    raise Cancelled(f"cancelled by {cancel[1]}")
                run = self.lab.run(item.plan, playbook_file=item.playbook_file, yes=item.options["yes"])
            finally:
                self._in_run = None  # first: a cancel that comes later finds no run to stop
                self.lab.stop_following()
            status, error, run_dir = run.status, run.error, str(run.run_dir)
            _annotate(run.run_dir, item.options, item.user)
        except KeyboardInterrupt as exc:  # before the run had its folder: nothing of it to record
            status, error = "aborted", str(exc) or "interrupted"
        except UserError as exc:  # refused when it came to run (a device lock another holds, a lease)
            status, error = "refused", str(exc)
        except Exception as exc:  # noqa: BLE001 - a fault of this run's: recorded, and the next runs still run
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            self.console.print_exception()
        finally:
            self.lab.serving = None
            run_dir = run_dir or item.run_dir  # a run stopped after it had its folder, before Lab.run returned
            self.queue.finish(item, status, error, run_dir)
        said = f"run {item.id}: {status}" + (f" ({escape(error.splitlines()[0])})" if error else "")
        self.console.print(said, soft_wrap=True)  # one line a run, for journald
        if status == "aborted" and (self._cancel is None or self._cancel[0] != item.id) and self.stopping is None:
            self.stopping = "the server was stopped (SIGTERM)"  # the run's own SIGTERM handler took the signal
        if self.stopping is not None:
            raise Stopping(self.stopping)

    def _webhook(self, url: str) -> Webhook:
        """The webhook, told every run's end as the queue records it (a restored run's, a cancelled one's too)."""
        from testbed.serve.webhook import Webhook, run_ended

        webhook = Webhook(url, lambda line: self.console.print(escape(line), soft_wrap=True))
        server = {"inventory": self.config.inventory_file, "emulate": self.config.emulate}
        server["results"] = str(self.config.results)

        def on_event(event: dict) -> None:  # inside the queue's lock: queued for the webhook's thread, nothing more
            if event["type"] == "run.ended":
                webhook.post(f"run {event['run']['id']} ended", lambda: run_ended(event["run"], server))

        self.queue.events_since(0, on_event)
        return webhook

    def _close_webhook(self, webhook: Webhook) -> None:
        """The runs' ends told before the server goes, as long as a receiver takes to answer one call, no longer."""
        left = webhook.close()
        if left:
            self.console.print(
                f"webhook {escape(webhook.shown)}: {left} call(s) not made: its receiver did not answer before the "
                "server stopped",
                soft_wrap=True,
            )

    def _service(self) -> Service:
        config = self.config
        info = {
            "inventory": str(Path(config.inventory_file).resolve()),
            "emulate": config.emulate,
            "results": str(config.results),
            "socket": str(config.socket_path),
            "pid": os.getpid(),
            "admin_group": config.admin_group,
        }
        return Service(self.queue, Admins(config.admin_group), info, self.prepare, self.stop_running)


class ServedLab(Lab):
    """The server's Lab: as any Lab, and it passes the events of the run under way on to the queue's clients."""

    def __init__(self, *args, queue: RunQueue, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queue = queue
        self.serving: QueuedRun | None = None
        self._follower: EventsFollower | None = None

    def _devices_for(self, plan, truth_log: Path, run_id: str):
        # The engine asks for the devices once the run has its folder: that folder's events are followed from here.
        run_dir = truth_log.parent
        if self.serving is not None:
            self.queue.has_folder(self.serving, str(run_dir))
            self._follower = EventsFollower(run_dir / "events.jsonl", self.queue, self.serving)
        return super()._devices_for(plan, truth_log, run_id)

    def stop_following(self) -> None:
        """After the run: its last events passed on, the follower stopped."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.stop()


class EventsFollower:
    """Reads a run's events.jsonl as the recorder appends to it (each event is flushed whole, as written) and passes
    on what a person following the run wants: each trial's end, the run's marks, each failure, the last measure.
    """

    def __init__(self, path: Path, queue: RunQueue, run: QueuedRun) -> None:
        self.path, self.queue, self.run = path, queue, run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"follow-{run.id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _follow(self) -> None:
        import json

        offset, partial = 0, b""
        total = len(self.run.plan.trials) if self.run.plan is not None else None
        done, last_measure = 0, None
        while True:
            stopping = self._stop.is_set()  # read before the file: the last read after the run ended is whole
            try:
                with self.path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind, op, data = event.get("type"), event.get("op"), event.get("data") or {}
                if kind == "measure":
                    last_measure = {"span": op, "ms": data.get("ms")}
                    continue
                if kind == "mark" and op == "trial.end":
                    done += 1
                elif kind not in ("mark", "fail"):
                    continue
                progress = {"op": op, "type": kind, "trial": event.get("trial"), "trials_done": done}
                progress |= {"trials": total, "status": data.get("status"), "last_measure": last_measure}
                if kind == "fail":
                    progress |= {"device": event.get("device"), "error": str(data.get("error", ""))[:500]}
                self.queue.progress(self.run, progress)
            if stopping:
                return
            self._stop.wait(FOLLOW_EVERY_S)


class HttpThread:
    """The API's aiohttp server on the Unix socket, in a thread with its own event loop."""

    def __init__(self, service: Service, config: ServeConfig) -> None:
        self.service, self.config = service, config
        self.loop = asyncio.new_event_loop()
        self._runner: Any = None  # aiohttp's AppRunner, once up
        self._web_runner: Any = None  # the web page's, with --web
        self.web_port: int | None = None  # the port it listens on (a port of 0 asked is the one given)
        self._remote_runner: Any = None  # the remote API's, with --remote
        self.remote_port: int | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="testbed-serve-http", daemon=True)
        self._claimed = False  # the socket's path is this server's to remove

    def start(self) -> None:
        path = self.config.socket_path
        self._claimed = True  # Server claimed it (a stale socket removed, another server's refused)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise UserError(f"cannot serve on {path}: {self._failure}")

    def _main(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self.loop)

        async def up() -> None:
            runner = web.AppRunner(make_app(self.service), handle_signals=False, access_log=None)
            await runner.setup()
            self._runner = runner
            site = web.UnixSite(runner, str(self.config.socket_path), shutdown_timeout=1.0)
            await site.start()
            _set_socket_access(self.config.socket_path, self.config.socket_group)
            if self.config.web is not None:
                from testbed.serve.web import make_web_app

                self._web_runner = web.AppRunner(make_web_app(self.service), handle_signals=False, access_log=None)
                await self._web_runner.setup()
                host, port = self.config.web
                await web.TCPSite(self._web_runner, host, port, shutdown_timeout=1.0).start()
                self.web_port = self._web_runner.addresses[0][1]
            if self.config.remote is not None:
                from testbed.serve.remote import start_listener

                self._remote_runner, self.remote_port = await start_listener(self.service, self.config.remote)

        try:
            self.loop.run_until_complete(up())
        except BaseException as exc:  # noqa: BLE001 - told to the starting thread, which raises it
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        if self._runner is not None and self.loop.is_running():
            for runner in (self._remote_runner, self._web_runner, self._runner):
                if runner is None:
                    continue
                future = asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop)
                try:
                    future.result(timeout=10)
                except Exception:  # noqa: BLE001 - the socket is removed below either way
                    pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if self._claimed:  # never the socket of another server this one refused to replace
            self.config.socket_path.unlink(missing_ok=True)


def _claim(path: Path) -> None:
    """Refuse a socket path another server answers on; remove a stale socket (its server was killed)."""
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_socket() or path.is_symlink():
        raise UserError(f"{path}: there is a file there that is not a socket; remove it or give --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody answers: a server that died left it
        return
    finally:
        probe.close()
    raise UserError(f"another testbed serve answers on {path}: stop it first, or give --socket")


def _set_socket_access(path: Path, group: str | None) -> None:
    """Any local account may connect (each is told apart by the kernel), or only `group`'s members and root."""
    if group is None:
        os.chmod(path, 0o666)
        return
    import grp

    os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, 0o660)


def _from_record(record: dict) -> QueuedRun:
    run = QueuedRun(
        record["id"], record["uid"], record["user"], record["playbook_file"], record["options"],
        playbook_text=record["playbook_text"], submitted=record["submitted"],
    )  # fmt: skip
    run.started, run.run_dir = record.get("started"), record.get("run_dir")
    return run


def _optional_int(body: dict, key: str, *, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{key}: give a whole number, at least {minimum}")
    return value


def _tags(value) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise UserError("tags: give a list of names")
    return value


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it: {exc}") from None


def _note(value) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise UserError("note: give the note's text")
    return value


def _params(value) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise UserError("params: give an object of names to text values")
    return value


def _annotate(run_dir: Path, options: dict, user: str) -> None:
    """The tags, note and parameters the run was submitted with, kept with it as `testbed run --tag ...` keeps
    them (its annotations, which the catalog indexes), as the submitting user's, not the server's account's.
    """
    tags, note, params = options["tags"], options["note"], options["params"]
    if not (tags or note or params):
        return
    from testbed.catalog import add_note, add_tag, index_run
    from testbed.catalog.annotations import add_param

    for name in tags:
        add_tag(run_dir, name, user=user)
    for name, value in params.items():
        add_param(run_dir, name, value, user=user)
    if note:
        add_note(run_dir, note, user=user)
    index_run(run_dir)
