"""Run the `torchdoctor` command line isolated from the user's project: a `random.py` in the working
directory, the script's folder or on PYTHONPATH must not break the tool that diagnoses it.

`torchdoctor/__init__.py` calls `isolate_cli()` first thing when the process is the command line
(`torchdoctor ...` or `python -m torchdoctor ...`). If a folder searched before the standard library holds
anything importable, that folder leaves `sys.path` before anything else is imported; the environment is
left as it is, so the torch probe still sees exactly the user's. Only when a module from such a folder was
already imported during start-up (a `sitecustomize.py` on PYTHONPATH) does the process re-execute itself
as `python -c BOOT` with the folder off `sys.path` and PYTHONPATH kept aside (put back before anything
runs). Only `sys` and `os` are used here: they are loaded before Python reads the search path, so
nothing here can be shadowed.
"""

from __future__ import annotations

import os
import sys

SAVED_PYTHONPATH = "TORCHDOCTOR_USER_PYTHONPATH"
_IMPORTABLE = (".py", ".pyc", ".pyw", ".so", ".pyd")
# Runs first in the re-executed process: drops '' (the working directory) from sys.path before any import,
# appends torchdoctor's own folder when it was only found through a dropped one, restores the user's environment,
# then runs the command line.
BOOT = (
    "import sys; sys.path[:1] = [] if sys.path[:1] == [''] else sys.path[:1]; "
    "root = sys.argv.pop(1); sys.path.extend([root] if root else []); "
    "from torchdoctor.isolation import restore_environment; restore_environment(); "
    "from torchdoctor.cli import main; main()"
)


def checkout_root(package_dir: str) -> str:
    """The source checkout `package_dir` sits in, when its `checks/` and `docs/` packages are beside it rather
    than inside it (pyproject.toml maps them to `torchdoctor.checks`/`torchdoctor.docs` when it installs):
    `python -m torchdoctor` run in a checkout imports this folder whatever is installed, and must find them."""
    root = os.path.dirname(package_dir)
    beside = all(os.path.isfile(os.path.join(root, name, "__init__.py")) for name in ("checks", "docs"))
    inside = os.path.isdir(os.path.join(package_dir, "checks"))
    return root if beside and not inside and os.path.isfile(os.path.join(root, "pyproject.toml")) else ""


def is_cli_launch(argv: list[str], orig_argv: "list[str] | None", main_file: "str | None") -> bool:
    """True when this process is the torchdoctor command line: the console script, or `-m torchdoctor`
    (while `-m` locates the package, `sys.argv[0]` is "-m")."""
    if argv[:1] == ["-m"]:
        if orig_argv is None:  # Python 3.9 has no sys.orig_argv; only `-m torchdoctor` imports us this early
            return True
        for i, arg in enumerate(orig_argv):
            if arg == "-m":
                return orig_argv[i + 1 : i + 2] == ["torchdoctor"]
            if arg.startswith("-m"):
                return arg[2:] == "torchdoctor"
        return False
    if not argv or main_file is None:
        return False
    name = os.path.basename(argv[0]).lower()
    script = name in ("torchdoctor", "torchdoctor.exe", "torchdoctor-script.py")
    return script and os.path.realpath(main_file) == os.path.realpath(argv[0])


def unsafe_dirs(path: list[str], environ: "dict[str, str] | os._Environ[str]") -> list[str]:
    """Folders Python searches before the standard library that the user controls: the script's folder or
    the working directory (`sys.path[0]`), and PYTHONPATH entries."""
    dirs: list[str] = []
    if not getattr(sys.flags, "safe_path", False) and not sys.flags.isolated and path:
        dirs.append(path[0] or os.getcwd())
    if not sys.flags.ignore_environment:
        pythonpath = environ.get("PYTHONPATH")
        dirs += [p or os.getcwd() for p in pythonpath.split(os.pathsep)] if pythonpath else []
    return [d for d in dirs if d and os.path.isdir(d)]


def holds_modules(folder: str) -> bool:
    """Whether `folder` has anything an `import` could pick up (a module file or a regular package)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(_IMPORTABLE):
                    return True
                if entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                    return True
    except OSError:
        return False
    return False


def interpreter_options() -> list[str]:
    """The interpreter options of this process, to pass on to the re-executed one."""
    flags = sys.flags
    opts = ["-O"] * flags.optimize
    opts += ["-B"] if flags.dont_write_bytecode else []
    opts += ["-s"] if flags.no_user_site else []
    opts += ["-E"] if flags.ignore_environment else []
    opts += ["-u"] if "-u" in (getattr(sys, "orig_argv", None) or []) else []
    opts += [f"-W{w}" for w in sys.warnoptions]
    opts += [f"-X{k}" if v is True else f"-X{k}={v}" for k, v in getattr(sys, "_xoptions", {}).items()]
    return opts


def isolate_cli() -> None:
    """Take the user's folders that hold modules off `sys.path` for this command-line process (re-executing it
    when one of their modules is already loaded)."""
    if not is_cli_launch(
        sys.argv, getattr(sys, "orig_argv", None), getattr(sys.modules.get("__main__"), "__file__", None)
    ):
        return
    dirs = [d for d in unsafe_dirs(sys.path, os.environ) if holds_modules(d)]
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    real_dirs = {os.path.realpath(d) for d in dirs}
    root = package_root if os.path.realpath(package_root) in real_dirs else ""
    if dirs:
        if loaded_from(
            real_dirs, {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())}
        ):
            _reexec(root)
        kept = [p for p in sys.path if os.path.realpath(p or os.getcwd()) not in real_dirs]
        sys.path[:] = kept + ([root] if root else [])
    _start_probe(sys.argv[1:])


def loaded_from(real_dirs: set[str], files: dict[str, object]) -> list[str]:
    """Modules other than torchdoctor's own already imported (`files`: module name -> its `__file__`) that an
    import found in one of `real_dirs` (realpaths): the top-level module's file or package sits directly in it.
    A module that merely lives below such a folder, found through another search-path entry (a `.venv` inside
    the project, whose site-packages holds an editable install's finder or `_distutils_hack`), is not one."""
    found = []
    for name, origin in files.items():
        top = name.partition(".")[0]
        if not isinstance(origin, str) or top == "torchdoctor":
            continue
        path = os.path.realpath(origin)
        for folder in real_dirs:
            first = path[len(folder) + 1 :].partition(os.sep)[0] if path.startswith(folder + os.sep) else ""
            if first == top or first.startswith(top + "."):
                found.append(name)
                break
    return found


def _reexec(root: str) -> None:
    env = dict(os.environ)
    if "PYTHONPATH" in env:
        env[SAVED_PYTHONPATH] = env.pop("PYTHONPATH")
    args = [sys.executable, *interpreter_options(), "-c", BOOT, root, *sys.argv[1:]]
    sys.stdout.flush()
    if os.name == "nt":  # no exec on Windows: run it and pass its exit status on
        sys.exit(os.spawnve(os.P_WAIT, sys.executable, args, env))
    os.execve(sys.executable, args, env)


def _start_probe(args: list[str]) -> None:
    """`torchdoctor env` starts its torch probe now, before the command line is imported (see `start_early`)."""
    if args[:1] == ["env"]:
        from torchdoctor.env.probe import start_early

        start_early(args)


def restore_environment() -> None:
    """In the re-executed process, before the command line runs: put the user's PYTHONPATH back for the
    probe, and start the probe of `torchdoctor env`."""
    saved = os.environ.pop(SAVED_PYTHONPATH, None)
    if saved is not None:
        os.environ["PYTHONPATH"] = saved
    sys.argv[0] = "torchdoctor"
    _start_probe(sys.argv[1:])
