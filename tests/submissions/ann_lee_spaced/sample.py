"""A correct submission named `ann lee`: made file-safe, its name is also ann_lee's."""

NAME = 'ann lee'
