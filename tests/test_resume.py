"""Resuming studies by their chunks: `mf.ChunkLog`, `--resume`, and who has none."""

import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import meanfield as mf
from meanfield._app.cli import main


def _final(sol):
    """A chunk's reduction: the final tokens and the steps taken."""
    return sol.x[:, -1], sol.num_steps


def _ensemble(key, systems=7):
    x = jax.random.normal(key, (systems, 4, 2))
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    attn = mf.SoftmaxAttention(jnp.eye(2), A=3.0 * jnp.eye(2))
    return jax.vmap(mf.Particles)(x), attn


def test_an_ensemble_resumed_from_its_chunk_log_is_bit_for_bit_the_whole(key):
    measures, attn = _ensemble(key)
    options = dict(reduce=_final, normalization="sphere", saveat=jnp.linspace(0, 2, 3))
    recorded = []
    log = mf.ChunkLog(on_chunk=lambda index, out: recorded.append(index))
    whole = mf.simulate_ensemble(
        measures, attn, 2.0, chunk_size=2, chunks=log, **options
    )
    # 7 systems in chunks of 2: 4 chunks, each recorded once, the last one short.
    assert log.width == 2 and sorted(recorded) == [0, 1, 2, 3]
    assert log.done[3][0].shape == (1, 4, 2)
    # An interrupted run left chunks 0 and 2; the resumed call keeps their layout
    # (width 2) whatever its own chunk_size says, and solves only 1 and 3.
    recorded.clear()
    kept = {index: log.done[index] for index in (0, 2)}
    resumed = mf.ChunkLog(
        kept, width=2, on_chunk=lambda index, out: recorded.append(index)
    )
    again = mf.simulate_ensemble(measures, attn, 2.0, chunks=resumed, **options)
    assert sorted(recorded) == [1, 3] and sorted(resumed.done) == [0, 1, 2, 3]
    for a, b in zip(whole, again, strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_a_chunk_log_of_another_layout_is_refused(key):
    measures, attn = _ensemble(key)
    log = mf.ChunkLog({5: None}, width=2)
    with pytest.raises(ValueError, match=r"holds chunks \[5\], but B = 7 .* make 4"):
        mf.simulate_ensemble(measures, attn, 1.0, chunks=log, reduce=_final)
    with pytest.raises(ValueError, match="`width` must be an integer >= 1; got 0"):
        mf.ChunkLog(width=0)


def _help(capsys, command) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["demo", "lipschitz", "density", "bench"])
def test_commands_without_resume_say_so_in_their_own_help(capsys, command):
    text = _help(capsys, command)
    assert "Not resumable (no --resume): an interrupted run starts again" in text
    assert "--resume " not in text.replace("(no --resume)", "")


@pytest.mark.parametrize("command", ["simulate", "phase", "gaussian"])
def test_resumable_commands_take_resume(capsys, command):
    text = _help(capsys, command)
    assert "--resume" in text and "Not resumable" not in text


# Second tier: the real command, killed (about 40 s).
SLOW_RUNS = {
    # 2048 systems in 8 chunks of 256: seconds of solves after the first chunk.
    "phase": (
        "n = 16\nsystems = 256\nbetas = [1.0, 8.0, 8]\nt1 = 30.0\nchunk_size = 256\n",
        "chunk-*.npz",
        "phase.npz",
    ),
    # Killed once the softmax variant is saved: two variants and 4 chunks remain.
    "gaussian": (
        "[phase]\ns_range = [-1.5, 1.5, 20]\nr_range = [-1.5, 1.5, 20]\n"
        "chunk_size = 100\n",
        "part-*.npz",
        "gaussian.npz",
    ),
}


def _command(command, config, out, *extra):
    argv = [command, "--config", str(config), "--out", str(out), "--no-progress"]
    return [sys.executable, "-m", "meanfield", *argv, *extra]


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(SLOW_RUNS))
def test_a_run_killed_after_its_first_checkpoint_resumes_bit_for_bit(tmp_path, command):
    text, first, arrays = SLOW_RUNS[command]
    config = tmp_path / "run.toml"
    config.write_text(text)
    whole, part = tmp_path / "whole", tmp_path / "part"
    subprocess.run(_command(command, config, whole), check=True, timeout=600)
    proc = subprocess.Popen(
        _command(command, config, part),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600
    while not list((part / "checkpoint").glob(first)):
        assert proc.poll() is None, "finished before its first checkpoint was seen"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup: as a lost machine
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert not (part / "manifest.json").exists()
    done = sorted(p.name for p in (part / "checkpoint").glob("*.npz"))
    whole_parts = sorted(p.name for p in (whole / "checkpoint").glob("*.npz"))
    assert done and len(done) < len(whole_parts), done
    # The killed run's lock is taken over; only the missing parts are solved.
    run = subprocess.run(
        _command(command, config, part, "--resume"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "from the checkpoint" in run.stdout
    with np.load(whole / arrays) as a, np.load(part / arrays) as b:
        assert a.files == b.files
        for name in a.files:
            assert a[name].tobytes() == b[name].tobytes(), name
    for png in sorted(whole.glob("*.png")):
        assert png.read_bytes() == (part / png.name).read_bytes(), png.name
