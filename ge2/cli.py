"""The ``ge2`` command: ``ge2 demo`` trains the built-in example."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ge2", description="ge2: every computation a Triton kernel")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a tiny MLP on two spirals from ge2's core ops")
    demo.add_argument("--steps", type=int, default=150)
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ge2 import demo as demo_module

        demo_module.main(steps=args.steps, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
