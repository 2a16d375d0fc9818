"""``python -m mindrouter.daemon``: the daemon alone, which ``mr serve`` execs into.

The command line's modules (typer, rich, every command) take about 20 MB that
a long-running daemon never uses, so ``mr serve`` checks the settings and then
replaces itself with this lean process (same pid, so systemd and scripts that
started ``mr serve`` still hold the daemon's pid).
"""

from __future__ import annotations

import argparse
import sys

from ..config import load_config
from ..errors import MindRouterError
from .process.serve import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mr serve", description="Run the mindrouter daemon.")
    parser.add_argument("--config")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--socket")
    parser.add_argument("--state-dir")
    parser.add_argument("--log-level")
    parser.add_argument("--no-discover", action="store_true")
    args = parser.parse_args(argv)
    overrides = {
        "host": args.host,
        "port": args.port,
        "socket": args.socket,
        "state_dir": args.state_dir,
        "log_level": args.log_level,
    }
    try:
        settings = load_config(args.config, overrides=overrides, must_exist=args.config is not None)
        serve(settings, discover=not args.no_discover and settings.server.discover)
    except MindRouterError as exc:
        print(f"mr: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
