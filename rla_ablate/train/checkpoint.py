"""Checkpoints: one file per save under `out_dir/checkpoints/`, written atomically, the newest K kept.

A checkpoint holds everything a resumed run needs to continue bit for bit: model and optimizer state,
tokens seen, data positions, the divergence guard, the pending log means and the RNG states of python,
numpy, torch and CUDA (per worker). Everything is tensors or plain Python types, so it loads with
`torch.load(weights_only=True)`. Torch and numpy are imported where a checkpoint is made or read: `status` and
`cancel` list checkpoints without them.
"""

from __future__ import annotations

import os
import random
import re
import warnings
from pathlib import Path
from typing import Any

from rla_ablate.errors import CheckpointError, Notice, exception_line

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{15})\.pt$")


def capture_rng() -> dict:
    """The state of every random number generator of this process, as tensors and plain types."""
    import numpy as np
    import torch

    version, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    # numpy's global generator is MT19937, whose legacy state is a tuple (a dict only for other bit generators)
    assert isinstance(np_state, tuple)
    kind, keys, pos, has_gauss, cached = np_state
    state = {
        "python": {"version": int(version), "mt": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["mt"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        # Restore what this process can see; a job resumed on fewer devices keeps the rest untouched.
        for index, device_state in enumerate(states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def list_checkpoints(out_dir: str | Path) -> list[tuple[int, Path]]:
    """(tokens, path) of every complete checkpoint, oldest first (temp files of torn writes are ignored)."""
    directory = checkpoint_dir(out_dir)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def is_whole(path: str | Path) -> bool:
    """Whether a checkpoint file is whole: a torch checkpoint is a zip archive, which a torn or truncated write (a
    bad copy, a full disk) is not. Checked before loading gigabytes."""
    import zipfile

    return zipfile.is_zipfile(path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(out_dir: str | Path, tokens: int, state: dict[str, Any], keep: int) -> Path:
    """Write `state` as the checkpoint at `tokens` (temp file, fsync, rename), then prune to the newest `keep`."""
    directory = checkpoint_dir(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{int(tokens):015d}.pt"
    tmp = directory / f".{final.name}.{os.getpid()}.tmp"
    payload = {"format": FORMAT_VERSION, "tokens": int(tokens), **state}
    import torch

    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for _, old in list_checkpoints(out_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_checkpoint(path: str | Path) -> dict:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: not an rla-sweep checkpoint of format {FORMAT_VERSION}")
    return state


def load_latest(out_dir: str | Path, skipped: list[str] | None = None) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, or None when there is none. An unreadable newest file falls back to the
    one before (with a warning; "NAME: why" per skipped file is appended to `skipped` when given); when none loads,
    CheckpointError says so: retrying cannot help until the files are moved away."""
    errors = []
    for _, path in reversed(list_checkpoints(out_dir)):
        try:
            state = load_checkpoint(path)
        except Exception as exc:
            errors.append(f"{path.name}: {exception_line(exc)}")
            continue
        if errors:
            warnings.warn(f"skipped unreadable checkpoints: {'; '.join(errors)}", Notice, stacklevel=2)
            if skipped is not None:
                skipped.extend(errors)
        return path, state
    if errors:
        directory = checkpoint_dir(out_dir)
        raise CheckpointError(f"none of the {len(errors)} checkpoints in {directory} loads ({'; '.join(errors)}); "
                              f"move {directory} away to train the job again from the start")
    return None
