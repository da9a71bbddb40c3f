"""A submission named ANN_LEE (and no lessons in it): it must not push the real ann_lee to
another id."""

NAME = "ANN_LEE"
BARE = True
FILES = {"notes.txt": "no lessons here"}
