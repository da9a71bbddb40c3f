"""A correct submission whose lessons lie 1100 folders deep (the search stops at 32)."""

DEPTH = 1100
