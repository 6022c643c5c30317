"""`testbed export SELECTION --format csv|parquet`: the selected runs' span samples with their provenance, and the
runs, as files for an analysis elsewhere (docs/catalog.md).
"""

from __future__ import annotations

from rich.console import Console

from testbed.contracts.errors import EXIT_OK, UserError


def add_parser(sub) -> None:
    from testbed.cli.runs import add_selection_options

    p = sub.add_parser(
        "export",
        help="write the selected runs' span samples (with each run's provenance) and the runs as CSV or Parquet",
    )
    add_selection_options(p)
    p.add_argument("--format", choices=("csv", "parquet"), default="csv", help="csv (default) or parquet")
    p.add_argument(
        "--out",
        metavar="PATH",
        help="the samples' file (default ./export.csv or ./export.parquet); the runs go beside it as "
        "NAME.runs.EXT; - writes the samples' CSV to standard output",
    )
    p.add_argument("--span", action="append", help="only samples of this span (repeat for several)")


def cmd_export(args, console: Console) -> int:
    from testbed.catalog.export import require_pyarrow, select, write
    from testbed.catalog.query import results_paths
    from testbed.cli.runs import selection_filters

    if args.format == "parquet":
        require_pyarrow("--format parquet")  # before the work, not after it
    dirs = results_paths(args.results)
    if args.span:
        from testbed.catalog.query import span_counts, unknown_spans

        problem = unknown_spans(args.span, span_counts(dirs, **selection_filters(args)))
        if problem:
            raise UserError(problem)
    selection = select(dirs, args.span, **selection_filters(args))
    if not len(selection.runs):
        raise UserError("no run matches; `testbed runs` with the same options lists what there is")
    out = args.out or f"export.{args.format}"
    try:
        written = write(selection, out, args.format)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there ({exc.strerror or exc}); pass --out PATH elsewhere") from None
    if written[0][0] is None:
        return EXIT_OK  # the samples went to stdout: nothing else on it
    say = Console(stderr=True, highlight=False)
    for (path, rows), what in zip(written, ("samples", "runs"), strict=False):
        say.print(f"wrote {path}: {rows} {what}", markup=False, soft_wrap=True)
    return EXIT_OK
