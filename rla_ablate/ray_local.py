"""Starting a local, single-node Ray instance that only listens on 127.0.0.1."""

from __future__ import annotations

import os


def init_local_ray(**kwargs):
    """`ray.init(**kwargs)` for a new local instance, its GCS, raylet and workers bound to loopback.

    On Linux Ray binds its services to the host's routable address, where they accept unauthenticated
    connections from the network; with cluster mode off (Ray's macOS/Windows behaviour, switched by its own
    environment variable, which the processes it starts inherit) they use 127.0.0.1. `--address` joins an
    existing cluster instead and is not affected.
    """
    import ray
    import ray._private.ray_constants as ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    return ray.init(**kwargs)
