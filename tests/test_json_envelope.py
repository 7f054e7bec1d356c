"""Every command's `--format json` (and a watch session's report) is one envelope: torchdoctor/report.schema.json."""

import json
import struct
import textwrap
from importlib import resources

import pytest
from click.testing import CliRunner
from env_stub import collection_of

from torchdoctor.cli import cli
from torchdoctor.env import doctor
from torchdoctor.env.facts import EnvFacts

SCHEMA = json.loads(resources.files("torchdoctor").joinpath("report.schema.json").read_text(encoding="utf-8"))
_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "null": type(None)}


def violations(value, schema, path="$", root=SCHEMA):
    """What in `value` breaks `schema` (the subset of JSON Schema that report.schema.json uses)."""
    if "$ref" in schema:
        return violations(value, root["$defs"][schema["$ref"].rsplit("/", 1)[-1]], path, root)
    found = []
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(isinstance(value, _TYPES[k]) and not (k == "integer" and isinstance(value, bool)) for k in kinds):
            return [f"{path}: {value!r} is not of type {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        found.append(f"{path}: {value!r} < {schema['minimum']}")
    if isinstance(value, dict):
        found += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            found += [f"{path}: unexpected {key!r}" for key in value if key not in properties]
        for key, sub in properties.items():
            if key in value:
                found += violations(value[key], sub, f"{path}.{key}", root)
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{path}: more than {schema['maxItems']} items")
        for i, item in enumerate(value):
            found += violations(item, schema.get("items", {}), f"{path}[{i}]", root)
    if "if" in schema and not violations(value, schema["if"], path, root):
        found += violations(value, schema["then"], path, root)
    return found


LEAKY = textwrap.dedent("""
    def train(model, loader, optimizer, criterion):
        total = 0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss
        return total
""")


def safetensors_file(path):
    """A tiny safetensors checkpoint whose key keeps a DataParallel `module.` prefix."""
    header = json.dumps({"module.w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    return str(path)


_NoProbe = collection_of(EnvFacts)  # default facts (no torch found), nothing started


@pytest.fixture
def command_documents(tmp_path, monkeypatch):
    """scope -> the JSON document (and exit code) of each command run on a small input."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(doctor, "FactCollection", _NoProbe)
    (tmp_path / "train.py").write_text(LEAKY)
    runs = {
        "env": ["env", "--format", "json"],
        "checkpoint": ["check-ckpt", "--format", "json", "--fail-on", "warning", safetensors_file(tmp_path / "w.st")],
        "source": ["lint", "--format", "json", "train.py"],
        "checks": ["checks", "--format", "json", "--scope", "source"],
    }
    out = {}
    for scope, args in runs.items():
        result = CliRunner().invoke(cli, args)
        out[scope] = (json.loads(result.output), result.exit_code)
    return out


def test_every_command_prints_the_one_envelope(command_documents):
    for scope, (doc, code) in command_documents.items():
        assert violations(doc, SCHEMA) == [], scope
        assert doc["scope"] == scope and doc["exit_code"] == code
        counts = {s: sum(f["severity"] == s for f in doc["findings"]) for s in ("error", "warning", "info")}
        assert doc["counts"] == counts
    assert {scope: code for scope, (_, code) in command_documents.items()} == {
        "env": 1,
        "checkpoint": 1,
        "source": 1,
        "checks": 0,
    }  # the checkpoint's warning fails under --fail-on warning
    checks = command_documents["checks"][0]
    assert checks["subject"] == "source checks" and "missing-zero-grad" in {
        c["name"] for c in checks["facts"]["checks"]
    }


def test_a_watch_report_is_the_same_envelope():
    import torch

    import torchdoctor

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.watch(model, optimizer, report=False, on_finding="log") as session:
        for _ in range(3):
            model(torch.ones(4, 2)).sum().backward()  # no zero_grad: gradients pile up
            optimizer.step()
    doc = json.loads(json.dumps(session.report().to_dict()))
    assert violations(doc, SCHEMA) == []
    assert doc["scope"] == "runtime" and "missing-zero-grad" in {f["name"] for f in doc["findings"]}
    assert doc["exit_code"] == 1 and doc["subject"] == "Linear"


def test_the_validator_rejects_what_breaks_the_schema(command_documents):
    doc, _ = command_documents["source"]
    broken = {**doc, "exit_code": 3, "extra": 1, "counts": {"error": -1, "warning": 0}}
    del broken["subject"]
    broken["findings"] = [{**doc["findings"][0], "severity": "fatal", "count": True}]
    assert sorted(violations(broken, SCHEMA)) == sorted(
        [
            "$: missing 'subject'",
            "$: unexpected 'extra'",
            "$.exit_code: 3 is not one of [0, 1, 2]",
            "$.counts: missing 'info'",
            "$.counts.error: -1 < 0",
            "$.findings[0].severity: 'fatal' is not one of ['error', 'warning', 'info']",
            "$.findings[0].count: True is not of type integer",
        ]
    )
    listing, _ = command_documents["checks"]
    assert violations({**listing, "findings": doc["findings"]}, SCHEMA) == ["$.findings: more than 0 items"]
