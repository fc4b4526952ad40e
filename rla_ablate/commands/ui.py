"""`rla-sweep ui [NAME]`: the MLflow UI on 127.0.0.1 for a sweep's tracking store."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rla_ablate.environment import add_root_option
from rla_ablate.commands import stopped_by_ctrl_c


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "ui", help="serve the MLflow UI of a sweep on 127.0.0.1",
        description="Serve the MLflow UI for the sweep's embedded tracking store until Ctrl-C. If a launch is "
                    "serving it already, print that address instead. Dashboard pages link runs to "
                    "http://127.0.0.1:5050, the default --port.")
    parser.add_argument("name", nargs="?", default=None,
                        help="the sweep name or its sweep file (default: the most recently launched sweep under --root)")
    add_root_option(parser)
    parser.add_argument("--port", type=int, default=5050, help="port on 127.0.0.1 (default: 5050)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.dashboard.reading import tracking_of
    from rla_ablate.errors import UserError
    from rla_ablate.sweep.state import SweepDir
    from rla_ablate.tracking import TrackingServer
    from rla_ablate.tracking.server import check_port

    from rla_ablate.sweep.status import resolve_name

    check_port(args.port)
    root = Path(args.root)
    name = resolve_name(args.name) if args.name is not None else None
    if name is None:
        metas = sorted(root.glob("*/sweep.json"), key=lambda p: p.stat().st_mtime)
        if not metas:
            raise UserError(f"no sweep under {root.resolve()}; launch one with `rla-sweep launch FILE`")
        name = metas[-1].parent.name
    uri, store = tracking_of(root, name)
    if uri is not None:
        from rla_ablate.tracking.server import is_healthy

        if not is_healthy(uri, timeout=3.0):
            raise UserError(f"sweep {name} logs to {uri}, which does not answer now: start that server again "
                            "(`rla-sweep server` with the --root and --backend-store-uri it had) and open it there")
        print(f"sweep {name} logs to {uri}: open it there")
        return 0
    SweepDir(root, name).check_own_store()
    server = TrackingServer(store, port=args.port).start()
    if not server.owned:
        owner = (server.read_record() or {}).get("owner_pid")
        print(f"sweep {name}: its MLflow UI is already served at {server.uri}"
              + (f" (by process {owner}: a launch, a `ui` or a dashboard)" if owner else ""))
        return 0
    print(f"sweep {name}: MLflow UI at {server.uri}  (Ctrl-C to stop)", flush=True)
    try:
        with stopped_by_ctrl_c():
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(0.5)
    finally:
        server.stop()
    return 0
