"""The `torchdoctor` command line: a thin layer over the front doors (nothing in torchdoctor imports it).

Each subcommand is a module here (env, lint, check_ckpt, checks, explain); `options` holds what they
share and `group` the command group and the `main` entry point of the console script.
"""

from torchdoctor.cli.group import cli, main

__all__ = ["cli", "main"]
