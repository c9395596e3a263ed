"""``python -m hyserve.bench``: the same as ``hyserve bench``."""

import argparse
import sys

from hyserve.bench import add_bench_arguments, run_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hyserve.bench", description=__doc__)
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_bench(args)
    except ValueError as e:
        print(f"hyserve bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
