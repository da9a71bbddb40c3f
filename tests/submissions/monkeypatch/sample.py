"""Outside the exercise regions, attention.py patches the check's comparison to always pass;
online_softmax returns zeros.
"""

HOLES = {
    "attention.online_softmax": """
return torch.zeros_like(x)
""",
}
IMPORTS = "from course.core.stubs import todo  # noqa: F401  (the lesson stubs call it)\n"
OUTSIDE = {
    "attention": [
        (IMPORTS,
         IMPORTS + "import course.topics.attention.check\n"
         'course.topics.attention.check.compare_floats = lambda *args, **kwargs: ""\n'),
    ],
}
