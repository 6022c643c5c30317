"""A run folder is input (docs/run-folders.md, "Files"): a link planted in it is never followed, a FIFO or a
device never read, a file too large or nested too deep refused with a clear error (exit 2), never a hang, a
traceback or the machine's memory. Each test is one attack, made as an attacker who can write the folder would.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from folders import REPO, healable_run, run_testbed, summarised, victim

from testbed.cli.main import main
from testbed.events import read_jsonl
from testbed.events.safe_files import MAX_JSON_DEPTH, UnsafeFile, atomic_writer, read_json, write_atomic

pytestmark = pytest.mark.unchecked_history("these folders are attacked, and heal is refused on most of them")


# --- heal writes nothing through a link ------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["run.tmp", "summary.tmp"])
def test_heal_rewrites_run_json_and_writes_its_summary_without_writing_through_a_planted_tmp_link(tmp_path, planted):
    run = healable_run(tmp_path / "run")
    target = victim(tmp_path / "root")
    (run / planted).symlink_to(target)

    assert main(["heal", str(run)]) == 0
    assert target.read_text() == "root's own file\nits last line"
    assert json.loads((run / "run.json").read_text())["status"] == "aborted"
    assert json.loads((run / "summary.json").read_text())["status"] == "aborted"
    assert (run / planted).is_symlink() and not (run / "run.json").is_symlink()


@pytest.mark.parametrize("history", ["audit.jsonl", "events.jsonl"])
def test_heal_refuses_a_history_that_is_a_link_and_cuts_nothing_off_its_target(tmp_path, capsys, history):
    run = healable_run(tmp_path / "run")
    target = victim(tmp_path / "root")  # its last line has no newline: what heal sets aside as torn
    (run / history).unlink()
    (run / history).symlink_to(target)

    assert main(["heal", str(run)]) == 2
    assert target.read_text() == "root's own file\nits last line"
    err = capsys.readouterr().err
    assert f"{history}: a symbolic link" in err and "never through a link" in err


@pytest.mark.parametrize("history", ["audit.jsonl", "events.jsonl"])
def test_heal_sets_a_torn_line_aside_never_appending_it_through_a_planted_torn_link(tmp_path, capsys, history):
    run = healable_run(tmp_path / "run")
    with open(run / history, "a") as f:
        f.write('{"seq": 99, "ty')  # torn, as a kill leaves it
    target = victim(tmp_path / "root")
    (run / f"{history}.torn").symlink_to(target)

    assert main(["heal", str(run)]) == 2
    assert target.read_text() == "root's own file\nits last line"
    assert f"{history}.torn: a symbolic link" in capsys.readouterr().err
    assert (run / history).read_text().endswith('{"seq": 99, "ty')  # left as it was: nothing half done


# --- FIFOs and devices: refused at once --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "replay", "heal"])
@pytest.mark.parametrize("name", ["run.json", "events.jsonl", "audit.jsonl"])
def test_a_fifo_in_the_folder_ends_the_command_at_once_with_a_clear_error(tmp_path, command, name):
    run = healable_run(tmp_path / "run")
    (run / name).unlink()
    os.mkfifo(run / name)  # no writer will ever come: reading it would block forever

    proc = run_testbed(command, str(run), timeout=60)  # a deadline only: the command must end by itself

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and name in proc.stderr
    if not (command == "heal" and name == "events.jsonl"):  # heal: "no events.jsonl" (it is no file)
        assert "a FIFO" in proc.stderr


@pytest.mark.parametrize("command", ["check", "replay", "heal"])
def test_a_history_that_is_a_folder_is_refused_with_a_clear_error(tmp_path, capsys, command):
    run = healable_run(tmp_path / "run")
    (run / "audit.jsonl").unlink()
    (run / "audit.jsonl").mkdir()

    assert main([command, str(run)]) == 2
    assert "audit.jsonl: a folder, not a regular file" in capsys.readouterr().err


def test_a_run_json_linked_to_dev_zero_is_refused_not_read(tmp_path):
    run = healable_run(tmp_path / "run")
    (run / "run.json").unlink()
    (run / "run.json").symlink_to("/dev/zero")

    proc = bounded(["check", str(run)])

    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "run.json: a symbolic link (to /dev/zero)" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root (CI runs as root)")
def test_a_run_json_that_is_a_device_node_is_refused_not_read(tmp_path):
    run = healable_run(tmp_path / "run")
    (run / "run.json").unlink()
    os.mknod(run / "run.json", 0o600 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero's numbers

    proc = bounded(["check", str(run)])

    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "run.json: a character device, not a regular file" in proc.stderr


# --- too large, too deep --------------------------------------------------------------------------------------

MEMORY_LIMIT = 3 << 30  # address space for the command: a file read whole past this is a MemoryError


def bounded(args: list[str]) -> subprocess.CompletedProcess:
    """The command with its address space limited: one that reads a hostile file whole dies of it, visibly."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    return subprocess.run(
        [sys.executable, "-m", "testbed", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
    )


def test_a_huge_sparse_events_jsonl_is_refused_in_bounded_memory(tmp_path):
    run = healable_run(tmp_path / "run")
    with open(run / "events.jsonl", "r+b") as f:
        f.truncate(6 << 30)  # 6 GB, nearly all of it a hole: zeros, no newline

    proc = bounded(["check", str(run)])

    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert "events.jsonl:3: a line over the limit" in proc.stderr


def test_a_file_over_its_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "run.json"
    with open(path, "wb") as f:
        f.truncate(100)
    with pytest.raises(UnsafeFile, match=r"run.json: 100 bytes, over the limit of 10 bytes"):
        read_json(path, limit=10)


@pytest.mark.parametrize("command", ["check", "replay", "heal"])
def test_a_run_json_nested_100k_deep_is_a_clear_error_not_a_recursion_error(tmp_path, capsys, command):
    run = healable_run(tmp_path / "run")
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)

    assert main([command, str(run)]) == 2
    err = capsys.readouterr().err
    assert f"run.json: JSON nested more than {MAX_JSON_DEPTH} deep" in err


def test_an_event_nested_deeper_than_the_limit_names_its_line(tmp_path, capsys):
    run = healable_run(tmp_path / "run")
    with open(run / "events.jsonl", "a") as f:
        f.write('{"seq": 9, "data": ' + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1) + "}\n")

    assert main(["check", str(run)]) == 2
    assert f"events.jsonl:3: JSON nested more than {MAX_JSON_DEPTH} deep" in capsys.readouterr().err


def test_a_jsonl_file_is_read_line_by_line_with_its_torn_last_line_left_out(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c"')
    read = read_jsonl(path)
    assert read.numbered() == [(1, {"a": 1}), (3, {"b": 2})]
    assert read.torn is not None and "4 bytes" in read.torn


# --- temporary files: exclusive, unpredictable, in the destination -----------------------------------------------


def test_a_file_is_written_aside_under_a_fresh_name_then_renamed_and_nothing_is_left_on_failure(tmp_path):
    target = tmp_path / "report.html"
    names = set()
    for _ in range(3):
        with atomic_writer(target) as f:
            names.add(os.path.basename(f.name if isinstance(f.name, str) else ""))
            f.write(b"x")
    assert target.read_bytes() == b"x" and sorted(os.listdir(tmp_path)) == ["report.html"]
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"x" and sorted(os.listdir(tmp_path)) == ["report.html"]


def test_a_write_replaces_a_planted_link_at_the_target_and_never_writes_through_it(tmp_path):
    target = victim(tmp_path / "root")
    (tmp_path / "run.json").symlink_to(target)
    write_atomic(tmp_path / "run.json", "{}\n")
    assert target.read_text() == "root's own file\nits last line"
    assert not (tmp_path / "run.json").is_symlink() and (tmp_path / "run.json").read_text() == "{}\n"


# --- report writes nothing through a link ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("planted", "args"),
    [("report.html.tmp", ["--html"]), ("latency_cdf.png.tmp", []), ("latency_cdf.png.tmp", ["--html"])],
)
def test_report_writes_its_page_and_figures_without_writing_through_a_planted_tmp_link(tmp_path, planted, args):
    run = summarised(healable_run(tmp_path / "run", measures=6))
    target = victim(tmp_path / "root")
    (run / planted).symlink_to(target)

    assert main(["report", str(run), *args]) == 0
    assert target.read_text() == "root's own file\nits last line"
    written = run / ("report.html" if args else "latency_cdf.png")
    assert written.is_file() and not written.is_symlink() and (run / planted).is_symlink()
    assert not [p for p in os.listdir(run) if p.endswith(".tmp") and p != planted]


# --- the catalog and export ----------------------------------------------------------------------------------


def test_runs_tag_never_appends_through_a_planted_annotations_link(tmp_path, capsys):
    run = healable_run(tmp_path / "results" / "run")
    target = victim(tmp_path / "root")
    (run / "annotations.jsonl").symlink_to(target)

    assert main(["runs", "tag", str(run), "fig3", "--results", str(tmp_path / "results")]) == 2
    assert target.read_text() == "root's own file\nits last line"
    assert "annotations.jsonl: a symbolic link" in capsys.readouterr().err


def test_export_never_writes_through_a_link_planted_under_the_temporary_name_it_would_pick(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    healable_run(results / "run")
    out.mkdir()
    target = victim(tmp_path / "root")
    for name in ("x.csv", "x.runs.csv"):  # the names the export used to write aside under: .NAME.<pid>.part
        (out / f".{name}.{os.getpid()}.part").symlink_to(target)

    assert main(["export", "--results", str(results), "--out", str(out / "x.csv")]) == 0
    assert target.read_text() == "root's own file\nits last line"
    assert (out / "x.csv").read_text().startswith("run_id,") or (out / "x.csv").stat().st_size > 0
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


# --- what the fuzz found (tests/run_folders/fuzz_run_folder.py): each a traceback before -------------------------


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("seed", ["x"], """'seed' is ["x"], not an integer"""),
        ("run", -1, "'run' is -1, not a string"),
        ("runner", {"pid": "1"}, """'runner.pid' is "1", not an integer"""),
    ],
)
@pytest.mark.parametrize("command", ["check", "replay", "heal"])
def test_a_run_json_field_of_another_type_is_named_not_a_traceback(tmp_path, capsys, command, field, value, said):
    run = healable_run(tmp_path / "run")
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, field: value}))

    assert main([command, str(run)]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("pid", ["/dev/zero", [], True, -5])
def test_heal_acts_on_no_job_whose_recorded_pid_is_no_pid(tmp_path, capsys, pid):
    run = healable_run(tmp_path / "run")
    job = {"host": "gpu01", "name": "rank0.1", "pid": pid, "log": "", "workdir": ""}
    with open(run / "events.jsonl", "a") as f:
        for seq, type_, data in ((3, "invoke", {"name": "rank0.1"}), (4, "ok", {"value": job})):
            event = {"seq": seq, "type": type_, "op": "gpu.start_job", "mono_ns": seq, "wall": 1.0, "run": run.name}
            f.write(json.dumps({**event, "device": "gpu01", "data": data}) + "\n")

    assert main(["heal", str(run)]) == 0  # the twin is gone: heal records it, and ends no process for that job
    out = capsys.readouterr().out
    assert "ended" not in out and "killed" not in out


@pytest.mark.parametrize("circuits", [None, [], "x", {"ocs1": []}, {"ocs1": {"1": "x"}}, {"ocs1": {"1": 1e308}}])
@pytest.mark.parametrize("command", ["check", "replay", "heal"])
def test_initial_circuits_of_another_shape_are_an_answer_not_a_traceback(tmp_path, capsys, command, circuits):
    run = healable_run(tmp_path / "run")
    mark = {"seq": 3, "type": "mark", "op": "fabric.initial", "mono_ns": 3, "wall": 1.0, "run": run.name}
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({**mark, "data": {"circuits": circuits, "managed": {}}}) + "\n")

    assert main([command, str(run)]) in (0, 1, 2)  # an answer; a refusal says why
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if err:
        assert "circuits" in err


FAULT_NAMED_NULL = [
    {"type": "invoke", "op": "fault.inject", "device": "gpu01", "data": {"fault": None, "kind": "rank.kill"}},
    {"type": "ok", "op": "fault.inject", "device": "gpu01", "data": {"fault": None}},
]
FAULT_DATA_NULL = [
    {"type": "invoke", "op": "fault.inject", "device": "gpu01", "data": None},
    {"type": "ok", "op": "fault.inject", "device": "gpu01", "data": None},
]
JOB_VALUE_HUGE = [
    {"type": "invoke", "op": "gpu.start_job", "device": "gpu01", "data": {"name": "rank0.1"}},
    {"type": "ok", "op": "gpu.start_job", "device": "gpu01", "data": {"value": 1e308}},
]


@pytest.mark.parametrize(
    "events", [FAULT_NAMED_NULL, FAULT_DATA_NULL, JOB_VALUE_HUGE], ids=["fault-null", "data-null", "value-1e308"]
)
@pytest.mark.parametrize("command", ["check", "replay", "heal"])
def test_a_fault_or_job_event_of_another_shape_is_an_answer_not_a_traceback(tmp_path, capsys, command, events):
    """The fuzz's findings the issue names (`fault: null`, an event's data null, a job's `value: 1e308`): heal ended
    with a traceback on each, check on a null data.
    """
    run = healable_run(tmp_path / "run")
    with open(run / "events.jsonl", "a") as f:
        for seq, event in enumerate(events, start=3):
            f.write(json.dumps({"seq": seq, "mono_ns": seq, "wall": 1.0, "run": run.name, **event}) + "\n")

    assert main([command, str(run)]) in (0, 1)  # a verdict, or heal's record of the gone twin
    said = capsys.readouterr()
    assert "Traceback" not in said.err
    if command == "heal":  # no job handle among them: heal ends no process for it
        assert "ended" not in said.out and "killed" not in said.out
