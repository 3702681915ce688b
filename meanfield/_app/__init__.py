"""The application layer: the `meanfield` command line on top of the library.

    cli.py              argparse entry point (`meanfield <command>`); imports no JAX
    config.py           configuration schemas: key -> (checker, default), `resolve`
    report.py           the skeleton of every report: `Report`, `Output`, `Result`
    manifest.py         run manifests (configuration, seed, versions, device)
    lock.py             the output directory's lock (stale after a kill or pid reuse)
    interrupts.py       Ctrl-C that stops a run even where a callback swallows it
    chunk_checkpoint.py checkpoints by finished chunks (`phase`, `gaussian --resume`)
    gaussian_report.py  `meanfield gaussian`
    lipschitz_report.py `meanfield lipschitz` (its summary: lipschitz_summary.py)
    simulate_*.py       `meanfield simulate`: config (schema, attention families
                        from the registry), segments (checkpoints), report
    bench*.py           `meanfield bench`: config (options, no JAX), machine
                        (floor, environment), cases, the engine (bench.py), report
    demo.py             `meanfield demo`, the tour

The library never imports from here.
"""
