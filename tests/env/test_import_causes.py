"""torch-import-failure on broken setups built for real: each gets the cause its evidence names and a fix that,
pasted into a shell, makes `import torch` work (where the fix needs no network).

Every setup's probe starts at once (one process each, all failing early), so the lot costs about one torch import.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from env_fixtures import run_check
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from torchdoctor.env.doctor import FactCollection

TORCH_LIB = Path(__import__("importlib.util").util.find_spec("torch").origin).parent / "lib"
TORCH_VERSION = metadata.version("torch")
TORCH_BUILD = __import__("torch").__version__  # its version.py: a CUDA wheel from PyPI has "+cu130" only here
OURS = sysconfig.get_paths()["purelib"]
# torch's own requirement on typing-extensions, as its metadata states it (e.g. "typing-extensions>=4.10.0")
TE_REQUIREMENT = next(
    f"typing-extensions{r.specifier}"
    for r in map(Requirement, metadata.requires("torch") or [])
    if canonicalize_name(r.name) == "typing-extensions"
)  # this environment's site-packages: torch, and torchdoctor's dependencies


def _rpath_only(library: Path) -> bool:
    """Whether an ELF library names its folders by DT_RPATH without DT_RUNPATH: the loader then searches them
    before LD_LIBRARY_PATH (PyPI's CUDA wheels of torch; the CPU wheels use DT_RUNPATH)."""
    import struct

    with open(library, "rb") as f:  # the headers only: the library is hundreds of MB
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
            return False
        phoff, phentsize, phnum = struct.unpack_from("<Q", head, 32)[0], *struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        tags = set()
        for i in range(phnum):
            ptype, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if ptype == 2:  # PT_DYNAMIC
                f.seek(offset)
                dynamic = f.read(size)
                tags |= {struct.unpack_from("<q", dynamic, j)[0] for j in range(0, len(dynamic) - 15, 16)}
    return 15 in tags and 29 not in tags  # DT_RPATH, DT_RUNPATH


# a libgomp.so.1 planted on LD_LIBRARY_PATH is never loaded when torch's libraries search their own folder first
LD_LIBRARY_PATH_IGNORED = pytest.mark.skipif(
    _rpath_only(TORCH_LIB / "libtorch_cpu.so"), reason="this torch's DT_RPATH puts its own libgomp first"
)


def venv(root: Path, *, ours: bool = True) -> Path:
    """A bare venv (no pip); with `ours`, this environment's packages come after its own site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if ours:
        (site / "zz_ours.pth").write_text(f"import site; site.addsitedir({OURS!r})\n")
    return root


def python_prefix(root: Path) -> Path:
    """A Python installation prefix of its own (for PYTHONHOME): the standard library linked in, its own
    site-packages, and this environment's packages after it. Not a venv, so the user site is on."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lib = root / "lib" / stdlib.name
    (lib / "site-packages").mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    (lib / "site-packages" / "zz_ours.pth").write_text(f"import site; site.addsitedir({OURS!r})\n")
    return root


def site_of(root: Path) -> Path:
    return root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def dist_info(site: Path, name: str, version: str, requires=(), direct_url=None) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n\n")
    (info / "RECORD").write_text("")
    if direct_url:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def clean_env(**changes):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONUSERBASE", "PYTHONNOUSERSITE")
    }
    env.update(changes)
    return env


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    """Broken setups, each (python, environment, cwd), diagnosed concurrently: name -> (facts, python, env)."""
    root = tmp_path_factory.mktemp("setups")
    work = root / "work"
    work.mkdir()
    built = {}

    # a zero-byte libgomp.so.1 in a folder on LD_LIBRARY_PATH (with a harmless second folder)
    (root / "fakelib").mkdir()
    (root / "fakelib" / "libgomp.so.1").write_bytes(b"")
    (root / "other").mkdir()
    built["empty_lib"] = (sys.executable, clean_env(LD_LIBRARY_PATH=f"{root / 'fakelib'}:{root / 'other'}"))
    # a half-copied libgomp.so.1: the loader maps it and the process dies of SIGBUS
    (root / "trunc").mkdir()
    (root / "trunc" / "libgomp.so.1").write_bytes((TORCH_LIB / "libgomp.so.1").read_bytes()[:4096])
    built["truncated_lib"] = (sys.executable, clean_env(LD_LIBRARY_PATH=str(root / "trunc")))
    # the same half-copied library on LD_PRELOAD: the process dies before Python runs any code
    built["truncated_preload"] = (sys.executable, clean_env(LD_PRELOAD=str(root / "trunc" / "libgomp.so.1")))
    # a real shared library named libgomp.so.1 that defines none of OpenMP's symbols (where a C compiler exists)
    if shutil.which("gcc"):
        (root / "stub").mkdir()
        (root / "stub" / "s.c").write_text("int unrelated(void) { return 0; }\n")
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-Wl,-soname,libgomp.so.1",
                "-o",
                str(root / "stub" / "libgomp.so.1"),
                str(root / "stub" / "s.c"),
            ],
            check=True,
        )
        built["stub_lib"] = (sys.executable, clean_env(LD_LIBRARY_PATH=str(root / "stub")))
    # a CUDA build of torch in the user site, ahead of the environment's own CPU torch, on a machine without CUDA;
    # the environment is a prefix of its own (as a conda env or a system Python: in a venv the user site is off)
    prefix = python_prefix(root / "prefix")
    userbase = root / "userbase"
    user_site = userbase / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (user_site / "torch").mkdir(parents=True)
    (user_site / "torch" / "__init__.py").write_text("import ctypes\nctypes.CDLL('libcudnn.so.9')\n")
    (user_site / "torch" / "version.py").write_text("__version__ = '2.13.0+cu130'\ncuda = '13.0'\n")
    dist_info(user_site, "torch", "2.13.0+cu130")
    built["user_site"] = (
        os.path.realpath(sys.executable),
        clean_env(PYTHONHOME=str(prefix), PYTHONUSERBASE=str(userbase)),
    )
    # a working torch in the user site (the environment's own files, linked) ahead of the environment's: it imports
    okbase = root / "okbase"
    ok_site = okbase / user_site.relative_to(userbase)
    ok_site.mkdir(parents=True)
    (ok_site / "torch").symlink_to(TORCH_LIB.parent, target_is_directory=True)
    built["user_site_works"] = (
        os.path.realpath(sys.executable),
        clean_env(PYTHONHOME=str(prefix), PYTHONUSERBASE=str(okbase)),
    )
    # an editable install of torch whose source folder was deleted (pip still lists it)
    gone = root / "pytorch-checkout"
    editable = venv(root / "editvenv", ours=False)
    dist_info(
        site_of(editable),
        "torch",
        "2.13.0a0+git1234",
        direct_url={"url": gone.as_uri(), "dir_info": {"editable": True}},
    )
    (site_of(editable) / "__editable__.torch-2.13.0a0+git1234.pth").write_text(f"{gone}\n")
    built["deleted_editable"] = (str(editable / "bin" / "python"), clean_env())
    # torch's own install damaged: its libgomp.so.1 cut short (the rest of the package linked to the real one)
    damaged = venv(root / "damagedvenv")
    copy = site_of(damaged) / "torch"
    (copy / "lib").mkdir(parents=True)
    for entry in TORCH_LIB.parent.iterdir():
        if entry.name != "lib":
            (copy / entry.name).symlink_to(entry)
    for entry in TORCH_LIB.iterdir():
        if entry.name != "libgomp.so.1":
            (copy / "lib" / entry.name).symlink_to(entry)
    (copy / "lib" / "libgomp.so.1").write_bytes((TORCH_LIB / "libgomp.so.1").read_bytes()[:4096])
    dist_info(site_of(damaged), "torch", TORCH_VERSION)
    built["damaged_install"] = (str(damaged / "bin" / "python"), clean_env())
    # torch's own requirement unmet: typing_extensions 4.0.0 in the venv, ahead of the newer one
    old = venv(root / "oldreqvenv")
    (site_of(old) / "typing_extensions.py").write_text("# an old release, without what torch imports\n")
    dist_info(site_of(old), "typing_extensions", "4.0.0")
    built["old_requirement"] = (str(old / "bin" / "python"), clean_env())

    collections = {
        name: (FactCollection(probe_timeout=120, cwd=str(work), python=python, environ=env), python, env)
        for name, (python, env) in built.items()
    }
    return {name: (c.finish(), python, env) for name, (c, python, env) in collections.items()}


def finding(facts):
    [f] = run_check("torch-import-failure", facts)
    return f


def pasted(fix_title: str) -> str:
    """The command a fix asks to paste (its last `backquoted` part)."""
    return re.findall(r"`([^`]+)`", fix_title)[-1]


def imports_after(fix: str, python: str, env: dict, limit: str = "") -> subprocess.CompletedProcess:
    script = f"{limit}{fix}\n{python} -c 'import torch; torch.ones(2).sum()'\n"
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)


@LD_LIBRARY_PATH_IGNORED
def test_a_zero_byte_library_on_ld_library_path(setups, tmp_path):
    facts, python, env = setups["empty_lib"]
    f = finding(facts)
    fakelib = env["LD_LIBRARY_PATH"].split(":")[0]
    assert f"{fakelib}/libgomp.so.1: file too short" in f.message
    assert f"Cause: {fakelib}/libgomp.so.1 (from the LD_LIBRARY_PATH folder {fakelib}) is an empty file" in f.message
    fix = pasted(f.fix.title)
    assert fix == f"export LD_LIBRARY_PATH={env['LD_LIBRARY_PATH'].split(':')[1]}" and "reinstall" not in f.fix.title
    assert imports_after(fix, python, env).returncode == 0


@LD_LIBRARY_PATH_IGNORED
def test_a_truncated_library_that_crashes_the_import(setups):
    facts, python, env = setups["truncated_lib"]
    assert facts.torch.exit_signal == 7 and any("_load_global_deps" in frame for frame in facts.torch.crash_stack)
    f = finding(facts)
    assert f"{env['LD_LIBRARY_PATH']}/libgomp.so.1 (from the LD_LIBRARY_PATH folder" in f.message
    assert "is cut short" in f.message and "crashed (signal 7)" in f.message
    assert pasted(f.fix.title) == "unset LD_LIBRARY_PATH"
    assert imports_after("unset LD_LIBRARY_PATH", python, env).returncode == 0


@LD_LIBRARY_PATH_IGNORED
def test_a_library_without_the_symbols_torch_needs(setups):
    if "stub_lib" not in setups:
        pytest.skip("no C compiler to build the stand-in library")
    facts, python, env = setups["stub_lib"]
    f = finding(facts)
    assert "undefined symbol: omp_" in f.message
    assert (
        f"Cause: {env['LD_LIBRARY_PATH']}/libgomp.so.1 (from the LD_LIBRARY_PATH folder {env['LD_LIBRARY_PATH']}) "
        "lacks a symbol torch needs" in f.message
    )
    assert pasted(f.fix.title) == "unset LD_LIBRARY_PATH"


def test_a_truncated_library_on_ld_preload(setups):
    facts, python, env = setups["truncated_preload"]
    assert facts.torch.exit_signal == 7 and facts.torch.crash_stack == []  # no Python frame ran
    f = finding(facts)
    assert f"Cause: {env['LD_PRELOAD']} (from LD_PRELOAD) is cut short" in f.message
    assert pasted(f.fix.title) == "unset LD_PRELOAD"
    # the shell that the fix is pasted into was started before the variable was set (or it would crash too)
    shell_env = {k: v for k, v in env.items() if k != "LD_PRELOAD"}
    before = f"export LD_PRELOAD={env['LD_PRELOAD']}\n"
    assert imports_after("true", python, shell_env, limit=before).returncode != 0
    assert imports_after("unset LD_PRELOAD", python, shell_env, limit=before).returncode == 0


def test_torch_from_the_user_site_ahead_of_the_environments(setups):
    facts, python, env = setups["user_site"]
    f = finding(facts)
    user_site = facts.torch.user_site
    assert user_site.startswith(env["PYTHONUSERBASE"]) and facts.torch.torch_copies[0] == f"{user_site}/torch"
    assert (
        f"torch comes from the user site {user_site}, which Python searches before the environment's "
        f"site-packages, ahead of the environment's own torch {TORCH_BUILD} in {TORCH_LIB.parent}" in f.message
    )
    assert "libcudnn.so.9: cannot open shared object file" in f.message  # the error, quoted
    assert "cu1" not in f.fix.title and "--index-url" not in f.fix.title  # never a CUDA build without a driver
    assert imports_after("true", python, env).returncode != 0  # the setup is broken without the fix
    assert imports_after("export PYTHONNOUSERSITE=1", python, env).returncode == 0
    removal = pasted(f.fix.title)  # the permanent fix, last: it deletes the user-site copy
    assert removal.startswith("rm -rf ") and imports_after(removal, python, env).returncode == 0


def test_an_editable_install_whose_source_was_deleted(setups):
    facts, python, env = setups["deleted_editable"]
    f = finding(facts)
    assert "No module named 'torch'" in f.message
    assert (
        f"torch 2.13.0a0+git1234 is an editable install whose source folder "
        f"{facts.torch_dist_editable} is gone" in f.message
    )
    assert (
        f"{python} -m pip uninstall -y torch && {python} -m pip install torch==2.13.0 "
        "--index-url https://download.pytorch.org/whl/cpu" in f.fix.title
    )
    assert "cu1" not in f.fix.title


def test_a_damaged_install_is_the_one_case_for_a_reinstall(setups):
    facts, python, env = setups["damaged_install"]
    assert facts.torch.exit_signal == 7 and facts.torch_dist_location == str(site_of(Path(python).parents[1]) / "torch")
    f = finding(facts)
    assert (
        f"Cause: torch's own install is damaged: {facts.torch_dist_location}/lib/libgomp.so.1 is not a whole "
        "shared library (the process died of signal 7 loading it)" in f.message
    )
    assert (
        f.fix.title == f"Reinstall it: {python} -m pip install --force-reinstall "
        f"torch=={TORCH_VERSION.split('+')[0]} --index-url https://download.pytorch.org/whl/cpu"
    )


def test_an_unmet_requirement_of_torch_is_the_cause_and_reported_once(setups):
    facts, python, env = setups["old_requirement"]
    f = finding(facts)
    assert "from 'typing_extensions'" in f.message
    assert f"Cause: torch {TORCH_VERSION} requires {TE_REQUIREMENT}, but 4.0.0 is installed" in f.message
    assert f.fix.title == f'{python} -m pip install "{TE_REQUIREMENT}"'
    # the same root cause is not reported again by unmet-requirement with another command
    assert all("typing" not in u.message for u in run_check("unmet-requirement", facts))


def test_a_memory_limit_names_rlimit_as_and_the_ulimit_that_lifts_it(tmp_path):
    """`ulimit -v` (RLIMIT_AS) too small for torch's libraries: the whole `torchdoctor env` runs under it."""
    limited = (
        "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (500 << 20, resource.RLIM_INFINITY)); "
        "os.execv(sys.executable, [sys.executable, '-m', 'torchdoctor', 'env', '--format', 'json', "
        "'--select', 'torch-import-failure'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", limited],
        cwd=tmp_path,
        env=clean_env(NO_COLOR="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(result.stdout)
    [f] = report["findings"]
    assert "Cause: the process runs under RLIMIT_AS = 500 MiB (`ulimit -v`)" in f["message"]
    assert pasted(f["fix"]["title"]) == "ulimit -S -v unlimited" and result.returncode == 1
    fixed = imports_after("ulimit -S -v unlimited", sys.executable, clean_env(), limit="ulimit -S -v 512000\n")
    assert fixed.returncode == 0, fixed.stderr[-500:]


def test_a_working_torch_in_the_user_site_is_named_with_the_copy_it_hides(setups):
    facts, python, env = setups["user_site_works"]
    assert run_check("torch-import-failure", facts) == [] and facts.torch.ok
    [f] = run_check("torch-copy-hidden", facts)
    user_copy = f"{facts.torch.user_site}/torch"
    assert f.message.startswith(
        f"Python imports torch from {user_copy} ({TORCH_BUILD}), which hides {TORCH_LIB.parent}"
    )
    assert "`export PYTHONNOUSERSITE=1`" in f.fix.title
    where = f"{python} -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec(\"torch\").origin))'"
    after = subprocess.run(
        ["bash", "-c", f"export PYTHONNOUSERSITE=1\n{where}"], env=env, capture_output=True, text=True
    )
    assert after.stdout.strip() == str(TORCH_LIB.parent)  # the pasted fix: the environment's own torch again
    removal = pasted(f.fix.title)  # `rm -rf <the user-site link> ...`: removes the link, never what it points to
    assert removal.startswith(f"rm -rf {user_copy} ")
    subprocess.run(["bash", "-c", removal], env=env, check=True)
    assert TORCH_LIB.is_dir() and [] == run_check(
        "torch-copy-hidden", FactCollection(probe_timeout=120, python=python, environ=env, cwd=facts.cwd).finish()
    )
