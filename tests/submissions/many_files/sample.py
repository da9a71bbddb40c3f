"""online_softmax is right but writes many files of 300 kB (in its folder and in /tmp)."""

HOLES = {
    "attention.online_softmax": """
for folder in (".", "/tmp"):
    for i in range(10):
        try:
            with open(f"{folder}/junk{i}.bin", "wb") as f:
                f.write(b"x" * 300_000)
        except OSError:
            break
@ANSWER@
""",
}
