"""Configuration loading: YAML with line numbers, validated by pydantic models."""

from rla_ablate.config.yamlio import SWEEP_FILE_KEYS, LocatedYAML, load_yaml, validate

__all__ = ["SWEEP_FILE_KEYS", "LocatedYAML", "load_yaml", "validate"]
