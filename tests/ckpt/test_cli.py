"""`torchdoctor check-ckpt`: report, JSON, exit codes, bad input, and no torch import without --model/--fix."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zipfile

import ckpt_builders as b
import pytest

from torchdoctor.cli import main


def run(capsys, *args):
    with pytest.raises(SystemExit) as exc:
        main(["check-ckpt", *args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_console_report_shows_structure_and_findings(capsys, files):
    code, out, err = run(capsys, files["training"])
    assert code == 0 and err == ""
    for text in (
        "training checkpoint",
        "epoch=7",
        "float32",
        "Tensors by location",
        "optimizer",
        "needs-code-to-load",
        "argparse.Namespace",
    ):
        assert text in out, text


def test_keys_and_paths_from_the_file_are_printed_verbatim_never_as_markup(capsys, tmp_path):
    """A key or a file name is shown as stored: rich markup or an emoji code in it is text, not formatting that
    could hide or fake what the report says."""
    import pickle

    folder = tmp_path / "[bold]runs"
    folder.mkdir()
    path = folder / "sd.pkl"
    path.write_bytes(pickle.dumps({"[bold]w[/bold]": 1.0, "emoji:smile:": 2, "[red]x": 3}, protocol=2))
    code, out, _ = run(capsys, str(path))
    assert code == 0
    assert f"· {path} (torchdoctor" in out and "\\[" not in out
    for key in ("[bold]w[/bold]=1.0", "emoji:smile:=2", "[red]x=3"):
        assert key in out, key


def test_json_document(capsys, files):
    code, out, _ = run(capsys, "--format", "json", files["dataparallel"], files["view"])
    doc = json.loads(out)
    assert doc["tool"] == "torchdoctor" and doc["scope"] == "checkpoint" and code == 0
    first, second = doc["facts"]["checkpoints"]
    assert first["format"] == "zip" and first["tensors"]["count"] == 9
    assert second["tensors"]["largest"][0]["key"] == "small"
    names = {f["name"] for f in doc["findings"]}
    assert names == {"wrapper-prefix", "storage-bloat"}
    assert {f["location"]["file"] for f in doc["findings"]} == {files["dataparallel"], files["view"]}


def test_exit_1_on_errors_and_fail_on(capsys, files, tmp_path, canary):
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b.dumps(b.reduce_payloads(canary)["os.system"]))
    assert run(capsys, str(evil))[0] == 1
    assert run(capsys, "--fail-on", "warning", files["dataparallel"])[0] == 1
    assert run(capsys, "--ignore", "wrapper-prefix", "--fail-on", "warning", files["dataparallel"])[0] == 0
    assert run(capsys, "--scan-values", files["nan"])[0] == 1


def _bad_inputs(tmp_path, files):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "text.pt").write_text("epoch=3\nlr=0.1\n")
    (tmp_path / "random.bin").write_bytes(random.Random(0).randbytes(4096))
    data = open(files["plain"], "rb").read()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    return {
        "missing": str(tmp_path / "nope.pt"),
        "directory": str(tmp_path),
        "empty": str(tmp_path / "empty.pt"),
        "text": str(tmp_path / "text.pt"),
        "random": str(tmp_path / "random.bin"),
        "truncated zip": str(tmp_path / "truncated.pt"),
    }


def test_a_missing_path_is_exit_2_and_one_line(capsys, tmp_path, files):
    for path in (str(tmp_path / "nope.pt"), str(tmp_path / "empty-folder")):
        (tmp_path / "empty-folder").mkdir(exist_ok=True)
        code, out, err = run(capsys, files["plain"], path)
        assert code == 2, path
        assert out == "" and err.count("\n") == 1 and err.startswith("torchdoctor: error: "), (path, err)


def test_every_unreadable_file_is_a_finding_and_hides_no_other(capsys, tmp_path, files, canary):
    """Each file that is not a readable checkpoint is one TD210 error; the other files are all still reported."""
    bad = _bad_inputs(tmp_path, files)
    del bad["missing"], bad["directory"]
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b.dumps(b.reduce_payloads(canary)["os.system"]))
    paths = [*bad.values(), str(evil), files["dataparallel"]]
    code, out, err = run(capsys, "--format", "json", *paths)
    doc = json.loads(out)
    assert code == 1 and err == ""
    assert [c["path"] for c in doc["facts"]["checkpoints"]] == paths
    unreadable = {f["location"]["file"]: f["message"] for f in doc["findings"] if f["code"] == "TD210"}
    assert sorted(unreadable) == sorted(bad.values())
    assert "truncated or corrupt zip archive" in unreadable[bad["truncated zip"]]
    found = {(f["name"], f["location"]["file"]) for f in doc["findings"]}
    assert {("unsafe-pickle", str(evil)), ("wrapper-prefix", files["dataparallel"])} <= found
    code, out, _ = run(capsys, bad["truncated zip"])  # alone, too: a finding (exit 1), never a clean report
    assert code == 1 and "TD210 checkpoint-unreadable" in out and "unreadable: truncated or corrupt zip" in out


def test_a_folder_is_searched_for_checkpoints(capsys, tmp_path, files):
    """check-ckpt DIR reads the checkpoint-named files under DIR (recursively, not hidden folders), sorted."""
    data = open(files["plain"], "rb").read()
    (tmp_path / "run" / "epoch1").mkdir(parents=True)
    (tmp_path / "run" / ".git").mkdir()
    (tmp_path / "run" / "epoch1" / "model.ckpt").write_bytes(data)
    (tmp_path / "run" / "last.pth.tar").write_bytes(data[: len(data) // 2])
    (tmp_path / "run" / "weights.safetensors").write_bytes(open(files["safetensors"], "rb").read())
    (tmp_path / "run" / ".git" / "object.pt").write_bytes(b"not read")
    (tmp_path / "run" / "notes.txt").write_text("not a checkpoint")
    code, out, _ = run(capsys, "--format", "json", str(tmp_path / "run"))
    doc = json.loads(out)
    read = [c["path"] for c in doc["facts"]["checkpoints"]]
    assert read == [str(tmp_path / "run" / p) for p in ("epoch1/model.ckpt", "last.pth.tar", "weights.safetensors")]
    assert code == 1 and [f["location"]["file"] for f in doc["findings"] if f["code"] == "TD210"] == [read[1]]


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_or_a_broken_link_is_reported_not_read(capsys, tmp_path, files):
    """Reading a named pipe would block for ever; a broken link has nothing to read: both are findings."""
    import os

    os.mkfifo(tmp_path / "pipe.pt")
    os.symlink(tmp_path / "gone.pt", tmp_path / "link.pt")
    code, out, _ = run(capsys, "--format", "json", str(tmp_path), files["plain"])
    doc = json.loads(out)
    problems = {f["location"]["file"]: f["message"] for f in doc["findings"] if f["code"] == "TD210"}
    assert code == 1 and len(doc["facts"]["checkpoints"]) == 3
    assert "not a regular file" in problems[str(tmp_path / "pipe.pt")]
    assert "broken symbolic link" in problems[str(tmp_path / "link.pt")]


def test_quiet_prints_findings_without_structure(capsys, files, tmp_path):
    data = open(files["plain"], "rb").read()
    (tmp_path / "cut.pt").write_bytes(data[:100])
    code, out, _ = run(capsys, "--quiet", files["plain"], files["dataparallel"], str(tmp_path / "cut.pt"))
    assert code == 1 and "Checkpoint" not in out and "Largest tensors" not in out
    assert f"where: {tmp_path / 'cut.pt'}" in out and f"where: {files['dataparallel']}" in out
    assert "3 checkpoints" in out


def test_usage_errors(capsys, files, tmp_path):
    assert run(capsys, "--fix", str(tmp_path / "o.pt"), files["plain"], files["legacy"])[0] == 2
    code, _, err = run(capsys, "--model", "no_colon_here", files["plain"])
    assert code == 2 and "FILE.py:FACTORY" in err


def test_check_ckpt_does_not_import_torch(files, tmp_path):
    """A real process: reading, checks and scanning values never import torch (it costs seconds)."""
    script = (
        "import sys\n"
        "from torchdoctor.cli import main\n"
        "try:\n"
        "    main(['check-ckpt', '--scan-values', '--format', 'json', *sys.argv[1:]])\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', code, file=sys.stderr)\n"
    )
    paths = [files[n] for n in ("training", "whole-module", "legacy", "torchscript", "safetensors", "nan")]
    proc = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == "NO-TORCH 1", proc.stderr
    assert len(json.loads(proc.stdout)["facts"]["checkpoints"]) == len(paths)


def test_zip_with_crc_damage_still_reads(files, tmp_path):
    """torch ignores CRCs; a scanner that crashes on them is bypassed (CVE-2025-10156)."""
    data = bytearray(open(files["plain"], "rb").read())
    name = next(n for n in zipfile.ZipFile(files["plain"]).namelist() if n.endswith("data.pkl")).encode()
    central = data.index(b"PK\x01\x02")
    while data[central + 46 : central + 46 + len(name)] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    data[central + 16] ^= 0xFF  # CRC-32 in the central directory
    damaged = tmp_path / "crc.pt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(damaged).read(name.decode())
    from torchdoctor.ckpt import read_checkpoint

    assert len(read_checkpoint(str(damaged)).tensors) == 9


def test_an_internal_error_is_exit_2_whatever_fail_on_says(capsys, monkeypatch, files):
    """A check that crashed, or a file the reader crashed on, left something unchecked: never a result that
    passes; the other files are still reported."""
    import torchdoctor.ckpt as ckpt

    real = ckpt.read_checkpoint

    def crash_on_legacy(path, limits=None):
        if path == files["legacy"]:
            raise ZeroDivisionError("a reader bug")
        return real(path, limits)

    monkeypatch.setattr(ckpt, "read_checkpoint", crash_on_legacy)
    code, out, _ = run(capsys, "--fail-on", "never", "--format", "json", files["legacy"], files["dataparallel"])
    doc = json.loads(out)
    assert code == 2 == doc["exit_code"]
    assert [c["path"] for c in doc["facts"]["checkpoints"]] == [files["legacy"], files["dataparallel"]]
    [failed] = [f for f in doc["findings"] if "failed internally" in f["message"]]
    assert failed["location"]["file"] == files["legacy"] and "ZeroDivisionError: a reader bug" in failed["message"]
    assert "wrapper-prefix" in {f["name"] for f in doc["findings"]}
    code, out, _ = run(capsys, "--fail-on", "never", files["legacy"])
    assert code == 2 and "Exit 2: a check failed internally" in out
