"""online_softmax looks for an answer in the sandbox: it calls the specification and the oracle, imports
the checks, reads every file of theirs on its path, and asks the grader to run the specification for it.
"""

HOLES = {
    "attention.online_softmax": """
import importlib
import os
import sys
from course.grading.child import ask_grader
answers, checks, files, served = [], [], [], []
ones = torch.ones(1, 2, 4)
calls = (("pyspec_ref", "dfs_times", ([-1, 0],)), ("pyspec_ref.trees", "dfs_times", ([-1, 0],)),
         ("pyspec_ref.trees", "tree_mask", ([-1, 0],)),
         ("course.oracle", "dense_tree_mask", (torch.tensor([[0, 1]]), torch.tensor([[1, 1]]))),
         ("course.oracle", "attention_with_lse", (ones, ones, ones)))
for name, attribute, args in calls:
    try:
        getattr(importlib.import_module(name), attribute)(*args)
        answers.append(f"{name}.{attribute}")
    except Exception:
        pass
for name in ("course.checks.diagnose", "course.topics.attention.check", "course.exercises", "solutions"):
    try:
        importlib.import_module(name)
        checks.append(name)
    except Exception:
        pass
for folder in sys.path:
    for root, _, names in os.walk(folder):
        if "pyspec_ref" in root or "oracle" in root or "checks" in root:
            for name in names:
                with open(os.path.join(root, name), errors="replace") as f:
                    text = f.read()
                if "def dfs_times(parents" in text or "def attention_with_lse(q" in text:
                    files.append(os.path.join(root, name))
for service in ("pyspec_ref.dfs_times", "pyspec_ref.trees.dfs_times", "course.oracle.dense_tree_mask",
                "course.oracle.attention_with_lse"):
    try:
        ask_grader(service, ([-1, 0],), {})
        served.append(service)
    except Exception as error:
        if "grading does not run" not in str(error):
            served.append(f"{service}: {error}")
raise ValueError(f"answers {answers} checks {checks} files {files} served {served}")
""",
}
