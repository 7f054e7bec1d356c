"""Selection: names and codes per front door, did-you-mean usage errors, and shared settings skipping other doors."""

import textwrap

import pytest
from env_stub import collection_of

from torchdoctor import registry, selection
from torchdoctor.cli import main
from torchdoctor.env import doctor
from torchdoctor.env.facts import EnvFacts
from torchdoctor.selection import SelectionError, select_checks
from torchdoctor.settings import load_settings


def names(door, **options):
    return [c.name for c in select_checks(door, load_settings(**options))]


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path, monkeypatch):
    """Run from an empty folder (no project table), with env's fact collection stubbed out."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "FactCollection", collection_of(EnvFacts))


def test_selection_by_name_code_and_comma_lists():
    assert names(selection.ENV, select=["td111, cpu-only-build"]) == ["cpu-only-build", "shm-too-small"]
    all_env = names(selection.ENV, ignore=["TD111"])
    assert "shm-too-small" not in all_env and len(all_env) == len(registry.all_checks("env")) - 1
    with pytest.raises(SelectionError, match="unknown check 'nope'"):
        names(selection.ENV, select=["nope"])


def test_watch_runs_runtime_and_distributed_checks():
    watched = names(selection.WATCH)
    assert "missing-zero-grad" in watched and "ddp-param-desync" in watched and "cpu-only-build" not in watched


def usage_error(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["env", "--select", "missing-zero-grad"],
            "missing-zero-grad (TD301) is not checked by torchdoctor env, only by torchdoctor.watch() and torchdoctor "
            "lint",
        ),
        (
            ["lint", "--select", "cpu-only-build"],
            "cpu-only-build (TD102) is not checked by torchdoctor lint, only by torchdoctor env",
        ),
        (
            ["check-ckpt", "--ignore", "graph-retention-leak", "x.pt"],
            "graph-retention-leak (TD308) is not checked by torchdoctor check-ckpt",
        ),
        (
            ["lint", "--select", "missing-zero-grd"],
            "unknown check 'missing-zero-grd'; did you mean 'missing-zero-grad'?",
        ),
        (["env", "--ignore", "TD1111"], "unknown check 'TD1111'; did you mean TD111 (shm-too-small)?"),
        (["explain", "cpu-only-buld"], "unknown check 'cpu-only-buld'; did you mean 'cpu-only-build'?"),
    ],
)
def test_another_doors_check_or_an_unknown_name_is_a_usage_error(capsys, args, message):
    assert message in usage_error(capsys, *args)


def test_shared_settings_skip_other_doors_but_their_typos_are_errors(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent("""
        [tool.torchdoctor]
        select = ["shm-too-small", "missing-zero-grad"]
        ignore = ["wrapper-prefix"]
    """)
    )
    assert names(selection.ENV) == ["shm-too-small"]
    assert names(selection.LINT) == ["missing-zero-grad", "source-unreadable"]  # lint always reads files honestly
    assert "wrapper-prefix" not in names(selection.CHECKPOINT)
    # the environment replaces the table's select; a list that names none of a door's checks leaves it alone
    monkeypatch.setenv("TORCHDOCTOR_SELECT", "graph-retention-leak")
    assert names(selection.LINT) == ["graph-retention-leak", "source-unreadable"]
    assert names(selection.ENV) == ["shm-too-small"]
    # the caller's own select wins over both, and their ignores add up
    assert names(selection.LINT, select=["TD301", "TD308"], ignore=["graph-retention-leak"]) == [
        "missing-zero-grad",
        "source-unreadable",
    ]
    monkeypatch.setenv("TORCHDOCTOR_SELECT", "graph-retention-lek")
    message = usage_error(capsys, "env")
    assert "unknown check 'graph-retention-lek' in TORCHDOCTOR_SELECT; did you mean 'graph-retention-leak'?" in message
    monkeypatch.delenv("TORCHDOCTOR_SELECT")
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nignore = ["shm-too-smal"]\n')
    message = usage_error(capsys, "lint")
    assert f"unknown check 'shm-too-smal' in {tmp_path / 'pyproject.toml'} [tool.torchdoctor] ignore" in message


def test_watch_rejects_another_doors_check_and_reads_the_project(tmp_path):
    torch = pytest.importorskip("torch")
    import torchdoctor

    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=r"cpu-only-build \(TD102\) is not checked by torchdoctor.watch\(\)"):
        torchdoctor.watch(model, checks=["cpu-only-build"])
    with pytest.raises(ValueError, match="did you mean 'missing-zero-grad'"):
        torchdoctor.watch(model, ignore="missing-zero-grd")
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nignore = ["missing-zero-grad", "cpu-only-build"]\n')
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, optimizer, report=False, on_finding="log") as session:
        for _ in range(3):
            model(torch.ones(4, 2)).sum().backward()  # no zero_grad: missing-zero-grad would fire
            optimizer.step()
    assert "missing-zero-grad" not in session.facts["checks"] and session.findings == []
    with torchdoctor.watch(model, optimizer, checks="TD301", report=False, on_finding="log") as session:
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
    assert session.facts["checks"] == []  # the project's ignore still holds under the caller's select
