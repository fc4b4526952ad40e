"""`rla-sweep server`: one MLflow tracking server that several launches share (`launch ... --tracking-uri URI`)."""

from __future__ import annotations

import argparse
import importlib.util
import signal
import socket
import sys
import time
from pathlib import Path

from rla_ablate.environment import add_root_option
from rla_ablate.commands import stopped_by_ctrl_c

# The folder under --root that holds the shared server's state (a sweep name cannot start with "_").
SERVER_DIR = "_server"
DEFAULT_PORT = 5000
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "server", help="run one MLflow tracking server for several launches (e.g. on PostgreSQL)",
        description="Start an MLflow tracking server in the foreground until Ctrl-C (exit 130), restarted on the "
                    "same store and port if it dies. Pass the address it prints to every launch: `rla-sweep launch "
                    "FILE --tracking-uri URI`; all their sweeps then share one store and one UI. It listens on "
                    "127.0.0.1 unless --host says otherwise.")
    add_root_option(parser, f"folder for the server's state: ROOT/{SERVER_DIR}/ holds its log, its artifacts and, "
                            "without --backend-store-uri, its SQLite store")
    parser.add_argument("--backend-store-uri", default=None, metavar="URI",
                        help="the store for runs and metrics, e.g. postgresql://USER:PASSWORD@HOST:5432/DB (needs "
                             "`pip install 'rla-sweep[postgres]'`), mysql://..., or sqlite:///PATH; default: "
                             f"sqlite under ROOT/{SERVER_DIR}/mlflow.db (one machine only)")
    parser.add_argument("--artifacts", default=None, metavar="DEST",
                        help=f"where artifacts are kept: a folder or an object-store URI (s3://...), served through "
                             f"the server; default: ROOT/{SERVER_DIR}/artifacts")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to listen on (default: 127.0.0.1, this machine only); 0.0.0.0 opens it to "
                             "every machine that reaches this one: MLflow has no login, open it deliberately")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument("--workers", type=int, default=4, help="server worker processes (default: 4)")
    parser.add_argument("--allowed-hosts", default=None, metavar="LIST",
                        help="Host headers the server accepts (MLflow's --allowed-hosts); default with a --host other "
                             "than loopback: localhost, private addresses and this machine's names")
    parser.set_defaults(func=run)


def check_store_uri(uri: str) -> str:
    """Refuse in seconds a store URI MLflow cannot use: a scheme it has no store for, a missing database driver, a
    database that does not answer or refuses the login, a SQLite file in a missing folder. Returns the URI to use
    (postgresql:// names the psycopg driver when it is the one installed)."""
    import urllib.parse

    from rla_ablate.errors import UserError
    from rla_ablate.tracking.server import redact

    key = "--backend-store-uri"
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    dialect = scheme.split("+", 1)[0]
    allowed = ("postgresql", "mysql", "mssql", "sqlite")
    if dialect not in allowed:
        raise UserError(f"{redact(uri)!r} is not a database URI MLflow stores runs in; allowed schemes: "
                        f"{', '.join(allowed)} (e.g. postgresql://USER:PASSWORD@HOST:5432/DB)", key=key)
    import sqlalchemy
    from sqlalchemy.engine import make_url

    try:
        url = make_url(uri)
        dialect_cls = url.get_dialect()
    except Exception as exc:  # noqa: BLE001 - any parse failure is the URI's
        raise UserError(f"{redact(uri)!r} is not a valid database URI: {exc}", key=key) from None
    try:
        dialect_cls.import_dbapi()
    except ImportError as exc:
        if scheme == "postgresql" and importlib.util.find_spec("psycopg") is not None:
            # An SQLAlchemy older than 2.1 maps postgresql:// to psycopg2; the postgres extra installs psycopg 3.
            return check_store_uri(uri.replace("postgresql://", "postgresql+psycopg://", 1))
        # the package that provides the driver's module, where its name differs (MySQLdb: mysqlclient)
        package = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary"}.get(exc.name or "", exc.name)
        hint = "pip install 'rla-sweep[postgres]'" if dialect == "postgresql" else f"pip install {package}"
        raise UserError(f"the {dialect} store needs its database driver ({exc.name}), which is not installed: "
                        f"{hint}", key=key) from None
    if dialect == "sqlite":
        path = url.database
        if not path or path == ":memory:":
            raise UserError("a SQLite store needs a file: sqlite:///PATH", key=key)
        full = Path(path).expanduser().resolve()
        if not full.parent.is_dir():
            raise UserError(f"the folder of {path} does not exist; create it or give another path", key=key)
        # Absolute: the server runs in ROOT/_server, where a relative path would name another file.
        return f"{scheme}:///{full}"
    connect_args = {"connect_timeout": 5} if dialect in ("postgresql", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(url, connect_args=connect_args, poolclass=sqlalchemy.pool.NullPool)
        with engine.connect():
            pass
    except Exception as exc:  # noqa: BLE001 - a database that cannot be reached, whatever the driver raises
        detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise UserError(f"cannot connect to {redact(uri)}: {detail[0] if detail else type(exc).__name__}",
                        key=key) from None
    return uri


def _default_allowed_hosts(host: str) -> str | None:
    """MLflow's defaults (localhost, private addresses) plus this machine's names and --host."""
    try:
        from mlflow.server.security_utils import get_default_allowed_hosts
    except ImportError:
        return None
    names = {socket.gethostname(), socket.getfqdn()}
    if host not in ("0.0.0.0", "::", ""):
        names.add(host)
    extra = [n for name in sorted(n for n in names if n) for n in (name, f"{name}:*")]
    return ",".join(get_default_allowed_hosts() + extra)


def run(args: argparse.Namespace) -> int:
    from rla_ablate.commands.launch import check_root
    from rla_ablate.errors import UserError
    from rla_ablate.tracking.server import TrackingServer, check_port

    check_port(args.port)
    if args.workers < 1:
        raise UserError(f"must be at least 1; got {args.workers}", key="--workers")
    root = Path(args.root)
    check_root(root, write=True)
    store = None if args.backend_store_uri is None else check_store_uri(args.backend_store_uri)
    try:
        socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"cannot listen on {args.host!r}: {exc.strerror}", key="--host") from None
    artifacts = args.artifacts
    if artifacts is not None and "://" not in artifacts:
        # A folder: absolute, since the server runs in ROOT/_server.
        artifacts = str(Path(artifacts).expanduser().resolve())
    allowed = args.allowed_hosts
    if allowed is None and args.host not in LOOPBACK:
        allowed = _default_allowed_hosts(args.host)
    server = TrackingServer(root / SERVER_DIR, port=args.port, workers=args.workers, host=args.host,
                            backend_store_uri=store, artifacts_destination=artifacts,
                            allowed_hosts=allowed)
    # SIGTERM stops the server like Ctrl-C (TrackingServer's own handler stops the process first); SIGINT does even
    # when inherited ignored (`stopped_by_ctrl_c`).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with stopped_by_ctrl_c():
            return _serve(server, args)
    except KeyboardInterrupt:
        server.stop()
        print("tracking server stopped", file=sys.stderr, flush=True)
        return 130
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def _serve(server, args: argparse.Namespace) -> int:
    """Start the server (or name the one already serving its root) and print its notices until interrupted."""
    from rla_ablate.errors import UserError
    from rla_ablate.tracking.server import redact

    server.start()
    if not server.owned:
        rec = server.read_record() or {}
        if rec.get("backend_uri") != redact(server.backend_uri):
            raise UserError(f"a server started by pid {rec.get('owner_pid')} already serves {server.root} with "
                            f"the store {rec.get('backend_uri')}; stop it first or give another --root",
                            key="--root")
        print(f"a tracking server for {server.root} is already running at {rec.get('uri')} (started by pid "
              f"{rec.get('owner_pid')}); launch with --tracking-uri {rec.get('uri')}")
        return 0
    server.supervise()
    print(f"MLflow tracking server at {server.public_uri}\n"
          f"  store:     {redact(server.backend_uri)}\n"
          f"  artifacts: {server.artifacts_destination or server.artifacts_dir}\n"
          f"  log:       {server.log_path}\n"
          f"launch sweeps with:  rla-sweep launch FILE --tracking-uri {server.public_uri}", flush=True)
    if args.host not in LOOPBACK:
        print(f"listening on {args.host}: every machine that reaches port {server.port} can read and write runs "
              "(MLflow has no login)", flush=True)
    print("Ctrl-C to stop", flush=True)
    while True:
        for line in server.notices():
            print(line, flush=True)
        time.sleep(0.5)

