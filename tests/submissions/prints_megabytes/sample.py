"""online_softmax is right but prints 3 MB first."""

HOLES = {
    "attention.online_softmax": """
print("x" * 3_000_000)
@ANSWER@
""",
}
