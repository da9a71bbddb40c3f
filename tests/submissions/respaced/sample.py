"""A correct submission as an editor may leave it: a blank line added before every hole's code, trailing
spaces on its lines, and the blank lines after it deleted."""

RESPACE = True
