"""online_softmax forks three children that hold 700 MB each (once), then returns the right answer.

It returns only once every child holds its memory (or died trying), and 5 s after that: on a
loaded machine the children may take longer than any fixed wait to touch 2.1 GB, and the answer
must not come back before the submission is over its limit."""

HOLES = {
    "attention.online_softmax": """
import os
import time
if not os.path.exists("/tmp/forked"):
    open("/tmp/forked", "w").close()
    ready, told = os.pipe()
    for _ in range(3):
        if os.fork() == 0:
            try:
                block = bytearray(700 << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                os.write(told, b"1")
                time.sleep(60)
            finally:
                os._exit(0)
    os.close(told)
    holding = 0
    while holding < 3 and os.read(ready, 1):
        holding += 1
    time.sleep(5)
m = x.max(dim=-1, keepdim=True).values
e = torch.exp(x - m)
return e / e.sum(dim=-1, keepdim=True)
""",
}
