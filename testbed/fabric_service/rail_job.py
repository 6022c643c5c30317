"""rail.train's run (testbed/steps/rail_train.py): the job started with its card and routes, served its fabric
changes, followed to its end, and what it measured recorded next to what the twin's data plane carried.
"""

from __future__ import annotations

import json
import re

from testbed.contracts.errors import StepFailed, raise_failures

# What the job prints (hostside/phased.py) that the step reads back.
OUTPUT = r"^(step \d+ ms |sent |done rank |error: )"
STEP_LINE = re.compile(r"^step (\d+) ms ([0-9.]+) stall_ms ([0-9.]+)")
SENT_LINE = re.compile(r"^sent (\S+) (\d+) (\d+) written (\d+)$")


def run_rail_job(step, engine) -> None:
    jobs = engine.require_jobs(step.label)
    no_job_running(jobs, step.label)
    jobs.assign(list(jobs.job.ranks))  # every trial starts from the playbook's assignment
    engine.execute(step.first)  # the rails before the job (static: for good); not measured
    if step.mode != "static":
        # job.fabric_service's configurations, as job.start serves them; the first phase's (just applied) setup is
        # answered at once
        jobs.serve_fabric(step.label, delay_s=step.delay_s, in_place=step.first.configuration)
    relays: dict[tuple[str, int, int], str] = {}  # (phase, rank, partner) -> the address the rank sends to

    def where(rank: int, route, phase: str) -> str:
        partner, port, partner_port = route
        r, s = jobs.ranks[rank], jobs.ranks[partner]
        if jobs.link is None:  # a lab: the partner's host address (the lab's routing puts it on the rail)
            address = f"{jobs.address_of(s.host)}:{jobs.ports[s.index]}"
        else:  # the twin: a relay that carries bytes only while this route's circuits are lit
            address = jobs.link(r.host, port, s.host, partner_port, jobs.ports[s.index])
        relays[(phase, rank, partner)] = address
        return address

    def env(r) -> dict[str, str]:
        return rail_env(step, r.index, where)

    before = _relay_bytes(jobs)
    jobs.rank_env = env
    try:
        jobs.launch(step.label)
        programs = {
            r.host: [
                (
                    step.label,
                    "gpu.job_output",
                    {"job": jobs.handles[r.index], "pattern": OUTPUT, "max_s": step.job_timeout_s},
                )
            ]
            for r in jobs.ranks
        }
        outputs = engine.dispatch(programs)
    finally:
        jobs.rank_env = None
        jobs.stop(step.label)  # whatever still runs, then the fabric service
    results = {r.index: outputs[r.host][0] for r in jobs.ranks}
    raise_failures(list(results.values()))
    failed = {
        i: res.value
        for i, res in results.items()
        if not any(ln.startswith("done rank") for ln, _ in res.value["lines"])
    }
    if failed:
        i, value = min(failed.items())
        errors = [ln for ln, _ in value["lines"] if ln.startswith("error: ")]
        why = errors[0] if errors else " | ".join(value["tail"][-3:]) or "no output"
        raise StepFailed(f"{step.label}: rank {i} ({jobs.ranks[i].host}) did not finish its iterations: {why}")
    _record_iterations(step, engine, results[0].value["lines"], STEP_LINE)
    _record_bytes(step, engine, jobs, results, relays, before, SENT_LINE)


def _record_iterations(step, engine, lines, rx) -> None:
    for line, ns in lines:
        m = rx.match(line)
        if m is None:
            continue
        number, ms, stall = int(m.group(1)), float(m.group(2)), float(m.group(3))
        if number <= step.warmup:
            continue
        common = {"iteration": number - step.warmup - 1, "mode": step.mode, "delay_ms": step.delay_s * 1000}
        start = ns - int(ms * 1e6)
        engine.recorder.emit(
            "measure",
            f"{step.measure}.time",
            mono_ns=ns,
            step=step.label,
            data={"ms": ms, "start_ns": start, "end_ns": ns, **common},
        )
        engine.recorder.emit(
            "measure",
            f"{step.measure}.stall",
            mono_ns=ns,
            step=step.label,
            data={"ms": stall, "start_ns": start, "end_ns": start + int(stall * 1e6), **common},
        )


def _relay_bytes(jobs) -> dict[str, int]:
    """Bytes each of the twin's relays has carried forward so far ({} on a lab: no data plane to ask)."""
    if jobs.plane is None:
        return {}
    return {r["address"]: r["bytes_forward"] for r in jobs.plane()["relays"]}


def _record_bytes(step, engine, jobs, results, relays, before, rx) -> None:
    """Per phase (phases over the same relays together): the bytes the ranks delivered, and (on the twin) the
    bytes its relays carried for them.
    """
    sent: dict[str, int] = {}
    by_relay: dict[str, int] = {}
    for rank, result in results.items():
        for line, _ in result.value["lines"]:
            m = rx.match(line)
            if m is None:
                continue
            phase, partner, n = m.group(1), int(m.group(2)), int(m.group(3))
            sent[phase] = sent.get(phase, 0) + n
            address = relays.get((phase, rank, partner))
            if address is not None:
                by_relay[address] = by_relay.get(address, 0) + n
    after = _relay_bytes(jobs)
    # Phases whose traffic crossed the same relays (a ring's steps over one ring) are counted together.
    group = {phase.name: phase.name for phase in step.phases}

    def root(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    users: dict[str, str] = {}
    for (phase, _, _), address in relays.items():
        if address in users:
            group[root(phase)] = root(users[address])
        users[address] = phase
    groups: dict[str, list] = {}
    for phase in step.phases:
        groups.setdefault(root(phase.name), []).append(phase)
    for members in groups.values():
        names = [p.name for p in members]
        data = {
            "phase": names[0] if len(names) == 1 else f"{names[0]}..{names[-1]} ({len(names)} phases)",
            "config": ",".join(dict.fromkeys(p.apply.configuration for p in members)),
            "job_bytes": sum(sent.get(n, 0) for n in names),
        }
        mine = {a for (p, _, _), a in relays.items() if p in names}
        # The relays' count; with --netns no relay carries the phase (the kernel does, its frames counted per port
        # for the whole run, not per phase: twin_dataplane.kernel_bytes in run.json)
        if jobs.plane is not None and mine and mine <= after.keys():
            data["plane_bytes"] = sum(after.get(a, 0) - before.get(a, 0) for a in mine)
        engine.recorder.emit("mark", "rail.bytes", step=step.label, data=data)


def rail_env(step, rank: int, where) -> dict[str, str]:
    """TESTBED_RAIL for one rank: the card, its sends (`where(rank, route, phase)` -> host:port) and whom it
    hears from.
    """
    phases = []
    for phase in step.phases:
        phases.append(
            {
                "name": phase.name,
                "config": phase.apply.configuration,
                "compute_ms": phase.compute_s * 1000,
                "bytes": phase.nbytes,
                "to": [[route[0], where(rank, route, phase.name)] for route in phase.routes[rank]],
                "from": sorted(r for r, routes in phase.routes.items() if any(s == rank for s, _, _ in routes)),
            }
        )
    spec = {"mode": step.mode, "iterations": step.warmup + step.iterations, "phases": phases}
    return {"TESTBED_RAIL": json.dumps(spec, separators=(",", ":"))}


def no_job_running(jobs, label: str) -> None:
    if jobs.handles:
        raise StepFailed(f"{label}: rail.train starts the job itself; stop the running one first (job.stop)")
