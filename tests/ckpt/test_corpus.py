"""The generated hostile corpus (every family and opcode route) and the benign corpus, end to end."""

from __future__ import annotations

import argparse
import enum
import json
import os
import subprocess
import sys
import warnings

import benign_corpus
import hostile_corpus
import pytest
import torch

from torchdoctor.ckpt.api import check_checkpoint


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hostile_corpus.build(str(d / "files"), str(d / "canaries")), str(d / "canaries")


def test_every_hostile_sample_is_unsafe_pickle_and_no_canary_appears(hostile):
    samples, canaries = hostile
    missed = [
        name
        for name, (path, _, _) in samples.items()
        if "unsafe-pickle" not in {f.name for f in check_checkpoint(path).findings}
    ]
    assert missed == []
    assert os.listdir(canaries) == []


def test_third_party_gadgets_are_named_by_their_own_unsafe_pickle_finding(hostile):
    """The finding names the library function itself (judged by what its source reaches), not a helper call."""
    samples, _ = hostile
    assert len({q for q in hostile_corpus.THIRD_PARTY.values() if not q.startswith("numpy.")}) >= 20
    unnamed = {}
    for name, qualname in hostile_corpus.THIRD_PARTY.items():
        found = [f for f in check_checkpoint(samples[name][0]).findings if f.name == "unsafe-pickle"]
        if not any(f.key == qualname and "reaches" in f.message for f in found):
            unnamed[name] = [f.message[:160] for f in found]
    assert unnamed == {}


def test_every_hostile_sample_really_runs_its_payload(hostile, tmp_path):
    """One subprocess loads the whole corpus as victims would; a sample whose payload does not run fails here."""
    samples, canaries = hostile
    spec = tmp_path / "samples.json"
    spec.write_text(json.dumps(samples))
    here = os.path.dirname(__file__)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", os.path.join(here, "hostile_corpus.py"), str(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=here,
    )
    ran = json.loads(out.stdout.strip().splitlines()[-1])
    assert [name for name, yes in ran.items() if not yes] == []
    assert len(ran) == len(samples) >= 35


@pytest.fixture(scope="module")
def benign(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return benign_corpus.build(str(tmp_path_factory.mktemp("benign")), libraries=False)


def test_benign_corpus_has_no_unsafe_findings_and_needs_code_exactly_where_torch_refuses(benign):
    import torch.distributed.tensor  # noqa: F401  (as a DTensor program does)

    wrong = []
    for name, path in benign.items():
        report = check_checkpoint(path)
        names = {f.name for f in report.findings}
        if "unsafe-pickle" in names or "checkpoint-unreadable" in names:
            wrong.append((name, sorted(names)))
        if report.infos[0].format not in ("zip", "legacy"):
            continue
        try:
            torch.load(path, weights_only=True)
            refused = False
        except Exception:
            refused = True
        if refused != ("needs-code-to-load" in names):
            wrong.append((name, f"torch refuses={refused}", sorted(names)))
    assert wrong == []


class Mode(enum.Enum):
    """A user enum: pickled by value, so loading calls `Mode(2)`."""

    FAST = 2


def test_a_called_user_callable_is_a_warning_that_names_the_call_and_is_never_allowlisted(tmp_path):
    path = tmp_path / "enum.pt"
    torch.save({"w": torch.ones(1), "mode": Mode.FAST, "args": argparse.Namespace(lr=0.1)}, path)
    report = check_checkpoint(path)
    needs = [f for f in report.findings if f.name == "needs-code-to-load"]
    assert not [f for f in report.findings if f.name == "unsafe-pickle"]
    assert any("calls third-party or user code: test_corpus.Mode(2)" in f.message for f in needs)
    fixes = " ".join(f.fix.title + f.fix.code for f in needs)
    assert "add_safe_globals([argparse.Namespace])" in fixes and "Mode]" not in fixes and "Mode," not in fixes


def test_needs_code_to_load_never_proposes_allowlisting_in_an_unsafe_file(tmp_path):
    import hostile_corpus as h

    evil = h.pickles(str(tmp_path / "canary"))["attr-pathlib-os-system"][0]
    clean = tmp_path / "clean.pt"
    torch.save({"args": argparse.Namespace(lr=0.1)}, clean)
    import ckpt_builders as b

    path = b.replace_data_pkl(str(clean), str(tmp_path / "evil.pt"), evil)
    report = check_checkpoint(path)
    assert "unsafe-pickle" in {f.name for f in report.findings}
    assert all("add_safe_globals" not in f.fix.title + f.fix.code for f in report.findings if f.fix)
