"""pytest's setup for the whole repository (tests/conftest.py adds the tests' own).

The test order is shuffled (pytest-randomly, with the seed that `make test` prints): a test that
passes only after another one fails here. A notebook's cells are not independent tests, though:
each runs in the kernel the cells before it left. So the cells of every notebook go back to their
order, at the places the shuffle gave that notebook's cells.
"""

from __future__ import annotations

import re

CELL = re.compile(r"^(?P<notebook>.+\.ipynb)::Cell (?P<number>\d+)$")


def pytest_collection_modifyitems(items):
    places: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        found = CELL.match(item.nodeid)
        if found:
            places.setdefault(found["notebook"], []).append(index)
    for indices in places.values():
        cells = sorted((items[i] for i in indices), key=lambda item: int(CELL.match(item.nodeid)["number"]))
        for index, cell in zip(indices, cells, strict=True):
            items[index] = cell
