"""online_softmax looks for the answer key: it imports solutions, then looks for solutions/ through
every process's /proc/<pid>/cwd and root.
"""

HOLES = {
    "attention.online_softmax": """
import os
try:
    from solutions.attention import online_softmax as answer
    return answer(x, block)
except ImportError as error:
    imported = str(error)
processes = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
found = []
for pid in processes:
    for where in ("cwd", "root"):
        try:
            found += [f"{pid}/{where}/{name}" for name in os.listdir(f"/proc/{pid}/{where}")
                      if name in ("solutions", "tests", "lessons")]
        except OSError:
            pass
raise ValueError(f"{imported}; found {found} among processes {processes}")
""",
}
