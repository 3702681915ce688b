import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from meanfield._app import bench as _bench


@pytest.fixture(scope="module")
def floor():
    return _bench.measure_floor(repeats=1)


@pytest.fixture(scope="module")
def result(floor):
    return _bench.run(
        [64, 128],
        [2],
        ("numpy", "jax_dense", "jax_blocked"),
        solve_steps=2,
        solve_max_n=64,
        repeats=1,
        max_n={"numpy": 64},
        floor=floor,
        progress=False,
        seed=5,
    )


def _record(result, impl, n):
    (rec,) = [r for r in result["records"] if r["impl"] == impl and r["n"] == n]
    return rec


def test_records_are_timed_and_correct(result):
    ok = [r for r in result["records"] if r["status"] == "ok"]
    assert {(r["impl"], r["n"]) for r in ok} == {
        ("numpy", 64),
        ("jax_dense", 64),
        ("jax_dense", 128),
        ("jax_blocked", 64),
        ("jax_blocked", 128),
    }
    for rec in ok:
        assert rec["d"] == 2
        assert rec["seconds"] > 0
        assert math.isfinite(rec["interactions_per_second"])
        assert rec["interactions_per_second"] == pytest.approx(
            rec["n"] ** 2 / rec["seconds"]
        )
        assert 0 < rec["fraction_of_floor"] < math.inf
        assert rec["peak_bytes"] > 0 and rec["peak_bytes_method"]
        # float32 against the float64 reference
        assert rec["rel_error"] < 1e-5
    assert _record(result, "jax_blocked", 64)["compile_seconds"] > 0


def test_skipped_records_carry_a_reason(result):
    rec = _record(result, "numpy", 128)
    assert rec["status"] == "skipped"
    assert "max_n" in rec["reason"]
    solve = _record(result, "jax_blocked", 128)["solve"]
    assert solve["status"] == "skipped" and "solve_max_n" in solve["reason"]


def test_solve_and_metadata(result):
    solve = _record(result, "jax_blocked", 64)["solve"]
    assert solve["status"] == "ok"
    assert solve["steps"] == 2 and solve["seconds"] > 0
    assert result["floor"]["end"] is None  # the floor was given
    floor = result["floor"]["used"]
    assert floor["exp_per_second"] > 0 and floor["matmul_flops_per_second"] > 0
    assert result["environment"]["device"]["platform"]
    assert result["environment"]["versions"]["jax"]
    assert result["wall_seconds"] > 0


def test_memory_and_time_budgets_skip(floor):
    res = _bench.run(
        [64, 256],
        [2],
        ("numpy", "jax_dense"),
        solve_steps=0,
        repeats=1,
        max_bytes=2 * 128**2 * 4,  # room for n = 64, not for n = 256
        max_seconds_per_case=1e-9,
        floor=floor,
        progress=False,
    )
    by = {(r["impl"], r["n"]): r for r in res["records"]}
    assert by[("numpy", 64)]["status"] == "ok"
    # the n = 256 NumPy case fails both budgets; the time projection comes first
    assert by[("numpy", 256)]["status"] == "skipped"
    assert "projected" in by[("numpy", 256)]["reason"]
    assert by[("jax_dense", 256)]["status"] == "skipped"


def test_reference_and_numpy_agree():
    x, A, V = _bench.problem(300, 3)
    rows = _bench.check_rows(300)
    ref = _bench.reference_rows(x, A, V, rows, chunk=64)
    got = _bench.numpy_velocity(x.astype(np.float64), A, V)[rows]
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_measure_floor(floor):
    for key in ("exp_per_second", "matmul_flops_per_second"):
        assert 0 < floor[key] < math.inf
    assert floor["exp_per_second"] == max(
        floor["exp_elementwise_per_second"], floor["exp_fused_per_second"]
    )
    assert _bench.floor_seconds(1024, 16, floor) > 0


def test_exp_chain_keeps_every_exponential():
    """The accelerators' exp-rate kernel: right values, no step simplified away."""
    from meanfield._app import bench_machine

    y = np.linspace(0.0, 3.0, 257, dtype=np.float32)
    want = y.astype(np.float64)
    for _ in range(bench_machine.EXP_CHAIN):
        want = np.exp(-want)
    got = np.asarray(bench_machine._exp_chain(jnp.asarray(y)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    hlo = bench_machine._exp_chain.lower(jnp.asarray(y)).compile().as_text()
    assert hlo.count("exponential(") == bench_machine.EXP_CHAIN


def test_seed_reaches_the_problems(result):
    assert result["config"]["seed"] == 5
    x5, x0 = _bench.problem(64, 2, 5)[0], _bench.problem(64, 2, 0)[0]
    assert not np.allclose(x5, x0)
    np.testing.assert_array_equal(x5, _bench.problem(64, 2, 5)[0])


def test_options_default_to_scratch_and_say_their_defaults(tmp_path, capsys):
    from meanfield._app import bench_config

    args = bench_config.parse([], "bench")
    # Never over the committed results unless asked.
    assert args.out == "out/bench" and args.seed == 0
    assert bench_config.parse(["--seed", "7"], "bench").seed == 7
    parser = bench_config.parser("bench")
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, action.option_strings
        if action.dest not in ("quick", "replot", "name", "config"):
            assert "default" in action.help, action.option_strings

    from meanfield._app.bench_report import main

    for bad in ("0", "-1"):
        assert main(["--ns", bad, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "`ns` must be" in err
    assert list(tmp_path.iterdir()) == []  # rejected before anything is written


def test_unknown_impl():
    with pytest.raises(ValueError, match="unknown"):
        _bench.run([64], [2], ("torch",), progress=False)


# Second tier (make test-slow): the command with its floor measurement, 24 s; the
# engine it calls is tested above.
@pytest.mark.slow
def test_bench_command_writes_results_and_rejects_bad_config(tmp_path, capsys):
    from meanfield._app.cli import main

    good = tmp_path / "bench.toml"
    good.write_text(
        'ns = [64, 96]\nds = [2]\nimpls = ["numpy", "jax_blocked"]\n'
        "repeats = 1\nsolve_steps = 2\n"
    )
    out = tmp_path / "out"
    argv = ["bench", "--config", str(good), "--out", str(out), "--seed", "3"]
    assert main([*argv, "--no-progress"]) == 0
    assert (out / "nscaling_cpu.json").exists() and (out / "nscaling_cpu.png").exists()
    manifest = json.loads((out / "nscaling_cpu.json").read_text())["manifest"]
    assert {"config", "seed", "versions", "device", "wall_time_s"} <= set(manifest)
    assert manifest["seed"] == 3
    # --quick sets defaults only: explicit sizes win.
    argv = ["bench", "--quick", "--ns", "64", "--ds", "2", "--impls", "numpy"]
    assert main([*argv, "--out", str(out), "--name", "q", "--no-progress"]) == 0
    records = json.loads((out / "nscaling_q.json").read_text())["records"]
    assert {(r["n"], r["d"]) for r in records} == {(64, 2)}
    bad = tmp_path / "bad.toml"
    bad.write_text("ns = [64]\nspeed = 3\n")
    assert main(["bench", "--config", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("meanfield bench: error: unknown key `speed`")


def test_replot_draws_into_out_never_beside_the_results(tmp_path, capsys):
    # A committed results file stays untouched: the figure goes to --out.
    from pathlib import Path

    from meanfield._app.bench_report import main

    committed = Path(__file__).parents[1] / "benchmarks" / "results"
    source = tmp_path / "results" / "nscaling_cpu.json"
    source.parent.mkdir()
    source.write_text((committed / "nscaling_cpu.json").read_text())
    out = tmp_path / "scratch"
    assert main(["--replot", str(source), "--out", str(out)]) == 0
    assert (out / "nscaling_cpu.png").stat().st_size > 10_000
    assert sorted(p.name for p in source.parent.iterdir()) == ["nscaling_cpu.json"]
    assert main(["--replot", str(tmp_path / "missing.json")]) == 2
    assert "--replot" in capsys.readouterr().err
