"""online_softmax forks three children that hold 700 MB each (once), then returns the right answer.

It returns only once every child holds its memory or one of them is gone (killed for the memory:
the submission was over its limit), then 1 s later: on a loaded machine the children may take
longer than any fixed wait to touch 2.1 GB, and the answer must not come back before that."""

HOLES = {
    "attention.online_softmax": """
import os
import select
import time
if not os.path.exists("/tmp/forked"):
    open("/tmp/forked", "w").close()
    ready, told = os.pipe()
    children = []
    for _ in range(3):
        child = os.fork()
        if child == 0:
            try:
                block = bytearray(700 << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                os.write(told, b"1")
                time.sleep(60)
            finally:
                os._exit(0)
        children.append(child)
    holding, gone = 0, False
    while holding < 3 and not gone:
        if select.select([ready], [], [], 0.1)[0]:
            holding += len(os.read(ready, 3))
        gone = any(os.waitpid(child, os.WNOHANG)[0] for child in children)
    time.sleep(1)
@ANSWER@
""",
}
