"""The MkDocs site builds with --strict, and a broken link or a stale generated check page fails the build."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="mkdocs is in the docs extra")
pytest.importorskip("material", reason="mkdocs-material is in the docs extra")
from mkdocs.commands.build import build  # noqa: E402
from mkdocs.config import load_config  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _in_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # as `mkdocs build` is run: the schema is included relative to the root
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")


def _build(site: Path, docs_dir: "Path | None" = None) -> None:
    overrides = {"site_dir": str(site)}
    if docs_dir is not None:
        overrides["docs_dir"] = str(docs_dir)
    build(load_config(str(ROOT / "mkdocs.yml"), **overrides))


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    _build(tmp_path / "site")
    site = tmp_path / "site"
    for page in (
        "env",
        "check-ckpt",
        "watch",
        "lint",
        "pytest",
        "pre-commit",
        "notebooks",
        "schema",
        "benchmarks",
        "writing-checks",
        "gpu",
        "torchrun",
    ):
        assert (site / page / "index.html").is_file(), page
    assert "TD301" in (site / "checks" / "missing-zero-grad" / "index.html").read_text(encoding="utf-8")
    home = (site / "index.html").read_text(encoding="utf-8")  # every check page is in the site's navigation
    from torchdoctor import registry

    for check in registry.all_checks():
        assert f'href="checks/{check.name}/"' in home, check.name
    schema = (site / "schema" / "index.html").read_text(encoding="utf-8")
    assert "draft/2020-12/schema" in schema and "--8&lt;--" not in schema  # the file itself, included
    assert not (site / "__init__.py").exists()


def test_the_install_step_says_where_torchdoctor_comes_from() -> None:
    """`pip install .` only works in a copy of the source: the home page says how to get one first."""
    for page in (ROOT / "docs" / "index.md", ROOT / "README.md"):
        text = page.read_text(encoding="utf-8")
        step = text[text.index("pip install torch==2.13.0 && pip install . ") - 600 :]
        assert "git clone" in step[:600] and "not published on PyPI" in step[:600], page.name


def test_a_broken_link_and_a_stale_check_page_fail_the_build(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("__pycache__"))
    with (docs / "index.md").open("a", encoding="utf-8") as fh:
        fh.write("\nSee [the old page](old-page.md).\n")
    page = docs / "checks" / "missing-zero-grad.md"
    page.write_text(page.read_text(encoding="utf-8").replace("accumulates", "adds"), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="mkdocs"), pytest.raises(Abort):
        _build(tmp_path / "site", docs)
    warnings = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "old-page.md" in warnings
    assert "out of date with the pitfall definitions" in warnings and "checks/missing-zero-grad.md" in warnings
