"""A correct submission, handed in as a zip password-protected (an honest one too gets a note)."""

ZIP = "encrypted"
