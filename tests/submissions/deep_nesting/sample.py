"""online_softmax's hole nests 100000 unary minus signs, deeper than the parser can read."""

HOLES = {
    "attention.online_softmax": "return " + "-" * 100_000 + "x\n",
}
