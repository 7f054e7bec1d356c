"""The `torchdoctor` command group and its entry point: one subcommand per module of this package."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Optional

import click

from torchdoctor import __version__
from torchdoctor.cli.options import USAGE_ERROR
from torchdoctor.pasteable import use_stand_ins

# command name -> "module:attribute"; a run imports only the module of the command it runs (start-up time
# matters for `lint` on every save), `--help` imports them all.
COMMANDS = {
    "env": "torchdoctor.cli.env:env",
    "lint": "torchdoctor.cli.lint:lint",
    "check-ckpt": "torchdoctor.cli.check_ckpt:check_ckpt",
    "checks": "torchdoctor.cli.checks:list_checks",
    "explain": "torchdoctor.cli.explain:explain",
    "run": "torchdoctor.cli.run:run",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported when looked up (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="torchdoctor")
@click.option(
    "--local-rank",
    "local_rank_dash",
    hidden=True,
    default=None,
    help="Passed by torch.distributed.launch before the command; accepted and reported by `env`.",
)
@click.option("--local_rank", "local_rank_underscore", hidden=True, default=None)
@click.pass_context
def cli(ctx: click.Context, local_rank_dash: Optional[str], local_rank_underscore: Optional[str]) -> None:
    """Diagnose PyTorch environments, checkpoints and training loops."""
    ctx.obj = {
        "local_rank_arg": "--local-rank"
        if local_rank_dash is not None
        else "--local_rank"
        if local_rank_underscore is not None
        else None
    }


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: usage and input errors become one line on stderr and exit code 2."""
    use_stand_ins(sys.stdout, sys.stderr)  # a stream that can't encode a character gets a stand-in, not a crash
    try:
        cli.main(args=argv, prog_name="torchdoctor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `torchdoctor`: the help, as --help prints it
        click.echo(exc.ctx.get_help() if exc.ctx is not None else exc.format_message())
        sys.exit(0)
    except click.ClickException as exc:
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None and "(see `" not in exc.format_message():
            hint = f" (see `{exc.ctx.command_path} --help`)"
        click.echo(f"torchdoctor: error: {exc.format_message()}{hint}", err=True)
        sys.exit(USAGE_ERROR if isinstance(exc, click.UsageError) else exc.exit_code)
    except click.Abort:
        click.echo("torchdoctor: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a torchdoctor bug: one line, traceback only on request
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        click.echo(
            f"torchdoctor: internal error: {type(exc).__name__}: {exc} (set TORCHDOCTOR_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(USAGE_ERROR)
    sys.exit(0)
