#!/usr/bin/env python3
"""Print the results of one or more experiments as a table (from their results.json).

    python local/results_table.py exp/finetune_demo/results.json [exp/other/results.json ...]
"""

import argparse
import os
import sys

from common.evaluation import format_results_table
from common.user_errors import run_command


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results.json files written by a recipe's test stage")
    args = parser.parse_args(argv)
    missing = [path for path in args.results if not os.path.isfile(path)]
    if missing:
        print(f"error: no results at {', '.join(missing)}: run the decode + score stage first", file=sys.stderr)
        sys.exit(2)
    print(format_results_table(args.results))


if __name__ == "__main__":
    run_command(main)
