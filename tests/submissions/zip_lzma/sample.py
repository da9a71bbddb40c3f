"""A correct submission, handed in as a zip compressed with LZMA, which grading does not unpack."""

ZIP = "lzma"
