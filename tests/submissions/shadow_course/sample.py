"""The submission carries a course/ whose run_cases passes everything; online_softmax returns zeros."""

HOLES = {
    "attention.online_softmax": """
return torch.zeros_like(x)
""",
}
FILES = {
    "course/__init__.py": "",
    "course/checks/__init__.py": ("def run_cases(exercise, cases):\n"
                                  "    raise SystemExit('every case passed')\n"),
}
