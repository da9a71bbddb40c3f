"""Opening a notebook in JupyterLab leaves it unmodified: its kernelspec is committed exactly as Lab
writes it for the course's kernel (ipykernel's), and the nbstripout filter strips what Lab adds
besides (outputs, execution counts, language_info), so `git pull` never meets a local change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ipykernel.kernelspec import get_kernel_dict

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_the_kernelspec_is_the_one_lab_writes(notebook):
    spec = get_kernel_dict()
    written = {"display_name": spec["display_name"], "language": spec["language"], "name": "python3"}
    assert json.loads(notebook.read_text())["metadata"]["kernelspec"] == written
