"""Why `import torch` failed, read from what the failure names: a path and where it lives (LD_PRELOAD, an
LD_LIBRARY_PATH folder, the user site, PYTHONPATH, an editable install, a conda env, torch's own folder), a
resource limit, an errno, a module torch requires. Shared by torch-import-failure (which reports the cause) and
the checks whose findings would repeat it: unmet-requirement leaves out the requirement named here,
module-shadowing the shadowing file, numpy-problem the NumPy ABI error (one cause, one finding)."""

from __future__ import annotations

import errno
import os
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from packaging.utils import canonicalize_name

from torchdoctor.sdk import byte_size
from torchdoctor.sdk.env import EnvFacts, LibraryCopy, PathEntry, UnmetRequirement

from ._envutil import base_version, best_wheel_cuda, has_nvidia, major_minor, pip, pip_install, rename_fix, torch_pin

# Loader messages (glibc's dlopen) and what they say about the file they name.
LOADER_PROBLEMS = (
    ("file too short", "is empty or cut short"),
    ("invalid ELF header", "is not a shared library (invalid ELF header)"),
    ("wrong ELF class", "is built for another architecture (wrong ELF class)"),
    ("undefined symbol", "lacks a symbol torch needs"),
    ("not found (required by", "is an older build than torch needs"),
    ("cannot open shared object file", "cannot be opened"),
)
STATE_WORDS = {
    "empty": "is an empty file (0 bytes)",
    "truncated": "is cut short (its ELF headers point past its end)",
    "not ELF": "is not a shared library",
    "wrong class": "is built for another architecture",
    "unreadable": "cannot be read",
    "missing": "does not exist",
}
MEMORY_WORDS = (
    "memory allocation",
    "cannot allocate memory",
    "memoryerror",
    "failed to map segment",
    "bad_alloc",
    "out of memory",
    "mmap",
)  # compared in lower case
LIMITS = {  # /proc/self/limits name -> (resource, ulimit flag)
    "Max address space": ("RLIMIT_AS", "-v", 1024),
    "Max data size": ("RLIMIT_DATA", "-d", 1024),
    "Max open files": ("RLIMIT_NOFILE", "-n", 1),
    "Max processes": ("RLIMIT_NPROC", "-u", 1),
}
_PATH = re.compile(r"(/[^\s:'\"(),]+)")
_MODULE = re.compile(r"No module named '([\w.]+)'|cannot import name '\w+' from '([\w.]+)'")
_ERRNO = re.compile(r"\[Errno (\d+)\]")
# Variables that point programs at folders they write to: an errno on a path under one is fixed by moving it.
WRITE_VARS = ("TMPDIR", "XDG_CACHE_HOME", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "HF_HOME")


@dataclass
class Cause:
    """One cause of the failure, with the fix that acts on it."""

    cause: str
    fix: str  # one line of advice (shell commands in backticks): the title of the finding's fix
    file: Optional[str] = None  # where the finding points
    requirement: Optional[UnmetRequirement] = None  # an unmet requirement this cause accounts for
    absorbs: Optional[str] = None  # the check whose finding this cause is (it stays quiet then)
    shadow: Optional[str] = None  # the shadowing file or folder it names (module-shadowing leaves it out)


def failure_text(facts: EnvFacts) -> str:
    """Everything the failed probe said: the exception, its traceback's frames and its last stderr lines."""
    probe = facts.torch
    return " ".join(
        [
            f"{probe.error_type}: {probe.error}" if probe.error_type else (probe.error or ""),
            *probe.traceback_tail,
            *probe.stderr_tail,
        ]
    )


def _under(path: str, folder: Optional[str]) -> bool:
    """Whether `path` is `folder` or inside it."""
    if not folder:
        return False
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def home(path: str, facts: EnvFacts) -> Optional[str]:
    """Where `path` lives, as a phrase: "an LD_LIBRARY_PATH folder (/x)", "the user site (...)", ... or None."""
    env = facts.env_vars
    probe = facts.torch
    if path in env.get("LD_PRELOAD", "").replace(":", " ").split():
        return "LD_PRELOAD"
    for entry in env.get("LD_LIBRARY_PATH", "").split(":"):
        if entry and os.path.normpath(os.path.dirname(path)) == os.path.normpath(entry):
            return f"the LD_LIBRARY_PATH folder {entry}"
    if facts.torch_dist_editable and _under(path, facts.torch_dist_editable):
        return f"the source folder of torch's editable install ({facts.torch_dist_editable})"
    if facts.torch_dist_location and _under(path, facts.torch_dist_location):
        return f"torch's own folder ({facts.torch_dist_location})"
    if probe.user_site and _under(path, probe.user_site):
        return f"the user site ({probe.user_site})"
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry and _under(path, entry):
            return f"the PYTHONPATH folder {entry}"
    if facts.cwd and facts.cwd != "/" and _under(path, facts.cwd):
        return f"the working directory ({facts.cwd})"
    if env.get("CONDA_PREFIX") and _under(path, env["CONDA_PREFIX"]):
        return f"the conda environment {env['CONDA_PREFIX']}"
    return None


def _without(value: str, entry: str, sep: str) -> str:
    return sep.join(p for p in value.split(sep) if p and p != entry)


def drop_entry(var: str, entry: str, value: str) -> str:
    """The shell command that takes `entry` out of `var` (whose value is `value`), keeping the rest in order."""
    sep = ":" if var == "LD_LIBRARY_PATH" else " "
    rest = _without(value.replace(":", " ") if sep == " " else value, entry, sep)
    return f"export {var}={shlex.quote(rest)}" if rest else f"unset {var}"


def reinstall(facts: EnvFacts) -> str:
    """A clean reinstall of the installed torch release: its own CUDA variant where an NVIDIA driver is present,
    the CPU build where none is (a CUDA build cannot work there)."""
    cuda = major_minor(facts.torch_cuda) if has_nvidia(facts) else None
    return pip_install(facts, cuda)


# Symbol or version prefixes whose library is not named after them.
SYMBOL_LIBRARIES = {
    "omp_": "gomp",
    "kmp_": "iomp5",
    "glibcxx_": "stdc++",
    "cxxabi_": "stdc++",
    "gcc_": "gcc_s",
    "glibc_": "c",
}
_SYMBOL = re.compile(r"undefined symbol: ([\w.@]+)|version [`']([\w.]+)' not found|version ([A-Z][\w.]+)")


def _defines(path: str, text: str) -> bool:
    """Whether the library at `path` is the one that should define a symbol or symbol version the loader error
    names (libgomp for `omp_get_max_threads` or `GOMP_4.5`, libcudnn for `cudnnCreate`, ...)."""
    stem = os.path.basename(path).split(".so")[0].removeprefix("lib").lower()
    for m in _SYMBOL.finditer(text):
        name = next(g for g in m.groups() if g).lower()
        if (len(stem) >= 3 and name.startswith(stem)) or any(
            name.startswith(p) and lib == stem for p, lib in SYMBOL_LIBRARIES.items()
        ):
            return True
    return False


def _library_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """A library from LD_PRELOAD or an LD_LIBRARY_PATH folder that the error names, or that is broken while the
    loader failed or the probe crashed."""
    copies = facts.libraries
    if not copies:
        return None
    # ld.so skips an LD_PRELOAD entry it cannot load ("... cannot be preloaded ...: ignored."): not a cause
    loaded = [c for c in copies if c.state != "missing" and f"object '{c.path}' from LD_PRELOAD cannot be" not in text]
    named = [c for c in loaded if c.path in text]
    loader = next((words for key, words in LOADER_PROBLEMS if key in text), None)
    crashed = facts.torch.exit_signal in (7, 11)  # SIGBUS, SIGSEGV
    broken = [c for c in loaded if c.state != "ok"]
    copy: Optional[LibraryCopy] = None
    if named:
        copy = named[0]
    elif broken and (loader or crashed):
        copy = broken[0]
    elif loader:  # the copy is the library that should define the missing symbol or version
        copy = next((c for c in loaded if _defines(c.path, text)), None)
    if copy is None:
        return None
    what = STATE_WORDS.get(copy.state) if copy.state != "ok" else loader or "is a different build than torch's"
    how = (
        f"the process crashed (signal {facts.torch.exit_signal}) while loading torch's libraries"
        if crashed and not named
        else "the loader takes it before the copy torch was built with"
    )
    value = facts.env_vars.get(copy.via, "")
    where = "LD_PRELOAD" if copy.via == "LD_PRELOAD" else f"the LD_LIBRARY_PATH folder {copy.entry}"
    return Cause(
        cause=f"{copy.path} (from {where}) {what}; {how}",
        fix=f"Take it off {copy.via} (this shell; also where it is set, e.g. ~/.bashrc): "
        f"`{drop_entry(copy.via, copy.entry, value)}`",
        file=copy.path,
    )


def _limit_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """A resource limit the error runs into: memory (RLIMIT_AS/DATA, a cgroup) or open files/processes."""
    probe = facts.torch
    wanted = []
    if any(word in text.lower() for word in MEMORY_WORDS) or probe.error_errno == errno.ENOMEM:
        wanted = ["Max address space", "Max data size"]
    elif "Too many open files" in text or probe.error_errno == errno.EMFILE:
        wanted = ["Max open files"]
    elif "pthread_create" in text or "Resource temporarily unavailable" in text:
        wanted = ["Max processes", "Max address space"]
    for name in wanted:
        soft, hard = (probe.limits.get(name) or [None, None])[:2]
        if not isinstance(soft, int):
            continue
        resource, flag, unit = LIMITS[name]
        shown = f"{soft // (1 << 20)} MiB" if unit == 1024 else str(soft)
        if hard is None:
            fix = f"Lift the limit in the shell that starts Python: `ulimit -S {flag} unlimited`"
        elif hard > soft:
            fix = f"Raise the limit to its maximum in the shell that starts Python: `ulimit -S {flag} {hard // unit}`"
        else:
            fix = (
                f"The hard limit is {shown} too: ask for a larger one where it is set (a job scheduler's memory "
                f"request, /etc/security/limits.conf, `ulimit -H {flag}` in a wrapper script)"
            )
        return Cause(
            f"the process runs under {resource} = {shown} (`ulimit {flag}`), and torch's libraries "
            f"cannot get what they need within it",
            fix,
        )
    limit, used = facts.system.cgroup_memory_limit, facts.system.cgroup_memory_used
    killed = probe.exit_signal == 9 and not probe.timed_out  # SIGKILL, and not from torchdoctor
    if limit and (killed or (wanted and wanted[0] == "Max address space" and used and used >= 0.9 * limit)):
        return Cause(
            f"the container's memory limit ({byte_size(limit)}, {byte_size(used)} in use) "
            + ("killed the process (SIGKILL from the OOM killer)" if killed else "leaves too little memory"),
            "Give the container more memory (`docker run --memory ...`, Kubernetes "
            "resources.limits.memory, your scheduler's memory request) or stop what fills it.",
        )
    return None


def _errno_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """An OSError with an errno that says what is wrong with the file it names."""
    probe = facts.torch
    number = probe.error_errno
    if number is None and (m := _ERRNO.search(text)):
        number = int(m.group(1))
    if number not in (errno.EACCES, errno.ENOSPC, errno.EROFS, errno.EPERM):
        return None
    path = probe.error_filename or next(iter(_PATH.findall(probe.error or "")), None)
    if not path:
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    var = next((v for v in WRITE_VARS if facts.env_vars.get(v) and _under(path, facts.env_vars[v])), None)
    name = errno.errorcode.get(number, str(number))
    what = {
        errno.ENOSPC: f"the file system holding {folder} is full",
        errno.EROFS: f"{folder} is on a read-only file system",
        errno.EACCES: f"this user may not access {path}",
        errno.EPERM: f"the operation on {path} is not permitted",
    }[number]
    place = home(path, facts)
    cause = f"{what} ({name})" + (f"; it lives in {place}" if place else "") + (f", set by {var}" if var else "")
    if var:
        fix = (
            f"Point {var} at a writable folder with free space: `mkdir -p $HOME/{var.lower()} && export "
            f"{var}=$HOME/{var.lower()}`"
        )
    elif number == errno.ENOSPC:
        fix = f"Free space on that file system (`df -h {shlex.quote(folder)}` shows how full it is)."
    elif number == errno.EACCES and place and "torch's own folder" in place:
        target = shlex.quote(facts.torch_dist_location or folder)
        fix = f"Make torch's files readable for every user: `chmod -R a+rX {target}`"
    else:
        fix = f"Make {folder} writable for this user, or run from a folder that is."
    return Cause(cause, fix, file=path)


def _requirement_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """A module the error names that torch requires, installed in a version torch's metadata excludes (or not at
    all): the unmet requirement is the cause, and where its copy lives says how to fix it."""
    probe = facts.torch
    m = _MODULE.search(text)
    module = probe.error_module or (m.group(1) or m.group(2) if m else None)
    if not module:
        return None
    top = str(canonicalize_name(module.split(".")[0]))
    if top == "torch":
        return None
    unmet = next(
        (
            u
            for u in facts.unmet_requirements
            if str(canonicalize_name(u.requirement_name)) == top and u.dist == "torch"
        ),
        None,
    )
    if unmet is None:
        return None
    have = f"{unmet.installed} is installed" if unmet.installed else "it is not installed"
    others = sorted(
        {
            u.dist
            for u in facts.unmet_requirements
            if u.dist != "torch" and str(canonicalize_name(u.requirement_name)) == top
        }
    )
    if others:
        have += f" (which {', '.join(others[:3])}{' and others' if len(others) > 3 else ''} reject too)"
    copy = next((p for p in _PATH.findall(text) if f"/{module.split('.')[0]}" in p), None)
    place = home(copy, facts) if copy else None
    cause = f"torch {unmet.version} requires {unmet.requirement}, but {have}"
    if place and ("PYTHONPATH" in place or "user site" in place):
        cause += f" (the copy Python finds is {copy}, in {place})"
        return Cause(
            cause,
            f"Move {copy} out of {place}, or upgrade it there: "
            f'{pip(facts)} install --target <that folder> --upgrade "{unmet.requirement}"',
            file=copy,
            requirement=unmet,
        )
    return Cause(cause, f'{pip(facts)} install "{unmet.requirement}"', file=copy, requirement=unmet)


_TOO_OLD = re.compile(r"(/[^\s:]+): version [`']([\w.]+)' not found \(required by (/[^\s)]+)\)")
# conda packages that ship the runtime libraries torch's wheels need newer versions of
CONDA_PACKAGES = {"libstdc++": "libstdcxx-ng", "libgcc_s": "libgcc-ng", "libgomp": "libgomp"}


def _too_old_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """`lib: version X not found (required by torch's library)`: the copy the loader found is older than the one
    torch was built against; where it lives (a conda environment, the system) says how to get a newer one."""
    m = _TOO_OLD.search(text)
    if m is None:
        return None
    provider, version, needer = m.groups()
    name = os.path.basename(provider).split(".so")[0]
    place = home(provider, facts)
    cause = f"{provider} is older than torch needs: it lacks {version} (required by {needer})"
    conda = facts.env_vars.get("CONDA_PREFIX")
    if place and conda and place.startswith("the conda environment"):
        package = CONDA_PACKAGES.get(name)
        fix = (
            f"Update it in that environment: `conda install -p {shlex.quote(conda)} -c conda-forge {package}`"
            if package
            else f"Update the conda package that provides {name} in {conda}."
        )
        return Cause(cause + f"; it comes from {place}", fix, file=provider)
    return Cause(
        cause + (f"; it comes from {place}" if place else "; it is the system's"),
        f"Give torch a newer {name}: inside a conda environment `conda install -c conda-forge "
        f"{CONDA_PACKAGES.get(name, name)}`, or use a torch release built for this system's {name}.",
        file=provider,
    )


def _foreign_module_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """A Python module the error names that comes from a PYTHONPATH folder, the working directory or the user
    site (not the environment): that copy is not the one torch needs."""
    for path in _PATH.findall(text):
        if not path.endswith((".py", "__init__.py")):
            continue
        place = home(path, facts)
        if not place or not any(word in place for word in ("PYTHONPATH", "working directory", "user site")):
            continue
        module = os.path.basename(os.path.dirname(path) if path.endswith("__init__.py") else path).removesuffix(".py")
        spec = facts.torch_dist_requirements.get(str(canonicalize_name(module)))
        need = f" (torch requires {canonicalize_name(module)}{spec})" if spec else ""
        cause = (
            f"Python finds {module} at {path}, in {place}, ahead of the installed one, and it is not what torch "
            f"needs{need}"
        )
        if "PYTHONPATH" in place:
            folder = place.rsplit(" ", 1)[1]
            rest = _without(facts.env_vars.get("PYTHONPATH", ""), folder, os.pathsep)
            fix = f"Take {folder} off PYTHONPATH (or remove {path} from it): " + (
                f"`export PYTHONPATH={shlex.quote(rest)}`" if rest else "`unset PYTHONPATH`"
            )
        elif "user site" in place:
            fix = f"Skip the user site: `export PYTHONNOUSERSITE=1`, or remove {path} from it."
        else:
            cache = os.path.join(os.path.dirname(path), "__pycache__")
            fix = f"Rename {path} (it is yours, not the library torch imports) and delete {cache}."
        return Cause(cause, fix, file=path)
    return None


def _user_site_cause(facts: EnvFacts) -> Optional[Cause]:
    """torch imported from the user site (searched before the environment's site-packages)."""
    probe = facts.torch
    if not (probe.torch_file and probe.user_site and _under(probe.torch_file, probe.user_site)):
        return None
    others = [c for c in probe.torch_copies if not _under(c, probe.user_site)]
    if not others:
        return None  # the only torch there is: the failure's own evidence decides
    version = probe.torch_copy_versions.get(others[0])
    hidden = f", ahead of the environment's own torch{' ' + version if version else ''} in {others[0]}"
    cause = (
        f"torch comes from the user site {probe.user_site}, which Python searches before the environment's "
        f"site-packages{hidden}; that copy is the one failing"
    )
    user_copy = os.path.dirname(probe.torch_file)
    fix = (
        f"Skip the user site (this shell; put it in ~/.bashrc to keep it): `export PYTHONNOUSERSITE=1`; "
        f"or remove that copy: `rm -rf {shlex.quote(user_copy)} {shlex.quote(probe.user_site)}/torch-*.dist-info`"
    )
    return Cause(cause, fix, file=user_copy)


def _install_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """pip lists torch but its files are not there: an editable install whose source folder is gone, or a
    half-removed install."""
    if facts.torch_dist_version is None or not facts.torch_dist_files_missing:
        return None
    version = facts.torch_dist_version
    release = ".".join(re.findall(r"\d+", base_version(version))[:3])
    pin_facts = facts
    if facts.torch_dist_editable:
        cause = (
            f"torch {version} is an editable install whose source folder {facts.torch_dist_editable} is gone "
            f"(pip still lists it)"
        )
        fix = (
            f"Restore that checkout, or replace the editable install with a release: "
            f"{pip(facts)} uninstall -y torch && "
            + reinstall(pin_facts)
            .replace(f"torch=={base_version(version)}", f"torch=={release}")
            .replace("--force-reinstall ", "")
        )
        return Cause(cause, fix, file=facts.torch_dist_editable)
    return Cause(f"torch {version} is listed by pip, but its files are gone", f"Reinstall it: {reinstall(facts)}")


def _installed_file_cause(facts: EnvFacts, text: str) -> Optional[Cause]:
    """A file inside torch's own folder that the loader rejects, or a library there that is not a whole ELF file
    while the loader failed or the process crashed: the install itself is damaged."""
    location = facts.torch_dist_location
    loader = any(key in text for key, _ in LOADER_PROBLEMS) or facts.torch.exit_signal in (7, 11)
    if facts.torch_damaged_files and loader:
        damaged = facts.torch_damaged_files
        crashed = (
            f" (the process died of signal {facts.torch.exit_signal} loading it)" if facts.torch.exit_signal else ""
        )
        return Cause(
            f"torch's own install is damaged: {', '.join(damaged[:3])} "
            + ("is not a whole shared library" if len(damaged) == 1 else "are not whole shared libraries")
            + crashed,
            f"Reinstall it: {reinstall(facts)}",
            file=damaged[0],
        )
    for path in _PATH.findall(text):
        if location and _under(path, location) and any(key in text for key in ("file too short", "invalid ELF header")):
            return Cause(
                f"{path}, a file of torch's own install, is damaged", f"Reinstall it: {reinstall(facts)}", file=path
            )
    return None


def _culprit(facts: EnvFacts, text: str) -> Optional[PathEntry]:
    """The shadowing file that the error (or the hanging stack) points at, if one does."""
    for entry in facts.shadowing:
        if entry.path in text or f"'{entry.name}'" in text or f"module {entry.name} " in text:
            return entry
    return None


def _hang(facts: EnvFacts) -> Cause:
    probe = facts.torch
    ran = f" after {probe.seconds:.0f} s" if probe.seconds else ""
    where = ""
    if probe.hang_stack:
        where = f"; it was at {probe.hang_stack[0]}"
        if len(probe.hang_stack) > 1:
            where += " (called from " + ", ".join(probe.hang_stack[1:4]) + ")"
    culprit = _culprit(facts, " ".join(probe.hang_stack))
    if culprit:
        return Cause(
            f"it hung in {culprit.path}, which shadows `{culprit.name}`{where}{ran}",
            rename_fix(culprit),
            shadow=culprit.path,
        )
    return Cause(
        f"it was stopped{ran} without finishing{where}",
        'Look at the code at that line; to time every module: `python -X importtime -c "import torch" '
        "2>&1 | tail`. Usual culprits: torch on a slow network filesystem, a sitecustomize/usercustomize "
        "doing I/O, a stale lock in ~/.cache.",
    )


def _found_first(facts: EnvFacts) -> Optional[Cause]:
    probe, installed = facts.torch, facts.torch_dist_location
    if not (probe.torch_file and installed and not _under(probe.torch_file, installed)):
        return None
    found = os.path.dirname(probe.torch_file) if probe.torch_file.endswith("__init__.py") else probe.torch_file
    torch_entry = next((e for e in facts.shadowing if e.name == "torch"), None)
    fix = (
        rename_fix(torch_entry)
        if torch_entry
        else f"Rename or move {found} (or take its folder off PYTHONPATH), and delete the __pycache__ beside it."
    )
    via = f" ({torch_entry.via} is searched before site-packages)" if torch_entry else ""
    return Cause(
        f"Python found {found} first{via}, not the installed torch in {installed}",
        fix,
        shadow=torch_entry.path if torch_entry else None,
    )


def _known_messages(facts: EnvFacts, text: str) -> Optional[Cause]:
    """Causes that the error's wording names by itself."""
    probe = facts.torch
    if facts.torch_dist_version is None and ("No module named 'torch'" in text or probe.torch_file):
        cuda = best_wheel_cuda(major_minor(facts.nvidia.driver_cuda)) if has_nvidia(facts) else None
        fix = "Install it into this interpreter: " + pip_install(facts, cuda, force=False)
        if probe.torch_file:
            return Cause(
                f"torch is not installed, and Python found {probe.torch_file} instead",
                f"Move {probe.torch_file} out of the way, then: " + fix,
            )
        return Cause(f"torch is not installed for {facts.system.python_executable or 'this Python'}", fix)
    if "partially initialized module" in text or "circular import" in text:
        return Cause(
            "a circular import: a file named like a module torch imports (e.g. random.py, copy.py) shadows it",
            "Rename the file in your script's folder or on PYTHONPATH named like the module "
            "in the error, and delete the __pycache__ beside it.",
        )
    if m := re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file: No such file", text):
        lib = m.group(1)
        if not has_nvidia(facts) and (lib.startswith(("libcuda", "libnv", "libcu", "libnccl")) or facts.torch_cuda):
            return Cause(
                f"torch {facts.torch_version or ''} is a CUDA build and {lib} is missing, on a machine "
                f"without an NVIDIA driver".replace("  ", " "),
                f"Install the CPU build: {reinstall(facts)}",
            )
        return Cause(
            f"the shared library {lib} that this torch build links against is missing",
            f"Reinstall torch so pip brings its libraries (nvidia-* packages for CUDA builds) again: "
            f"{reinstall(facts)}",
        )
    if "undefined symbol" in text:
        return Cause(
            "undefined symbols: parts of two different torch/CUDA installs are mixed (pip over conda, a stale copy)",
            f"Run `{pip(facts)} uninstall torch` until it says it is not installed (and "
            f"`conda remove pytorch` in conda envs), then: {reinstall(facts)}",
        )
    if "numpy" in text.lower() and ("multiarray" in text or "NumPy 1.x" in text or "_ARRAY_API" in text):
        return Cause(
            "a NumPy ABI mismatch: a package compiled against NumPy 1.x meets NumPy 2.x",
            f'{pip(facts)} install "numpy<2" {torch_pin(facts)} (or upgrade the packages compiled against NumPy 1.x)',
            absorbs="numpy-problem",
        )
    return None


def diagnose(facts: EnvFacts) -> Cause:
    """The one cause of a failed or hung `import torch` that the evidence names, with its fix; when it names
    none, says so (and proposes no reinstall: nothing says the install is at fault)."""
    probe = facts.torch
    if probe.timed_out:
        return _hang(facts)
    text = failure_text(facts)
    culprit = _culprit(facts, text)
    steps = (  # what the failure itself names first: a library copy it loaded, then which torch it was
        lambda: _library_cause(facts, text),
        lambda: _user_site_cause(facts),
        lambda: _found_first(facts),
        lambda: (
            Cause(
                f"{culprit.path} shadows "
                + ("torch" if culprit.name == "torch" else f"the module `{culprit.name}` that torch imports")
                + f" ({culprit.via}, {culprit.origin_dir}, is searched before site-packages)",
                rename_fix(culprit),
                file=culprit.path,
                shadow=culprit.path,
            )
            if culprit
            else None
        ),
        lambda: _limit_cause(facts, text),
        lambda: _errno_cause(facts, text),
        lambda: _install_cause(facts, text),
        lambda: _requirement_cause(facts, text),
        lambda: _foreign_module_cause(facts, text),
        lambda: _too_old_cause(facts, text),
        lambda: _known_messages(facts, text),
        lambda: _installed_file_cause(facts, text),
    )
    for step in steps:
        cause = step()
        if cause is not None:
            return cause
    if facts.shadowing:
        names = ", ".join(e.path for e in facts.shadowing)
        return Cause(
            f"most likely {names}, shadowing modules that torch imports (see module-shadowing)",
            rename_fix(facts.shadowing[0]),
        )
    died = f" (the process died from signal {probe.exit_signal})" if probe.exit_signal else ""
    stack = f"; it was at {probe.crash_stack[0]}" if probe.crash_stack else ""
    return Cause(
        f"no known cause matched{died}{stack}: the error names no library path, limit, errno, module or "
        f"install folder torchdoctor can trace",
        f"See the whole traceback: `{shlex.quote(facts.system.python_executable or 'python')} -X "
        f'faulthandler -c "import torch"`; a reinstall is no answer until something points at the install.',
    )


def absorbed_by_import_failure(facts: EnvFacts, check: str) -> bool:
    """Whether torch-import-failure's cause is `check`'s finding (which is then not reported twice)."""
    return not facts.torch.ok and diagnose(facts).absorbs == check


def shadow_named_by_import_failure(facts: EnvFacts) -> Optional[str]:
    """The shadowing file or folder torch-import-failure names as its cause (module-shadowing leaves it out)."""
    return diagnose(facts).shadow if not facts.torch.ok else None


def explained_requirement(facts: EnvFacts) -> Optional[UnmetRequirement]:
    """The unmet requirement that torch-import-failure names as its cause (reported there, not twice)."""
    if facts.torch.ok:
        return None
    return diagnose(facts).requirement
