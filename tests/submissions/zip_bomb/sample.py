"""A correct submission, handed in as a zip with a member 200 times its packed size."""

ZIP = "bomb"
