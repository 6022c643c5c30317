"""`testbed.runs()`: a selection of runs as a pandas DataFrame, for notebooks (docs/catalog.md).

pandas is an optional extra (`pip install 'testbed[analysis]'`): it is imported when the function is called,
so `import testbed` and the flat API never need it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from testbed.catalog.export import ANALYSIS_EXTRA, select

PANDAS_DTYPES = {"str": "string", "json": "string", "int": "Int64", "float": "float64", "bool": "boolean"}


def runs(
    results_dir: str | Path | Iterable[str | Path] | None = None,
    spans: str | Iterable[str] | None = None,
    **filters,
):
    """Every span sample of the selected runs, one row each, with its run's provenance: a pandas DataFrame.

    `results_dir` is a results folder or a list of them (default ./results); `spans` a span name or several (all if
    None); `filters` those of testbed.catalog.select_runs: run, playbook, inventory, target ("lab" or "twin"),
    status, since, until, commit, tag (one, or a list that must all be there), protocol. Columns: run_id, folder,
    results, status, playbook, inventory, target, protocols, switches, seed, git_commit, git_dirty,
    testbed_version, user, host, started, ended (UTC timestamps), tags, then trial, sweep (JSON), step, span, ms,
    and a column sweep.NAME per sweep key. A run without samples has no row (testbed.catalog.select_runs lists
    every run). The same table as `testbed export`.
    """
    try:
        import numpy as np
        import pandas as pd
    except ImportError:
        raise ImportError(
            f"testbed.runs() returns a pandas DataFrame and pandas is not installed: {ANALYSIS_EXTRA}"
        ) from None
    table = select(results_dir, spans, **filters).samples
    rows = np.asarray(table.repeat, dtype=np.int64)  # each sample's run, once for every per-run column
    data = {}
    for name, values in table.columns.items():
        kind = table.types[name]
        if kind == "time":
            series = pd.to_datetime(pd.Series(values, dtype="object"), utc=True, format="ISO8601")
        elif kind in PANDAS_DTYPES:
            series = pd.Series(values, dtype=PANDAS_DTYPES[kind])
        else:  # a sweep key: what pandas makes of the values the sweep gave
            series = pd.Series(values)
        if name in table.per_run:  # one value per run: spread to the run's samples
            series = series.take(rows).reset_index(drop=True)
        data[name] = series
    return pd.DataFrame(data, columns=list(table.columns))
