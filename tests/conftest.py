"""Fixtures shared by several test files."""

from __future__ import annotations

import os

import pytest

# A developer's or a GPU node's RLA_ROOT (every command's default --root) must not send the tests' sweeps there.
os.environ.pop("RLA_ROOT", None)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A local MLflow server for the module's tests (a real `mlflow server` process)."""
    from rla_ablate.tracking import TrackingServer

    with TrackingServer(tmp_path_factory.mktemp("mlflow")) as srv:
        yield srv


def pytest_collection_modifyitems(config, items):
    """The files marked slow (Ray, MLflow servers, subprocesses: 20-170 s a file) run first. `make test` hands whole
    files to two workers in collection order; started last, a slow file would keep one worker busy while the other
    sits idle at the end of the suite."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
