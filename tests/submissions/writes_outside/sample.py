"""online_softmax is right but first tries to write into the grader's folders: with open, through a
shell, through libc (ctypes) and with sqlite3.
"""

HOLES = {
    "attention.online_softmax": """
import ctypes
import sqlite3
import subprocess
for path in ("@WATCHED@", "@ROOT@"):
    try:
        with open(f"{path}/escaped.txt", "w") as f:
            f.write("written by a submission")
    except OSError:
        pass
    subprocess.run(f"echo shell > {path}/shell.txt", shell=True, stderr=subprocess.DEVNULL)
    fd = ctypes.CDLL(None).open(f"{path}/ctypes.txt".encode(), 0o101, 0o644)
    if fd >= 0:
        ctypes.CDLL(None).write(fd, b"ctypes", 6)
    try:
        sqlite3.connect(f"{path}/db.sqlite").execute("create table t (x)")
    except sqlite3.Error:
        pass
@ANSWER@
""",
}
