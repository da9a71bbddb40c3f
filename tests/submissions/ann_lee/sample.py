"""A correct submission named ann_lee."""

