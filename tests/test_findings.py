"""Findings: structured fixes (also from the free text checks write), JSON round trips, and fold keys."""

import sys

import pytest

from torchdoctor.findings import Finding, Fix, Location, Severity, fold, merge_ranks

LOOP = "for x, y in loader:\n    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()"


@pytest.mark.parametrize(
    "text, title, code",
    [
        # the common shape: one lead-in line ending in ":", then the code
        ("Clear the gradients once per optimizer step:\n" + LOOP, "Clear the gradients once per optimizer step:", LOOP),
        (
            "Clear the gradients once per optimizer step, e.g.\n" + LOOP,
            "Clear the gradients once per optimizer step, e.g.",
            LOOP,
        ),
        # a lead-in over two lines
        (
            "Change parameters identically on every rank,\nor copy rank 0's values to all ranks:\n"
            "with torch.no_grad():\n    p.copy_(q)",
            "Change parameters identically on every rank, or copy rank 0's values to all ranks:",
            "with torch.no_grad():\n    p.copy_(q)",
        ),
        # code from the first line (a block header ending in ":" is code, not a lead-in)
        (
            "sd = torch.load('a.pt')\nfor k in ['fc.weight']:\n    sd.pop(k)",
            "",
            "sd = torch.load('a.pt')\nfor k in ['fc.weight']:\n    sd.pop(k)",
        ),
        ("images = images.to(device)", "", "images = images.to(device)"),
        # one line of prose stays whole, inline code and a colon inside it included
        (
            "Give the container more shared memory: `docker run --shm-size=8g ...` (or `--ipc=host`).",
            "Give the container more shared memory: `docker run --shm-size=8g ...` (or `--ipc=host`).",
            "",
        ),
        ("pip install numpy", "pip install numpy", ""),
        # prose after the code becomes a comment, so that the snippet pastes
        (
            "Clone views before saving:\ntorch.save(sd, path)\nor write a compact copy: torchdoctor check-ckpt F --fix "
            "c.pt",
            "Clone views before saving:",
            "torch.save(sd, path)\n# or write a compact copy: torchdoctor check-ckpt F --fix c.pt",
        ),
        # a statement over two lines is kept as it is
        (
            'Accept both spellings:\nparser.add_argument("--local_rank", type=int,\n    default=0)',
            "Accept both spellings:",
            'parser.add_argument("--local_rank", type=int,\n    default=0)',
        ),
    ],
)
def test_free_text_fixes_split_into_title_and_code(text, title, code):
    assert Fix.parse(text) == Fix(title, code)


def test_a_finding_takes_a_fix_or_free_text_and_no_fix_is_none():
    assert Finding("m", fix="Do this:\nx = 1").fix == Fix("Do this:", "x = 1")
    assert Finding("m", fix=Fix("Do this:", "x = 1")).fix == Fix("Do this:", "x = 1")
    assert Finding("m").fix is None and Finding("m", fix="").fix is None
    finding = Finding("m", fix="Do this:\nx = 1")
    finding.fix = "Now that"
    assert finding.fix == Fix("Now that")


def test_json_round_trip_and_the_older_string_form():
    f = Finding(
        "m",
        fix="Do this:\nx = 1",
        code="TD1",
        name="x",
        severity=Severity.WARNING,
        location=Location(file="a.py", line=3),
        key="a",
    )
    d = f.to_dict()
    assert d["fix"] == {"title": "Do this:", "code": "x = 1"} and d["key"] == "a"
    assert Finding.from_dict(d) == f
    old = {**d, "fix": "Do this:\nx = 1"}  # a cached lint result or another rank of an older version
    assert Finding.from_dict(old).fix == Fix("Do this:", "x = 1")
    assert Finding("m").to_dict()["fix"] is None
    assert Finding("m").to_dict()["key"] == f"{__name__}:{sys._getframe().f_lineno}"  # by default: where it was built


def _f(message, step=None, rank=None, key="", **loc):
    return Finding(
        message,
        code="TD9",
        name="x",
        severity=Severity.WARNING,
        key=key,
        location=Location(step=step, rank=rank, **loc),
    )


def test_fold_keys_ignore_numbers_steps_and_ranks_but_not_places_or_check_keys():
    assert _f("3 graphs alive", step=10).fold_key() == _f("4 graphs alive", step=20, rank=1).fold_key()
    assert _f("3 graphs alive", module="a").fold_key() != _f("3 graphs alive", module="b").fold_key()
    assert _f("graphs alive").fold_key() == _f("graphs kept").fold_key()  # the wording is not the identity
    assert _f("seed not set", key="seed").fold_key() != _f("seed not set", key="workers").fold_key()
    assert _f("record 3 lost", key="record 3").fold_key() != _f("record 4 lost", key="record 4").fold_key()
    [folded] = fold([_f("3 graphs alive", step=10), _f("5 graphs alive", step=20)])
    assert (folded.message, folded.location.step, folded.count) == ("3 graphs alive", 10, 2)


def test_ranks_whose_messages_differ_only_in_numbers_merge_into_one_finding():
    merged = merge_ranks(
        {
            0: [_f("leaks 3 graphs per step", step=3, module="m")],
            1: [_f("leaks 4 graphs per step", step=4, module="m"), _f("other", module="m", key="other")],
        }
    )
    assert sorted(f.message for f in merged) == ["[all 2 ranks] leaks 3 graphs per step", "[rank 1] other"]
    seen_twice = merge_ranks({0: [_f("a 1", module="m")], 1: [_f("a 2", module="m"), _f("a 3", module="m")]})
    assert [f.message for f in seen_twice] == ["[all 2 ranks] a 1"]  # rank 1 is named once
