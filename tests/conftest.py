"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A local MLflow server for the module's tests (a real `mlflow server` process)."""
    from rla_ablate.tracking import TrackingServer

    with TrackingServer(tmp_path_factory.mktemp("mlflow")) as srv:
        yield srv
