"""Job ids: a short hash of the fully resolved job config's canonical JSON.

Canonical = `model_dump(mode="json")` with sorted keys and no whitespace, so the id does not depend on the key
order of the sweep file, on which arm or grid produced the job, or on the Python process. It does change
when a config class gains a field (a new default is a new experiment until proven otherwise).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ID_LENGTH = 12


def canonical_json(data: Any) -> str:
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def job_id(data: Any) -> str:
    """The id of a resolved job config (a pydantic model or its JSON-able dump)."""
    return hash_text(canonical_json(data))


def hash_text(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:ID_LENGTH]


def section_json(value: Any) -> str:
    """Canonical JSON of one top-level section (already in JSON-able form)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def join_sections(sections: dict[str, str]) -> str:
    """The canonical JSON of a mapping from its sections' canonical JSON: equal to `canonical_json` of the whole,
    so a planner can reuse the sections that jobs share (model, data, eval) and re-encode only what differs."""
    # Field names are plain identifiers: quoting them is their JSON encoding.
    return "{" + ",".join(f'"{k}":{sections[k]}' for k in sorted(sections)) + "}"
