"""The ``ge2`` command: ``demo`` (core-ops example), ``train`` (a real dataset), ``generate`` (sample a trained
GPT), ``autotune`` (persist configs)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ge2", description="ge2: every computation a Triton kernel")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a tiny MLP on two spirals from ge2's core ops")
    demo.add_argument("--steps", type=int, default=150)
    demo.add_argument("--seed", type=int, default=0)
    from ge2 import train as train_module

    train = sub.add_parser("train", help="train a classifier on digits, or a GPT on text (--model gpt): logs, "
                           "curves, checkpoints")
    train_module.add_arguments(train)
    from ge2 import train_gpt

    generate = sub.add_parser("generate", help="sample text from a GPT trained by ge2 train --model gpt")
    train_gpt.add_generate_arguments(generate)
    from ge2 import autotune as autotune_module

    autotune = sub.add_parser("autotune", help="tune kernel configs for shapes or a model and persist them (GPU)")
    autotune_module.add_arguments(autotune)
    bench = sub.add_parser("bench", help="run the bench/ suite of a ge2 checkout (GPU) and summarise it")
    bench.add_argument("--summary", action="store_true", help="only summarise bench/results/*.json")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ge2 import demo as demo_module

        demo_module.main(steps=args.steps, seed=args.seed)
    elif args.command == "bench":
        import os
        import subprocess

        if not os.path.isfile(os.path.join("bench", "__main__.py")):
            print("ge2 bench: run it from a ge2 checkout (the bench/ folder is not installed)", file=sys.stderr)
            return 2
        return subprocess.run([sys.executable, "-m", "bench"] + (["--summary"] if args.summary else [])).returncode
    elif args.command == "autotune":
        try:
            autotune_module.run(args)
        except ValueError as e:
            print(f"ge2 autotune: {e}", file=sys.stderr)
            return 2
    elif args.command == "train":
        if args.nproc:  # relaunch as N ranks through torch's launcher, without --nproc
            from ge2 import distributed

            given = list(sys.argv[1:] if argv is None else argv)
            keep = [a for i, a in enumerate(given) if not (a == "--nproc" or a.startswith("--nproc=")
                                                           or (i > 0 and given[i - 1] == "--nproc"))]
            return distributed.spawn(args.nproc, ["ge2", *keep])
        try:
            train_module.run(args)
        except train_module.TrainSetupError as e:
            print(f"ge2 train: {e}", file=sys.stderr)
            return 2
        except train_gpt.TrainingDiverged as e:
            print(f"ge2 train: {e}", file=sys.stderr)
            return 1
    elif args.command == "generate":
        try:
            train_gpt.generate(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"ge2 generate: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
