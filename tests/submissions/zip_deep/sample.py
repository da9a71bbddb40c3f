"""A correct submission, handed in as a zip with a path 40 folders deep."""

ZIP = "deep"
