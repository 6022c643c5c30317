"""An injection the lab's Toxiproxy refuses: the `fault.inject` fail event says why (the proxy, the address, what
was sent, what came back, what to change), the live view shows it, and the run ends with that message and no
traceback; the live view never crashes on a fail event whatever its error text.

The Toxiproxy is the twin's fault proxy served over Toxiproxy's HTTP API, as `testbed emulate --fault-proxy`
gives a lab (tests/proxy/test_toxiproxy_contract.py holds that API to Toxiproxy's).
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from testbed.cli.main import main
from testbed.documents import load_inventory
from testbed.events import Event
from testbed.faults import FAULT_KINDS, ConnectionTarget, FaultEnv, FaultFailed
from testbed.results.progress import ProgressDisplay

LAB = """\
name: refusing-lab
devices:
  ocs1:
    kind: ocs
    driver: polatis-scpi
    transport: {{type: visa, resource: "{visa}", timeout_ms: 1000}}
    size: 16
    fault_proxy: {{api: "{api}", proxy: {proxy}}}
"""

PLAYBOOK = """\
name: refused-fault
trials: 1
steps:
  - action: fault.inject
    fault: {kind: transport.latency, device: ocs1, attributes: {latency: 300.0}}
    duration_ms: 10
"""


def lab_inventory(twin, tmp_path, proxy: str):
    ends = twin.endpoints.devices["ocs1"]
    path = tmp_path / "lab.yaml"
    path.write_text(LAB.format(visa=ends["visa"], api=ends["proxy_api"], proxy=proxy))
    return path, ends["proxy_api"]


def test_a_run_whose_proxy_refuses_the_fault_records_why_and_ends_without_a_traceback(twin, ctl, tmp_path, capsys):
    inventory, api = lab_inventory(twin, tmp_path, "nosuch")  # no proxy of that name on the server: 404
    (tmp_path / "pb.yaml").write_text(PLAYBOOK)
    results = tmp_path / "results"
    code = main(["run", str(tmp_path / "pb.yaml"), "--inventory", str(inventory), "--results", str(results), "--yes"])
    out, err = capsys.readouterr()
    assert code == 1, out + err  # the experiment failed; not a crash (an uncaught exception) and not a refusal (2)
    assert "Traceback" not in out + err

    (run_dir,) = results.iterdir()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (fail,) = [e for e in events if e["op"] == "fault.inject" and e["type"] == "fail"]
    error = fail["data"]["error"]
    assert error.startswith(f"ocs1: the Toxiproxy API at {api}: ")  # the device and the API's address
    assert f'sent POST {api}/proxies/nosuch/toxics {{"name": "latency-1", "type": "latency"' in error  # what was sent
    assert '"attributes": {"latency": 300}' in error  # 300.0 in the playbook went out as the integer Toxiproxy takes
    assert "got HTTP 404: proxy not found" in error  # what came back: Toxiproxy's status and text
    assert "set fault_proxy.proxy of ocs1 to the name of the proxy in front of it" in error  # what to change
    assert "(its proxies: ocs1)" in error
    assert not [e for e in events if e["op"] == "fault.heal"]  # certainly not applied: nothing to heal

    shown = " ".join((out + err).split())  # the live view and the summary, lines joined as the terminal wrapped them
    assert "fail ocs1: fault.inject: ocs1: the Toxiproxy API at" in shown
    assert "failed: transport.latency on ocs1: ocs1: the Toxiproxy API at" in shown
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    assert ctl.call("ocs1", "proxy.state")["toxics"] == []
    assert main(["check", str(run_dir)]) == 0  # the history is whole: the refused fault left nothing active


def test_a_fraction_sent_where_toxiproxy_takes_an_integer_is_refused_with_its_400(twin, ctl, tmp_path):
    """A hand-made fault (a playbook's is refused at validate) sending what the project sent before."""
    inventory, api = lab_inventory(twin, tmp_path, "ocs1")
    env = FaultEnv(None, lambda *a: pytest.fail(f"no device procedure on a lab: {a}"), load_inventory(inventory).model)
    target = ConnectionTarget("ocs1", "latency-1", "downstream", (("latency", 20.5),))
    with pytest.raises(FaultFailed) as refused:
        FAULT_KINDS.get("transport.latency").inject(env, target)
    assert str(refused.value) == (
        f"ocs1: the Toxiproxy API at {api}: sent POST {api}/proxies/ocs1/toxics "
        '{"name": "latency-1", "type": "latency", "stream": "downstream", "toxicity": 1.0, "attributes": '
        '{"latency": 20.5}}; got HTTP 400: bad request body: json: cannot unmarshal number 20.5 into Go struct field '
        "LatencyToxic.attributes.latency of type int64; the server refused it; check the fault's attributes and "
        "stream, and the proxy (fault_proxy.proxy)"
    )
    assert ctl.call("ocs1", "proxy.state")["toxics"] == []


@pytest.mark.parametrize("data", [{}, {"error": ""}, {"error": None}, {"error": "\n  \n"}, {"error": 42}])
def test_the_live_view_shows_a_fail_event_without_error_text_and_goes_on(data):
    screen = io.StringIO()
    console = Console(file=screen, width=200, force_terminal=False)
    with ProgressDisplay(console, total_trials=1) as view:
        view.on_event(Event(1, "fail", "fault.inject", 0, 0.0, "run", 0, "step", device="ocs1", data=data))
        view.on_event(
            Event(2, "fail", "fault.inject", 0, 0.0, "run", 0, "step", device="ocs1", data={"error": "\nwhy"})
        )
    shown = screen.getvalue()
    expected = "42" if data.get("error") == 42 else "(no error text recorded)"
    assert f"fail ocs1: fault.inject: {expected}" in shown
    assert "fail ocs1: fault.inject: why" in shown  # the first line with text


def test_the_live_view_prints_an_error_with_brackets_as_text():
    screen = io.StringIO()
    with ProgressDisplay(Console(file=screen, width=200, force_terminal=False), total_trials=1) as view:
        view.on_event(
            Event(1, "fail", "fault.inject", 0, 0.0, "run", device="ocs1", data={"error": "[red]x[/] [/bold]"})
        )
    assert "fail ocs1: fault.inject: [red]x[/] [/bold]" in screen.getvalue()  # Rich markup in an error is not markup
