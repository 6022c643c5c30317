"""results/README.md's event tables, generated from the schema (testbed/events/schema.py) and a glossary of
its fields: `python -m testbed.results.event_tables --readme results/README.md` rewrites them; a test keeps them
equal.
"""

from testbed.events.schema import SCHEMA, Measure, OperationFailed, OperationOk, payload_keys

FIELD_DOCS: dict[str, str] = {
    "trials": "number of trials planned",
    "seed": "the run's seed",
    "failures": "failed trials and failed teardown steps",
    "reason": "why the run was stopped, or why a fabric service connection ended",
    "error": "what went wrong, as the user sees it",
    "error_type": "the exception's class (DeviceTimeout, InterlockError, VerificationError, ActorDied ...)",
    "sweep": "the trial's sweep point {parameter: value}",
    "status": "ok or failed",
    "actor_died": "the device actor that died during the trial",
    "circuits": "{switch: {ingress: egress}} (a switch that could not be read: null)",
    "managed": "{switch: [ports the run may change]}",
    "audit_line": "the number of audit.jsonl lines written before the reading",
    "why": "why the reading was taken (or why nothing was left); heal: why a request was never answered",
    "lab_gone": "why there was nothing to read back",
    "healed": "written by `testbed heal`",
    "actor": "the actor's name",
    "pid": "a process id (the actor's worker; the rank's process group leader)",
    "was": "the worker pid before",
    "seconds": "the pause",
    "ok": "true when nothing is wrong",
    "gpus": "nvidia-smi's GPUs (lost ones too)",
    "lost": "bus ids of GPUs lost",
    "xids": "kernel log lines with an Xid",
    "xid_codes": "the Xid codes",
    "kernel_log_error": "why the kernel log could not be read (not unhealthy on its own)",
    "readings": "each GPU as `nvidia-smi -q -x` describes it {index, bus_id, ecc, retired_pages, remapped_rows, "
    "clocks_event_reasons, persistence_mode, fabric, ...}",
    "conditions": "{gpu, bus_id, condition, detail} for each GPU condition a lab acts on (pending_retired_pages, "
    "remapped_rows_pending, remapped_rows_failure, uncorrected_ecc, hw_slowdown, hw_power_brake_slowdown ...)",
    "readings_error": "why `nvidia-smi -q -x` could not be read (not unhealthy on its own)",
    "source": "where a figure comes from (`twin ground truth`)",
    "per_port_db": "{output port: crosstalk in dB}",
    "fault": "the fault's name, `kind@target` (fault.heal closes the fault.inject of the same name)",
    "kind": "the fault kind (gpu.fail, process.kill, transport.latency ...), or what a detection saw, "
    "or why the fabric service said no (refused, unauthorised, invalid, failed)",
    "rank": "the job rank",
    "host": "the host of the rank",
    "gpu": "the rank's GPU on its host",
    "duration_s": "how long the playbook keeps the fault",
    "device": "the device whose connection a transport fault breaks (link.down: the switch whose ports it disables)",
    "toxic": "the fault proxy's name for the fault",
    "stream": "downstream (device -> framework) or upstream",
    "attributes": "the toxic's attributes (Toxiproxy's names and units)",
    "ports": "link.down: the switch's ports disabled",
    "link": "link.down: the host port whose fibre's switch ports were disabled",
    "watching": "every rank was watched when the fault was injected",
    "injected_ns": "the device mark's injection time",
    "job": "the rank's job handle {host, name, pid, log, workdir}",
    "how": "what healed it",
    "first_seen": "the rank whose exit was seen first",
    "failed": "the failed rank (or host)",
    "evidence": "what the host showed (GPU lost, Xid) or the exit",
    "spare": "the spare host",
    "ranks": "the number of ranks",
    "resumed_from": "the step it resumed from (restart: the checkpoint's; in-job: the newest a survivor held)",
    "generation": "recovery: in-job: the job's generation (hostside/membership.py)",
    "slot": "recovery: in-job: the failed rank's slot (its host's name)",
    "step": "the spare's first step after it",
    "by": "{pid, hostname} of the healing process",
    "runner": "the dead runner {pid, hostname, start_ticks}",
    "torn": "last lines set aside (a kill tore them)",
    "open_invokes": "invokes left open by the runner",
    "faults": "fault names",
    "jobs": "rank processes (host:pid) the run left",
    "problems": "what could not be healed",
    "done": "what was healed",
    "ray_session": "the dead run's Ray session folder",
    "ended": "processes ended {pid, name}",
    "still": "pids still there after SIGKILL",
    "ms": "the span in milliseconds",
    "start_ns": "monotonic ns of the span's start",
    "end_ns": "monotonic ns of the span's end",
    "iteration": "rail.iterate: the iteration",
    "mode": "rail.iterate: static, on-demand or provisioning",
    "delay_ms": "rail.iterate: emulated OCS delay per change",
    "intervals_ms": "job.measure: each iteration's interval",
    "hosts": "hosts.health: hosts checked",
    "detected_on_rank": "fault.detect: the rank the failure was seen on",
    "value": "the procedure's result",
    "duration_ms": "the procedure's duration in its actor",
    "audit_lost": "the bytes it exchanged were lost with a process: not in audit.jsonl",
    "invoke_seq": "heal: the seq of the invoke it closes",
    "conn": "fabric service: the connection's number, from 1 in the order the ranks connected",
    "peer": "fabric service: the rank's host:port as the service saw it",
    "op": "fabric service: what the rank asked (hello, setup, prepare, release; null for an unreadable line)",
    "t_server_ns": "fabric service: when the service read the line (its monotonic clock)",
    "hello_rank": "fabric service: the rank a hello says it is (the token is never recorded)",
    "config": "fabric service: the configuration a rank asked for",
    "id": "fabric service: the request's id, the rank's own, returned in its answer",
    "t_job_ns": "fabric service: when the rank sent the request (the rank's clock)",
    "invalid": "fabric service: why a line the rank sent is not a request",
    "t_received_ns": "fabric service: when the service read the request (its monotonic clock)",
    "t_answered_ns": "fabric service: when the service sent the answer (its monotonic clock)",
    "configurations": "fabric service: each configuration it may set, switch -> [ingress, egress] circuits",
    "trigger": "fabric service: the request (setup or prepare) of the last rank to ask, which started the change",
    "t_sent_ns": "fabric service: when the change's first switch command was sent (monotonic)",
    "t_verified_ns": "fabric service: when the change's last switch acknowledged (and showed light, if verified)",
    "t_ready_ns": "fabric service: when the configuration was ready (verified, emulated OCS delay over)",
    "command_ms": "fabric service: framework time from the request that completed the barrier to the first command",
    "changes": "fabric service: how many changes it made",
    "over_limit": "fabric service: connections closed at once, as many were open as it takes",
    "untraced_unauthorised": "fabric service: connections that said no valid hello, beyond the few it recorded",
    "phase": "rail.train: the card's phase (phases over the same circuits counted together: `a..b (n phases)`)",
    "job_bytes": "rail.train: bytes of the messages the job's ranks delivered in the phase (headers included)",
    "plane_bytes": "rail.train: bytes the twin's relays carried for the phase (emulated runs on loopback only)",
    "case": "collective.allreduce: which of the step's cases (e.g. rd-chip)",
    "algorithm": "collective.allreduce: ring (reduce-scatter + all-gather) or rd (recursive doubling)",
    "fabric": "collective.allreduce: the fabric the case runs on (the playbook's label: ocs, chip)",
    "size_bytes": "collective.allreduce: the all-reduce's message size",
    "repetition": "collective.allreduce: the measured all-reduce's number at its size, from 0",
    "reconfig_ms": "collective.allreduce: the part of the all-reduce its rank waited for the fabric service",
}


BEGIN = "<!-- events: generated from testbed/events/schema.py; do not edit by hand -->"
END = "<!-- end of events -->"


def _fields(payload: type) -> str:
    required_keys, optional_keys = payload_keys(payload)
    required = [f"`{k}`" for k in payload.__annotations__ if k in required_keys]
    optional = [f"`{k}`?" for k in payload.__annotations__ if k in optional_keys]
    return ", ".join(required + optional) or "(none)"


def render_event_docs(procedures: dict[str, tuple[str, ...]]) -> str:
    """The events section of results/README.md (`procedures`: each procedure's device marks)."""
    out = [
        BEGIN,
        "",
        "### Framework events",
        "",
        "| event | type | device | fields | what it records |",
        "|---|---|---|---|---|",
    ]
    for spec in SCHEMA.values():
        device = {True: "yes", False: "no", None: "either"}[spec.device]
        types = " / ".join(t for t in ("invoke", "ok", "fail", "info", "mark") if t in spec.types)
        out.append(f"| `{spec.name}` | {types} | {device} | {_fields(spec.payload)} | {spec.doc} |")
    out += [
        "",
        "### Device operations and their marks",
        "",
        "Each is `invoke` (the procedure's arguments) then `ok` ("
        + _fields(OperationOk)
        + "), `fail` or `info` ("
        + _fields(OperationFailed)
        + "), on the device; its marks are `mark` events on the device, timestamped where the I/O happened.",
        "",
        "| operation | device marks |",
        "|---|---|",
    ]
    for name, marks in sorted(procedures.items()):
        out.append(f"| `{name}` | {', '.join(f'`{m}`' for m in marks) or '(none)'} |")
    out += [
        "",
        "### Measures",
        "",
        "`measure` events are spans named `<measure>.<segment>`: " + _fields(Measure) + ".",
        "",
        "### Fields",
        "",
        "| field | meaning |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {v} |" for k, v in sorted(FIELD_DOCS.items())]
    out += ["", END]
    return "\n".join(out)


def replace_block(text: str, block: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + block + text[end:]
