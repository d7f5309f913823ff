"""`officellm cluster haproxy-config`: the router's configuration for replicas sharing one
database (docs/cluster.md; what it holds and why: installer/haproxy_config.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from officellm.app.db.jwt_secrets import validate_jwt_secret
from officellm.app.db.private_file import write_private_file
from officellm.installer.haproxy_config import ReplicaAddress, haproxy_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="several replicas on one database: the router's config",
                       description="Write an HAProxy configuration that pins each person to "
                                   "one replica (docs/cluster.md).")
    csub = p.add_subparsers(dest="cluster_command", required=True)
    cfg = csub.add_parser("haproxy-config", help="write the HAProxy configuration")
    cfg.add_argument("--replica", action="append", required=True, metavar="[NAME=]URL",
                     help="a replica, http://HOST:PORT (repeat for each)")
    cfg.add_argument("--bind", default="0.0.0.0:8000", metavar="ADDRESS:PORT",
                     help="where the router listens (default 0.0.0.0:8000)")
    cfg.add_argument("--jwt-secret-file", type=Path, default=None, metavar="FILE",
                     help="the front end's JWT secret (Open WebUI's "
                          "FORWARD_USER_INFO_HEADER_JWT_SECRET): people are then pinned by "
                          "the verified JWT's sub")
    cfg.add_argument("--output", type=Path, default=None, metavar="FILE",
                     help="write here (mode 0600: it may hold the secret) instead of stdout")
    cfg.set_defaults(func=run_haproxy_config)


def run_haproxy_config(args: argparse.Namespace) -> int:
    secret = None
    if args.jwt_secret_file is not None:
        secret = validate_jwt_secret(args.jwt_secret_file.read_text(encoding="utf-8"))
    text = haproxy_config([ReplicaAddress.parse(r) for r in args.replica], bind=args.bind,
                          jwt_secret=secret)
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_private_file(args.output, text)
        print(f"wrote {args.output}")
    return 0
