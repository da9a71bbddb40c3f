"""online_softmax is right but first leaves detached helpers behind (setsid, a double fork) that would
write into the grader's folders later.
"""

HOLES = {
    "attention.online_softmax": """
import os
import subprocess
import sys
if not os.path.exists("/tmp/started"):
    open("/tmp/started", "w").close()
    subprocess.Popen(["sh", "-c", "sleep 4; echo late > @WATCHED@/late.txt"], start_new_session=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                      "course-grade-helper-7361"])
        os._exit(0)
@ANSWER@
""",
}
