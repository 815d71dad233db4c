"""The documentation builds: `mkdocs build --strict` (mkdocs.yml) turns every warning into an error, so a
broken link or anchor between the pages, a docstring mkdocstrings cannot parse, or an API page naming an
object that no longer exists fails this test. The build reads the sources statically and needs no
network."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs", reason="mkdocs is pinned in requirements-test.txt")


def test_docs_build_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-6000:]}"
    for page in ("index.html", "ARCHITECTURE/index.html", "BENCHMARKS/index.html", "changelog/index.html"):
        assert (site / page).is_file(), f"{page} was not built"
    api = site / "api"
    for module in ("gear_jax", "host", "torch", "sharded", "transitions", "casting", "checkpoint",
                   "rate_limiter", "pool"):
        assert (api / module / "index.html").is_file(), f"no API page for {module}"
    # The reference holds the rendered docstrings, not only the page headings.
    top = (api / "gear_jax" / "index.html").read_text()
    for name in ("TableSpec", "update_priorities", "sample_gather", "TableClosedError"):
        assert name in top, f"{name} is missing from the gear_jax API page"
    assert "RateLimiter" in (api / "rate_limiter" / "index.html").read_text()
