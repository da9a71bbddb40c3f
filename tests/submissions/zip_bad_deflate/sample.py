"""A correct submission, handed in as a zip whose deflate data is garbled."""

ZIP = "bad_deflate"
