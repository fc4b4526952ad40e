"""Configuration loading: YAML with line numbers, validated by pydantic models."""

from rla_ablate.config.yamlio import LocatedYAML, load_yaml, validate

__all__ = ["LocatedYAML", "load_yaml", "validate"]
