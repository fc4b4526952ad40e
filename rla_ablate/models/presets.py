"""Model presets: `models/<scale>-<family>.yaml` at the repository root (bundled in the wheel), one ModelConfig each.

    load_preset("tiny-rla")            # by name
    load_preset("path/to/my.yaml")     # or by path
    list_presets()                     # ["1.5b-gdn", ..., "tiny-transformer"]
"""

from __future__ import annotations

from pathlib import Path

from rla_ablate.config import SWEEP_FILE_KEYS, load_yaml, validate
from rla_ablate.errors import UserError, did_you_mean
from rla_ablate.models.config import ModelConfig
from rla_ablate.resources import bundled_dir

PRESET_DIR = bundled_dir("models")


def list_presets() -> list[str]:
    """Names of the presets in models/, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or "/" in text:
        path = Path(text)
        if not path.exists():
            raise UserError(f"no model preset file {text}: {path.resolve()} does not exist (a preset path is read "
                            f"from the current folder, {Path.cwd()}); or give a preset name (`rla-sweep models` "
                            "lists them)")
        return path
    path = PRESET_DIR / f"{text}.yaml"
    if not path.is_file():
        names = list_presets()
        raise UserError(f"unknown model preset '{text}'{did_you_mean(text, names)}; available: {', '.join(names)} "
                        "or a path to a .yaml file")
    return path


def load_preset(name_or_path: str | Path) -> ModelConfig:
    """A validated ModelConfig from a preset name or a YAML file; errors name file, line and key. A sweep or job
    file given for a preset is said as such, not as every model key it lacks."""
    located = load_yaml(preset_path(name_or_path))
    data = located.data
    if isinstance(data, dict) and "family" not in data:
        what = ("a sweep file (its models are under models:)" if SWEEP_FILE_KEYS & set(data)
                else "a job config (its model is under model:)" if "model" in data else None)
        if what is not None:
            raise UserError(f"is {what}, not a model preset: give a preset name (`rla-sweep models` lists them) or "
                            "a YAML file of model keys (family, hidden_size, ...)", file=located.file, line=1)
    return validate(ModelConfig, located)
