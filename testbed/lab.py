"""A warm session on a lab, for IPython and Jupyter (the convention of bluesky's RunEngine and QCoDeS's
Station): Ray, the twin and the device hubs stay up between runs, so the second run's first command goes out
in well under a second instead of after the seconds a cold start takes.

    import testbed
    with testbed.Lab("playbooks/inventory/emulated-rack.yaml", emulate=True) as lab:
        run = lab.run("playbooks/ocs-reconfig.yaml", trials=3)
        run.summary["spans"]["reconfig.total"]["p50_ms"]
        pandas.DataFrame(run.spans)                   # one row per measured span
        again = lab.run("playbooks/ocs-reconfig.yaml")  # same devices: nothing restarts

Every run is a run as `testbed run` makes it (`testbed run` is this class, used for one run): its own results
folder, events, audit, summary, `testbed check` and `testbed heal`. What stays between runs:

- Ray: started when the Lab is made (a local instance by a process of its own), so the first run's twin comes up
  meanwhile;
- the devices (twin, locks, hubs with their drivers connected), while the next run needs the same ones
  (the same devices, and for the twin the same seed and fault proxy); otherwise they are stopped and the
  run brings up its own. The lab's state carries over, as on a lab: the circuits a run leaves stay;
- the device locks: held from the run that brought the devices up until they are stopped, so no other run
  can drive a device this session holds a connection to. Close the Lab (or leave the `with` block) to let
  others have them;
- the devices' clocks (each node's offset, run.json's `placement`): measured by the first run on them, reused
  while fresh and the same actor processes serve (`placement_clocks` says when they were measured, and by which
  run).

With index_behind=True (testbed serve's), a run is indexed into the catalog after the next run's first command
rather than before `run` returns; closing the Lab finishes what is left.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from testbed.contracts.errors import UserError
from testbed.documents.inventory import Inventory
from testbed.engine.ray_session import RayStart

if TYPE_CHECKING:  # imported where they are brought up (_devices_for), or used (run)
    from testbed.catalog.index import IndexBehind
    from testbed.engine.clocks import ClocksKept
    from testbed.engine.devices import Devices

DEFAULT_INVENTORY = "playbooks/inventory/emulated-rack.yaml"


class Lab:
    """A session on the lab an inventory describes (its emulated twin with emulate=True).

    inventory: the inventory file; emulate: run on the twin (nothing real is opened); ray_address: join that
    Ray cluster instead of starting a local instance; results: the folder runs are written under; console:
    where progress goes (a quiet one: rich.console.Console(quiet=True)); loaded: that file's inventory,
    already loaded (it is not read again); wait_for_leases: on a lab, wait for devices other users or runs hold
    (docs/leases.md) instead of refusing the run; ray_start: Ray's start, begun already for this Lab
    (testbed.engine.ray_session.RayStart: `testbed run` begins it before it loads its files), which the Lab
    then owns; netns: with emulate=True, each emulated GPU host is a network namespace of its own on a management
    network (docs/netns.md; needs root); index_behind: each run indexed into the catalog behind the next run's start
    (testbed serve's queue), not before `run` returns.
    """

    def __init__(
        self,
        inventory: str | Path = DEFAULT_INVENTORY,
        *,
        emulate: bool = False,
        ray_address: str | None = None,
        results: str | Path = "results",
        console: Console | None = None,
        loaded: Inventory | None = None,
        wait_for_leases: bool = False,
        ray_start: RayStart | None = None,
        netns: bool = False,
        index_behind: bool = False,
    ) -> None:
        from testbed.documents import load_inventory

        if netns:
            if not emulate:
                raise UserError("netns=True (--netns) is a way to run the emulated twin: give emulate=True (--emulate)")
            from testbed.twin.netns import refuse_without_privilege

            refuse_without_privilege()  # before Ray starts: nothing to stop
        self.netns = netns

        self.inventory_file = str(inventory)
        self.inventory = loaded if loaded is not None else load_inventory(self.inventory_file).model
        self.emulate = emulate
        self.wait_for_leases = wait_for_leases
        self.ray_address = ray_address
        self.results = Path(results)
        self.console = console if console is not None else Console(highlight=False)
        if not emulate:
            _require_a_lab(self.inventory, self.inventory_file)
        self._ray = ray_start if ray_start is not None else RayStart(ray_address)  # starts now
        self._devices: Devices | None = None  # while they serve
        self._clocks: ClocksKept | None = None  # the devices' clocks, from the first run on them
        self._index_behind_wanted = index_behind
        self._index_behind: IndexBehind | None = None  # its thread, from the first run's end
        self._closed = False

    # -- runs -----------------------------------------------------------------------------------------

    def plan(self, playbook: str | Path, *, trials: int | None = None, seed: int | None = None):
        """The plan `run` would execute (testbed.plan.Plan; `testbed plan` prints the same)."""
        from testbed.documents import load_playbook
        from testbed.plan import make_plan

        model = load_playbook(str(playbook), self.inventory).model
        return make_plan(model, self.inventory, trials=trials, seed=seed)

    def run(
        self,
        playbook,
        *,
        trials: int | None = None,
        seed: int | None = None,
        yes: bool = False,
        playbook_file: str | None = None,
    ):
        """Run a playbook (a file, or a Plan from `plan`) and return its testbed.engine.run.Run: `.folder`,
        `.status`, `.summary`, `.spans` (rows for pandas), `.events()`. On a real lab a run that writes to
        devices needs yes=True (the CLI asks, or takes --yes); playbook_file names a Plan's file in run.json.
        """
        from testbed.engine.run import RunOptions, execute_run
        from testbed.plan import Plan

        if self._closed:
            raise UserError("this Lab is closed; make a new one")
        if isinstance(playbook, Plan):
            plan, playbook_file = playbook, playbook_file or playbook.playbook.name
        else:
            plan, playbook_file = self.plan(playbook, trials=trials, seed=seed), str(playbook)
        if self.emulate:
            refuse_on_the_twin(plan, playbook_file)
        else:
            refuse_on_a_lab(plan, self.inventory_file, confirmed=yes)
        options = RunOptions(playbook_file, self.inventory_file, self.results, self.emulate, self.ray_address)
        if self._clocks is None:
            from testbed.engine.clocks import ClocksKept

            self._clocks = ClocksKept()
        if self._index_behind_wanted and self._index_behind is None:
            from testbed.catalog.index import IndexBehind

            self._index_behind = IndexBehind(lambda warning: self.console.print(f"[yellow]{escape(warning)}[/]"))
        return execute_run(
            plan, options, self.console, self._devices_for, clocks=self._clocks, index_behind=self._index_behind
        )

    def _devices_for(self, plan, truth_log: Path, run_id: str):
        from testbed.engine.devices import bring_up, devices_key

        current = self._devices
        if current is not None and current.key == devices_key(plan, self.emulate, self.netns) and _still_up(current):
            return current
        self._stop_devices()
        self._devices = bring_up(
            plan,
            self._ray,
            emulate=self.emulate,
            truth_log=truth_log,
            owner=run_id,
            console=self.console,
            wait_for_leases=self.wait_for_leases,
            netns=self.netns,
        )
        return self._devices

    # -- the session ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the devices (drivers closed, locks released, twin stopped) and the Ray this Lab started."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._index_behind is not None:  # the last runs into the catalog before the session ends
                self._index_behind.close()
        finally:
            try:
                self._stop_devices()
            finally:
                self._ray.shutdown()

    def _stop_devices(self) -> None:
        devices, self._devices = self._devices, None
        if devices is not None:
            devices.close()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("devices up" if self._devices is not None else "no devices up")
        mode = "emulated" if self.emulate else "lab"
        return f"Lab({self.inventory_file!r}, {mode}, {state})"


def one_run_lab(plan, options, console: Console, ray_start=None, *, netns: bool = False) -> Lab:
    """The session one run is made in (what `testbed run` does): its devices are brought up for it alone.
    `options` is a testbed.engine.run.RunOptions; `ray_start` a Ray start already under way, if any; `netns`:
    the twin's hosts in network namespaces (docs/netns.md).
    """
    return Lab(
        options.inventory_file,
        emulate=options.emulate,
        ray_address=options.ray_address,
        results=options.results_root,
        console=console,
        loaded=plan.inventory,
        wait_for_leases=options.wait_for_leases,
        ray_start=ray_start,
        netns=netns,
    )


def run_plan(plan, options, console: Console):
    """One run on devices brought up for it alone -> testbed.engine.run.Run. The caller has confirmed any write
    to a real lab.
    """
    with one_run_lab(plan, options, console) as lab:
        return lab.run(plan, playbook_file=options.playbook_file, yes=True)


def _still_up(devices) -> bool:
    """A twin that died (killed, crashed) is not reused: the run brings up a new one."""
    twin = devices.twin
    return twin is None or twin.process.process.poll() is None


def _require_a_lab(inventory: Inventory, inventory_file: str) -> None:
    if inventory.emulated_only:
        raise UserError(
            f"{inventory_file} describes an emulated lab (emulated_only: true); run with --emulate (emulate=True), "
            "or pass your lab's inventory"
        )


def refuse_on_a_lab(plan, inventory_file: str, *, confirmed: bool) -> None:
    """What a run on a real lab refuses before anything starts: an emulated-only inventory, a fault kind only
    the twin can apply (each kind says: its `lab_support`) or that the devices it may hit cannot take (a kind
    with `lab_refusal(inventory, devices)`: host.power_off on a host without a BMC), a write nobody confirmed.
    """
    from testbed.faults import FAULT_KINDS

    _require_a_lab(plan.inventory, inventory_file)
    refuse_without_torchft(plan, inventory_file)
    kinds = {s.kind for s in plan.all_steps() if getattr(s, "faults", 0) and hasattr(s, "kind")}
    not_on_a_lab = {k: support for k in kinds if (support := FAULT_KINDS.get(k).lab_support) is not None}
    for kind in sorted(kinds - set(not_on_a_lab)):
        refusal = getattr(FAULT_KINDS.get(kind), "lab_refusal", None)
        why = refusal(plan.inventory, _fault_targets(plan, kind)) if refusal is not None else None
        if why is not None:
            not_on_a_lab[kind] = why
    if not_on_a_lab:
        kinds_by_why: dict[str, list[str]] = {}  # kinds refused for one reason (transport.*) said once
        for kind, why in sorted(not_on_a_lab.items()):
            kinds_by_why.setdefault(why, []).append(kind)
        raise UserError(
            "; ".join(f"{', '.join(kinds)}: {why}" for why, kinds in kinds_by_why.items())
            + ". Run with --emulate, where the twin applies them"
        )
    if plan.writes and not confirmed:
        targets = ", ".join(f"{d} ({a})" for d, a in plan.addresses().items() if d in plan.writes)
        raise UserError(f"this run writes to real devices: {targets}; pass yes=True (--yes) to confirm")


# What to install when a job needs PyTorch (docs/jobs.md, "The real PyTorch job").
PYTORCH_INSTALL = "pip install 'testbed[torch]' (PyTorch's CPU build is enough: docs/jobs.md, The real PyTorch job)"
REAL_TORCHRUN = "TESTBED_TWIN_TORCHRUN"  # "real" in job.env: the emulated hosts run PyTorch's torchrun


def _torch_distributed(job) -> str | None:
    """Which of the project's programs the job runs that sets up a torch.distributed process group, or None."""
    program, args = Path(job.command[0]).name, job.command[1:]
    if program == "testbed-torch-train":
        return "testbed-torch-train is a PyTorch job"
    pairs = zip(args[:-1], args[1:], strict=True)
    if program == "testbed-train" and (
        "--backend=gloo" in args or any(a == "--backend" and b == "gloo" for a, b in pairs)
    ):
        return "testbed-train --backend gloo sums over torch.distributed"
    return None


def pytorch_needed(job) -> str | None:
    """What of the job needs PyTorch where its ranks run, or None. The emulated hosts run only the project's own
    programs (emulators/gpuhost/spec.py), so on the twin this is the whole list: its PyTorch job, testbed-train's
    gloo backend, and PyTorch's own torchrun in place of the hosts' stand-in.
    """
    if job is None:
        return None
    why = _torch_distributed(job)
    if why is None and job.launcher == "torchrun" and job.env.get(REAL_TORCHRUN) == "real":
        why = f"{REAL_TORCHRUN}: real has the emulated hosts run PyTorch's torchrun"
    return why


def refuse_without_torchft(plan, where: str) -> None:
    """A job in TorchFT's loop (job.torchft) needs torchft on the controller, which serves its lighthouse (and, with
    --emulate, runs its replica groups): refused before anything starts, saying what to install.
    """
    job = plan.playbook.job
    if job is None or job.torchft is None:
        return
    from testbed.engine.job.lighthouse import TORCHFT_INSTALL, torchft_missing

    missing = torchft_missing()
    if missing is not None:
        raise UserError(
            f"{where}: job.torchft: the controller serves TorchFT's lighthouse, and {missing}: {TORCHFT_INSTALL}"
        )


def refuse_on_the_twin(plan, playbook_file: str) -> None:
    """What a run on the twin refuses before anything starts: a job that needs PyTorch when this Python, which the
    emulated hosts run their programs with, has none (its ranks would die at their first import instead); a
    torch.distributed job under the hosts' stand-in torchrun, whose rendezvous store is not PyTorch's TCPStore (its
    ranks would wait for it until the step's timeout).
    """
    job = plan.playbook.job
    distributed = _torch_distributed(job) if job is not None else None
    if distributed is not None and job.launcher == "torchrun" and job.env.get(REAL_TORCHRUN) != "real":
        raise UserError(
            f"{playbook_file}: job.env: {distributed}, whose process group connects to torchrun's store, and the "
            f"emulated hosts' own torchrun serves none PyTorch can use: add {REAL_TORCHRUN}: real to the job's env "
            "(the hosts then run PyTorch's torchrun; docs/jobs.md)"
        )
    refuse_without_torchft(plan, playbook_file)
    why = pytorch_needed(job)
    if why is not None and importlib.util.find_spec("torch") is None:
        raise UserError(
            f"{playbook_file}: the job needs PyTorch ({why}); with --emulate its ranks run on this machine, with "
            f"{sys.executable}, which has no PyTorch: {PYTORCH_INSTALL}"
        )


def _fault_targets(plan, kind: str) -> list[str]:
    """The devices the plan's faults of `kind` may hit: the device a connection fault names, the host of a
    rank fault's rank and, when the plan has a failover (which moves a rank to a spare), the spares.
    """
    from testbed.faults import FAULT_KINDS
    from testbed.steps.failover import FailoverStep

    job, steps = plan.playbook.job, plan.all_steps()
    out = []
    for s in steps:
        if getattr(s, "kind", None) != kind or not getattr(s, "faults", 0):
            continue
        if getattr(s, "device", None) is not None:
            out.append(s.device)
        elif job is not None and 0 <= getattr(s, "rank", -1) < len(job.ranks):
            out.append(job.ranks[s.rank])
    if job is not None and FAULT_KINDS.get(kind).target == "rank" and any(isinstance(s, FailoverStep) for s in steps):
        out.extend(plan.spares)
    return list(dict.fromkeys(out))
