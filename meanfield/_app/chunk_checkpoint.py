"""Checkpoints of studies made of independent parts: `phase` and `gaussian --resume`.

A study of many systems (`meanfield phase`, the blow-up grid of `meanfield
gaussian`) is solved chunk by chunk (`mf.ChunkLog`), and a chunk is the same
computation whatever ran before it. So the study is checkpointed by its finished
parts, in the directory `checkpoint/` of the output directory:

    run.json          the command, its configuration and seed, the chunk width
                      and the number of parts (written first)
    chunk-00000.npz   the output of chunk 0 (arrays a0, a1, ...), written as soon
                      as the chunk ends, in whatever order the chunks end
    part-<name>.npz   a named part's arrays (the Gaussian variants' solves)

each file written atomically (`meanfield._io`). A resumed run checks `run.json`
against its own configuration and seed (a one-line ValueError naming what
differs: exit status 2), takes the chunk width from it and reads back every part
present; it solves only the others, so its arrays are bit for bit those of an
uninterrupted run. A fresh run removes the old parts before its first one.
"""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import _io
from .._ensemble import ChunkLog
from .config import short
from .lock import UnusableDirectory
from .manifest import jsonable, versions, write_manifest, written_by_meanfield

#: The checkpoint directory's name in the output directory.
CHECKPOINT = "checkpoint"
#: The checkpoint's description, written before any part.
HEADER = "run.json"
#: Versions whose change may change the last bits of a resumed part (the
#: manifest's, less matplotlib: the figures are drawn again, not resumed).
_VERSIONED = ("meanfield", "jax", "jaxlib", "diffrax", "equinox", "numpy")
_MISSING = object()


def _chunk_name(index: int) -> str:
    return f"chunk-{index:05d}.npz"


def _part_name(name: str) -> str:
    return f"part-{name}.npz"


def _ours(name: str) -> bool:
    """Whether a file of the checkpoint directory is one a run writes."""
    return (
        name == HEADER
        or (name.startswith(("chunk-", "part-")) and name.endswith(".npz"))
        or (name.startswith(".") and ".tmp-" in name)  # a killed writer's
    )


def _well_formed(header: Any) -> bool:
    """Whether a parsed `run.json` is a meanfield checkpoint's description."""
    width = header.get("width") if isinstance(header, dict) else None
    return (
        written_by_meanfield(header)
        and isinstance(header.get("config"), dict)
        and isinstance(header.get("chunks"), int)
        and isinstance(header.get("parts"), list)
        and (width is None or (isinstance(width, int) and width >= 1))
    )


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a configuration's leaves (`noise.sigma`)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _plain(value: Any) -> Any:
    """The value as JSON reads it back: tuples as lists, inf as "inf"."""
    return json.loads(json.dumps(jsonable(value)))


def differences(saved: dict, config: dict) -> list[str]:
    """`key: old -> new` for every key whose value differs, sorted by key.

    Args:
        saved: the configuration a checkpoint records (as JSON read it back).
        config: the configuration of this run.
    """
    old, new = _flat(saved), _flat(_plain(config))

    def show(values: dict, key: str) -> str:
        return short(values[key]) if key in values else "(none)"

    return [
        f"`{key}`: {show(old, key)} -> {show(new, key)}"
        for key in sorted(set(old) | set(new))
        if old.get(key, _MISSING) != new.get(key, _MISSING)
    ]


class Checkpoint:
    """The checkpoint of one run: its description and the parts it holds.

    Use `Checkpoint.open`; `save_part`, `load_part` and `chunk_log` read and
    write the parts.

    Attributes:
        dir: the checkpoint directory, `OUT/checkpoint`.
        header: what `run.json` holds: command, config, seed, width, chunks,
            parts, versions.
        continued: whether it is an earlier run's, continued by this one.
        resumed: parts read back from the earlier run (0 for a fresh run).
    """

    def __init__(self, directory: Path, header: dict, *, continued: bool = False):
        self.dir = directory
        self.header = header
        self.continued = continued
        self.resumed = 0

    @property
    def width(self) -> int | None:
        """Systems per chunk of the run (None: the study chooses)."""
        return self.header.get("width")

    @property
    def total(self) -> int:
        """Parts of the whole run: its chunks and its named parts."""
        return self.header["chunks"] + len(self.header["parts"])

    @classmethod
    def read(
        cls, out: str | os.PathLike, command: str, config: dict, seed
    ) -> "Checkpoint | None":
        """The checkpoint in `out` if this run may resume from it; None if none.

        Args:
            out: the output directory.
            command: the command's name (`phase`, `gaussian`).
            config: the run's resolved configuration.
            seed: the run's seed.

        Raises:
            ValueError: the checkpoint is unreadable, or was written by another
                command, configuration or seed (one line naming the difference).
        """
        directory = Path(out) / CHECKPOINT
        path = directory / HEADER
        if not path.exists():
            return None
        try:
            header = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(
                f"cannot read checkpoint {str(path)!r} ({err}); remove "
                f"{str(directory)!r} to start afresh"
            ) from err
        if not _well_formed(header):
            raise ValueError(
                f"{str(path)!r} is not a meanfield checkpoint; remove "
                f"{str(directory)!r} to start afresh"
            )
        where = f"checkpoint {str(directory)!r}"
        use = "use another --out, or the configuration and seed of that run"
        if header.get("command") != command:
            raise ValueError(
                f"{where} was written by `meanfield {header.get('command')}`, not "
                f"`meanfield {command}`; {use}"
            )
        diff = differences(header["config"], config)
        if diff:
            raise ValueError(
                f"{where} was written by another configuration ({'; '.join(diff)}); "
                f"{use}"
            )
        if header.get("seed") != seed:
            raise ValueError(
                f"{where} was written with --seed {header.get('seed')}, not {seed}; "
                f"{use}"
            )
        return cls(directory, header, continued=True)

    @classmethod
    def open(
        cls,
        output,
        command: str,
        config: dict,
        seed,
        *,
        resume: bool,
        chunks: int,
        width: int | None = None,
        parts: tuple[str, ...] = (),
    ) -> "Checkpoint":
        """The run's checkpoint: the one to resume from, or a new, empty one.

        Args:
            output: the run's `report.Output` (its directory, its notes).
            command: the command's name.
            config: the run's resolved configuration (what a resumed run must
                match).
            seed: the run's seed.
            resume: continue from the checkpoint in the directory, if any (with
                a note when there is none); else start a new one.
            chunks: chunks of the run in the layout `width`.
            width: systems per chunk (None: the study's choice).
            parts: the names of the run's named parts.

        Raises:
            ValueError: `resume` and a checkpoint of another run (`read`).
            UnusableDirectory: `checkpoint` exists and is not a directory.
        """
        directory = output.dir / CHECKPOINT
        if directory.exists() and not directory.is_dir():
            raise UnusableDirectory(
                f"{str(directory)!r} is not a directory, and the run writes its "
                "checkpoint there; move it away or use another --out"
            )
        found = cls.read(output.dir, command, config, seed) if resume else None
        if found is not None:
            for tmp in directory.glob(".*.tmp-*"):  # a killed writer's
                tmp.unlink(missing_ok=True)
            found._note_versions(output)
            return found
        if resume:  # said even with --no-progress: not what was asked
            output.note(
                f"--resume: no {CHECKPOINT}/ in {output.dir}/: starting from the "
                "beginning"
            )
        directory.mkdir(exist_ok=True)
        for entry in directory.iterdir():
            if _ours(entry.name) and (entry.is_file() or entry.is_symlink()):
                entry.unlink(missing_ok=True)
        header = {
            "written_by": "meanfield",
            "command": command,
            "config": _plain(config),
            "seed": seed,
            "width": width,
            "chunks": chunks,
            "parts": list(parts),
            "versions": versions(_VERSIONED),
        }
        write_manifest(directory / HEADER, header)
        return cls(directory, header)

    def _note_versions(self, output) -> None:
        now = versions(_VERSIONED)
        then = self.header.get("versions", {})
        changed = [
            f"{k} {then.get(k)} -> {now[k]}" for k in now if then.get(k) != now[k]
        ]
        if changed:
            output.note(
                f"--resume: the checkpoint was written by other versions "
                f"({', '.join(changed)}): the parts solved now may differ from "
                "an uninterrupted run in the last bits"
            )

    def save_part(self, name: str, **arrays: Any) -> None:
        """Write the named part `name` (its arrays), atomically."""
        _io.save_npz_atomic(self.dir / _part_name(name), **arrays)

    def load_part(self, name: str) -> dict[str, np.ndarray] | None:
        """The arrays of the named part `name`; None if it is not there."""
        found = _load(self.dir / _part_name(name))
        if found is not None:
            self.resumed += 1
        return found

    def save_chunk(self, index: int, output: Any) -> None:
        """Write chunk `index`'s output (a tuple of arrays), atomically."""
        arrays = {f"a{i}": np.asarray(a) for i, a in enumerate(output)}
        _io.save_npz_atomic(self.dir / _chunk_name(index), **arrays)

    def chunk_log(
        self, sizes: list[int], log: Callable[[str], None] | None = None
    ) -> ChunkLog:
        """A `ChunkLog` of the chunks present, saving every new one here.

        Args:
            sizes: the number of systems of each chunk of the run; a file whose
                arrays have another leading size (not this layout's) is solved
                again.
            log: None, or where to say how many chunks were read back (a
                progress line, `Output.log`), when any was.
        """
        done = {}
        for index, size in enumerate(sizes):
            arrays = _load(self.dir / _chunk_name(index))
            if arrays is None:
                continue
            leaves = tuple(arrays[f"a{i}"] for i in range(len(arrays)))
            if leaves and all(a.ndim and a.shape[0] == size for a in leaves):
                done[index] = leaves
        self.resumed += len(done)
        if done and log is not None:
            log(f"resumed: {len(done)} of {len(sizes)} chunks from {CHECKPOINT}/")
        return ChunkLog(done, width=self.width, on_chunk=self.save_chunk)


def _load(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of one part's file; None if absent or unreadable (solve again)."""
    try:
        return _io.load_npz(path)
    except _io.UNREADABLE_NPZ:
        return None


def interrupted_hint(out: str | os.PathLike) -> str:
    """What an interrupted run leaves to resume, for its last line.

    Args:
        out: the output directory.

    Returns:
        "N of M chunks are in OUT/checkpoint/: rerun with --resume", or that no
        part had finished.
    """
    directory = Path(out) / CHECKPOINT
    try:
        header = json.loads((directory / HEADER).read_text())
        names = {entry.name for entry in directory.iterdir()}
        total = header["chunks"] + len(header["parts"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no part had finished, so there is no checkpoint to resume"
    done = sum(_chunk_name(i) in names for i in range(header["chunks"]))
    done += sum(_part_name(name) in names for name in header["parts"])
    if not done:
        return "no part had finished, so there is no checkpoint to resume"
    noun = "parts" if header["parts"] else "chunks"
    return (
        f"{done} of {total} {noun} are in the checkpoint {directory}/: rerun with "
        "--resume"
    )
