"""A submission in a folder whose name is 254 characters long (and no lessons in it)."""

NAME = "x" * 254
BARE = True
FILES = {"notes.txt": "no lessons here"}
