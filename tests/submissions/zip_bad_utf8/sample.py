"""A correct submission, handed in as a zip with a member name flagged UTF-8 that is not."""

ZIP = "bad_utf8"
