"""A correct submission, handed in as a zip whose members use method 99 (AES encryption)."""

ZIP = "method99"
