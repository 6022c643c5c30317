"""The framework's share of each reconfiguration the job's fabric service made, per sweep point (`testbed report`,
and the end of `testbed run`): from the service's measures (testbed/fabric_service/serving.py), p50s of the whole
change (the request that completed it read -> the last waiting rank answered), of the framework's time before the
switch command (request read -> first command) and after the light (ready -> answer), and their share of the
change. The rest is the switch's own time, its light check and the emulated OCS delay.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

CHANGE, COMMAND, ANSWER = "fabric_service.change_time", "fabric_service.command_time", "fabric_service.answer_time"


def framework_share_table(summary: dict[str, Any]) -> Table | None:
    """The table of the framework's share of each change, one row per sweep point; None when the run's summary
    (summary.json) has no fabric-service change.
    """
    points = [p for p in summary.get("sweep") or [] if (p.get("spans") or {}).get(CHANGE, {}).get("n")]
    if not points:
        return None
    table = Table(title="the framework's share of each fabric-service change (p50)", title_justify="left")
    for col in ("sweep point", "changes", "change ms", "request -> command ms", "light -> answer ms", "framework"):
        table.add_column(col, justify="left" if col == "sweep point" else "right")
    for p in points:
        spans = p["spans"]
        change = spans[CHANGE]["p50_ms"]
        command = spans.get(COMMAND, {}).get("p50_ms")
        answer = spans.get(ANSWER, {}).get("p50_ms")
        framework = (command or 0.0) + (answer or 0.0)
        point = ", ".join(f"{k}={v}" for k, v in sorted(p.get("point", {}).items()))
        table.add_row(
            point or "(the run)",
            str(spans[CHANGE]["n"]),
            f"{change:.2f}",
            "" if command is None else f"{command:.2f}",
            "-" if answer is None else f"{answer:.2f}",
            f"{100 * framework / change:.1f} %" if change > 0 else "",
        )
    table.caption = "light -> answer '-': no rank waited (the change was hidden behind the compute)"
    table.caption_justify = "left"
    return table
